"""Agents as real processes on loopback, for the ring tests: a fleet, identities, start/stop."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.fleet import NodeIdentity, init_fleet, issue_node

READY = re.compile(r"shoal agent: ready node=(\S+) listen=([\d.]+):(\d+)")


@dataclass
class AgentProcess:
    """One ``shoal agent`` subprocess; its stderr log is collected in ``log``."""

    name: str
    process: subprocess.Popen[str]
    address: tuple[str, int]
    log: list[str] = field(default_factory=list)

    def log_text(self) -> str:
        return "\n".join(self.log)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass
class Fleet:
    """A fleet CA with issued node identities, plus a foreign CA for refusal tests."""

    root: Path

    def __post_init__(self) -> None:
        init_fleet(self.root / "fleet")
        init_fleet(self.root / "foreign", name="foreign")

    def identity(self, node: str) -> NodeIdentity:
        folder = self.root / "fleet" / "nodes" / node
        return NodeIdentity.load(folder) if (folder / "cert.pem").exists() else issue_node(self.root / "fleet", node)

    def foreign_identity(self, node: str) -> NodeIdentity:
        return issue_node(self.root / "foreign", node)


def start_agent(export_dir: Path, stage: int, identity: NodeIdentity, cache_dir: Path, *,
                next_address: tuple[str, int] | None = None, extra: list[str] | None = None,
                timeout: float = 120.0) -> AgentProcess:
    """Start ``shoal agent`` for one stage and wait for its ready line."""
    args = [sys.executable, "-m", "agent.cli.main", "--cache-dir", str(cache_dir), "agent", str(export_dir),
            "--stage", str(stage), "--identity", str(identity.cert.parent), "--listen", "127.0.0.1:0",
            "--device", "CPU", "--no-verify", *(extra or [])]
    if next_address is not None:
        args += ["--next", f"{next_address[0]}:{next_address[1]}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    agent = AgentProcess(identity.name, process, ("", 0))

    def drain_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            agent.log.append(line.rstrip())

    threading.Thread(target=drain_stderr, daemon=True).start()
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        match = READY.search(line)
        if match:
            agent.address = (match.group(2), int(match.group(3)))
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return agent
    agent.stop()
    raise RuntimeError(f"agent {identity.name} did not start:\n" + agent.log_text())


def start_ring(export_dir: Path, fleet: Fleet, cache_dir: Path, stages: int, prefix: str = "node",
               extra: list[str] | None = None) -> list[AgentProcess]:
    """One agent per stage, started last stage first (each needs its successor's port)."""
    agents: list[AgentProcess] = []
    next_address = None
    for stage in reversed(range(stages)):
        agent = start_agent(export_dir, stage, fleet.identity(f"{prefix}{stage}"), cache_dir,
                            next_address=next_address, extra=extra)
        agents.insert(0, agent)
        next_address = agent.address
    return agents


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def status(address: tuple[str, int], identity: NodeIdentity) -> dict[str, object]:
    from agent.cli.status_cmd import fetch_status

    return asyncio.run(fetch_status(address, identity))
