"""A self-forming fleet of real ``shoal agent`` processes, for the soak (``python -m bench soak``).

Three agents hold the stages of the plan the fleet document asks for, a fourth stands by with one stage
compiled, a fifth is a spare member that gives no memory, and a head (no memory either) serves the chat
endpoint and the OpenAI API. The first agent started is the coordinator (the longest-running member) and every
other one's seed; an agent started again later is seeded by the head, which chaos never touches.

On loopback by default; given a :class:`NetLab`, each agent runs in its own host of the lab (``LAB_HOSTS``)
and a host can be cut off the network. The process driving a lab fleet must itself run inside the lab (the
head's host, ``tests/support/soak_lab.py``): it asks the agents' status at their lab addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_agent
from tests.integration.netlab import NetLab

STAGE_NODES = ("pc1", "pc2", "pc3")
STANDBY = "pc4"
SPARE = "pc5"
HEAD = "head"
LAB_HOSTS = {name: host for host, name in enumerate((*STAGE_NODES, STANDBY, SPARE, HEAD), start=1)}
"""Each agent's host in a lab: the head's is where the soak's clients run (its chat and API on its loopback)."""
AGENT_FLAGS = ("--threads", "1", "--no-mdns", "--no-verify", "--lost-after", "4", "--speed", "10")
"""Every agent's: one speed for all (measured on shared cores the figures are noise, and a late agent measured
faster by chance would take a stage over instead of standing by); loopback carries no multicast."""
HEAD_FLAGS = ("--offer-mb", "0", "--chat", "127.0.0.1:0", "--http", "127.0.0.1:0", "--chat-keep", "0")
"""The head: no stage, chats and the OpenAI API; no session kept between turns, so that every session a
stage holds belongs to an answer in flight (the soak counts them back to zero)."""


@dataclass
class Member:
    """One agent of the soak fleet: its name, the flags it is started with, and its process while it runs."""

    name: str
    flags: tuple[str, ...]
    agent: LocalAgent | None = None
    address: tuple[str, int] | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        running = self.agent is not None and self.agent.process.poll() is None
        return self.agent.process.pid if running and self.agent is not None else None


class SoakFleet:
    """The soak's agents by name: start them, form the ring from a signed fleet document, ask their status,
    and the faults the chaos driver injects (signals, a restart, a revocation)."""

    def __init__(self, root: Path, cache_dir: Path, export: Path, lab: NetLab | None = None) -> None:
        self.root, self.cache_dir, self.export, self.lab = root, cache_dir, export, lab
        self.fleet_dir = root / "fleet"
        init_fleet(self.fleet_dir, "soak")
        self.admin = issue_node(self.fleet_dir, "admin")
        self.chat_file = root / "head-chat.json"
        self.members: dict[str, Member] = {}
        self._identities: dict[str, NodeIdentity] = {}

    def identity(self, name: str) -> NodeIdentity:
        if name not in self._identities:
            ips = [self.lab.ip(LAB_HOSTS[name])] if self.lab is not None and name in LAB_HOSTS else []
            self._identities[name] = issue_node(self.fleet_dir, name, ips=ips)
        return self._identities[name]

    def start(self, name: str, *flags: str, seed: str | None = None) -> Member:
        """Start (or start again) the agent ``name``; returns once it listens. ``seed``: the member it dials."""
        member = self.members.setdefault(name, Member(name, flags))
        peer = self.members[seed].address if seed is not None else None
        host = "127.0.0.1" if self.lab is None else self.lab.ip(LAB_HOSTS[name])
        member.agent = launch_agent(
            None,
            None,
            self.identity(name).cert.parent,
            self.cache_dir,
            extra_args=[
                *AGENT_FLAGS,
                *member.flags,
                *(["--peer", f"{peer[0]}:{peer[1]}"] if peer else []),
            ],
            # the same port again on a restart: the others' links and plans name it
            listen=f"{host}:{member.address[1] if member.address else 0}",
            log_path=self.root / f"{name}-{member.starts}.log",
            timeout=120,
            wrapper=None if self.lab is None else self.lab.command(LAB_HOSTS[name], []),
        )
        member.address = member.agent.address
        member.starts += 1
        return member

    def form(self, timeout: float = 600.0) -> str:
        """Start the three stage agents and the head, name the export as the fleet's model, and wait for one plan
        whose ring is ready; then the standby (its stage compiled) and the spare. Returns the plan hash."""
        self.start(STAGE_NODES[0])
        for name in STAGE_NODES[1:]:
            self.start(name, seed=STAGE_NODES[0])
        self.start(HEAD, *HEAD_FLAGS, "--chat-file", str(self.chat_file), seed=STAGE_NODES[0])
        asyncio.run(self._serve_export())
        self.wait(lambda: asyncio.run(self.agreed()), timeout, "one plan, every stage ready")
        self.start(STANDBY, seed=HEAD)
        self.wait(lambda: asyncio.run(self.standing_by()), timeout, f"{STANDBY} standing by, its stage compiled")
        self.start(SPARE, "--offer-mb", "0", seed=HEAD)
        return str(self.wait(lambda: asyncio.run(self.agreed()), timeout, "one plan with the spare"))

    async def _serve_export(self) -> None:
        from discovery import control
        from discovery.admin import edit_fleet_document, push_document
        from discovery.fleet_document import ModelSource, serving

        model = ModelSource(export_dir=str(self.export.resolve()))
        edit_fleet_document(self.fleet_dir, lambda doc, now: serving(doc, model, now))
        signed = (self.fleet_dir / "fleet-document.json").read_bytes()
        await push_document(self.address(STAGE_NODES[0]), self.admin, control.FleetDocumentOffer(signed))

    def address(self, name: str) -> tuple[str, int]:
        address = self.members[name].address
        assert address is not None, f"{name} never started"
        return address

    def running(self) -> list[Member]:
        return [m for m in self.members.values() if m.pid is not None]

    async def status(self, name: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """``shoal status --json`` of ``name``, or None if it does not answer within ``timeout``."""
        from agent.cli.status_link import fetch_status

        try:
            return dict(await asyncio.wait_for(fetch_status(self.address(name), self.admin), timeout))
        except (OSError, TimeoutError, Exception):  # a stopped or restarting agent: no status, not a failure
            return None

    async def statuses(self) -> dict[str, dict[str, Any] | None]:
        names = [m.name for m in self.running()]
        found = await asyncio.gather(*(self.status(n) for n in names))
        return dict(zip(names, found, strict=True))

    async def agreed(self) -> str | None:
        """The plan hash every running agent follows, once each says its ring is ready; else None."""
        plans = [(s or {}).get("plan") or {} for s in (await self.statuses()).values()]
        hashes = {p.get("hash") for p in plans}
        if len(hashes) != 1 or None in hashes or not all(p.get("ready") for p in plans):
            return None
        return str(hashes.pop())

    async def plan(self) -> dict[str, Any]:
        status = await self.status(HEAD)
        return dict((status or {}).get("plan") or {})

    async def standing_by(self) -> str | None:
        """The stage agent that some running member stands by for (its stage compiled), if any."""
        for stage in (await self.plan()).get("stages", []):
            if any(b.get("state") == "standby" for b in stage.get("standbys", [])):
                return str(stage["name"])
        return None

    async def stage_holders(self) -> list[str]:
        return [str(s["name"]) for s in (await self.plan()).get("stages", []) if s.get("name")]

    def kill(self, name: str) -> None:
        """``kill -9``: no goodbye to the peers."""
        member = self.members[name]
        if member.agent is not None and member.pid is not None:
            member.agent.process.send_signal(signal.SIGKILL)
            member.agent.process.wait(10)

    def pause(self, name: str, paused: bool) -> None:
        pid = self.members[name].pid
        if pid is not None:
            os.kill(pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def cut(self, name: str, off: bool) -> None:
        """Pull ``name``'s cable (``off``) or plug it back: its host's bridge port goes down or up; its peers get
        no FIN and no RST, and notice only through keepalive and ``TCP_USER_TIMEOUT``."""
        if self.lab is None:
            raise RuntimeError("cutting a host off the network needs the lab (python -m bench soak --lab)")
        (self.lab.cut if off else self.lab.restore)(LAB_HOSTS[name])

    def stop(self, name: str) -> None:
        member = self.members[name]
        if member.agent is not None:
            member.agent.stop(timeout=15)

    async def revoke(self, name: str) -> None:
        """Revoke ``name``'s certificate and push the signed revocation list to the head, which gossips it."""
        from discovery.admin import push_document, revoke

        done = revoke(self.fleet_dir, name, drop_pins=True)
        for message in done.messages:
            await push_document(self.address(HEAD), self.admin, message)

    def log_tails(self, lines: int = 15) -> str:
        return "\n".join(
            f"--- {m.name}\n" + "\n".join(list(m.agent.log)[-lines:]) for m in self.members.values() if m.agent
        )

    def wait(self, check: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout:.0f} s: {what}\n{self.log_tails()}")
            time.sleep(0.5)
        return found

    def stop_all(self) -> None:
        """SIGTERM to every agent at once (each says goodbye to its peers), then each waited for or killed."""
        for member in self.members.values():
            if member.pid is not None and member.agent is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.pause(member.name, False)  # a stopped process would not hear SIGTERM
                    member.agent.process.terminate()
        for member in self.members.values():
            if member.agent is not None:
                member.agent.stop(timeout=10)
