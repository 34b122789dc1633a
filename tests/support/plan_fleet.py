"""Real agents on a LAN of network namespaces, fed by a Hub mirror (the plan lab, ``python -m bench plan``).

The process that drives it stays in the root namespace and never opens a socket to a lab address: it reads
the agents' logs, and asks their status and their chats through processes started inside the lab hosts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_agent
from tests.integration.netlab import NetLab

PORT = 7100
PROMPT = "What is the capital of France?"
MAX_TOKENS = 12
AGENT_FLAGS = ("--lost-after", "4", "--threads", "1", "--speed", "10")
"""Every lab agent's: one speed for all, since measured on one machine's shared cores the figures are noise,
and a late agent measured faster by chance would take a stage over instead of standing by."""
ASK = """
import asyncio, json, sys
from pathlib import Path
from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
endpoint = ChatEndpoint.load(Path(sys.argv[1]))
request = ChatRequest(token=endpoint.token, messages=(("user", sys.argv[2]),), max_tokens=int(sys.argv[3]))
async def main():
    return [json.loads(e.to_line()) async for e in ask(endpoint, request)]
print(json.dumps(asyncio.run(main())))
"""


class LabFleet:
    """The lab's agents by name; the test process reads their logs and asks their status from inside the lab."""

    def __init__(self, lab: NetLab, root: Path, cache: Path, endpoint: str) -> None:
        self.lab, self.root, self.cache, self.endpoint = lab, root, cache, endpoint
        init_fleet(root / "fleet", "lab")
        self.identities: dict[str, NodeIdentity] = {}
        self.running: dict[str, LocalAgent] = {}
        self.hosts: dict[str, int] = {}

    def identity(self, name: str, host: int) -> NodeIdentity:
        if name not in self.identities:
            self.identities[name] = issue_node(self.root / "fleet", name, ips=[self.lab.ip(host)])
        return self.identities[name]

    def shards(self, name: str) -> Path:
        return self.root / "shards" / name

    def start(self, name: str, host: int, *args: str, env: dict[str, str] | None = None) -> LocalAgent:
        identity = self.identity(name, host)
        agent = launch_agent(
            None,
            None,
            identity.cert.parent,
            self.cache,
            listen=f"{self.lab.ip(host)}:{PORT}",
            extra_args=[*AGENT_FLAGS, "--shards-dir", str(self.shards(name)), *args],
            wrapper=self.lab.command(host, []),
            env={"HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})},
            log_path=self.root / f"{name}.log",
            timeout=60,
        )
        self.running[name], self.hosts[name] = agent, host
        return agent

    def shoal(self, host: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
        command = self.lab.command(host, [sys.executable, "-m", "agent.cli.main", *map(str, args)])
        return subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", timeout=60)

    def status(self, name: str) -> dict[str, Any]:
        """The agent's whole status document (``shoal status --json``, asked from inside its host)."""
        host = self.hosts[name]
        done = self.shoal(
            host, "status", f"{self.lab.ip(host)}:{PORT}", "--identity", self.identities[name].cert.parent, "--json"
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def plan(self, name: str) -> dict[str, Any]:
        return self.status(name)["plan"]  # type: ignore[no-any-return]

    def agreed(self, names: list[str]) -> str | None:
        """The plan hash every agent of ``names`` follows, once the last one's ring is ready (each status is a
        process started inside the lab: the others are asked only then)."""
        if not self.plan(names[-1]).get("ready"):
            return None
        plans = [self.plan(n) for n in names]
        hashes = {p.get("hash") for p in plans}
        return plans[0]["hash"] if len(hashes) == 1 and all(p.get("ready") for p in plans) else None

    def ask(self, name: str, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> list[int]:
        chat_file = self.root / f"{name}-chat.json"
        command = self.lab.command(
            self.hosts[name], [sys.executable, "-c", ASK, str(chat_file), prompt, str(max_tokens)]
        )
        done = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", timeout=120)
        assert done.returncode == 0, done.stderr
        events = json.loads(done.stdout)
        assert events[-1]["event"] == "done", events[-1]
        return [e["id"] for e in events if e["event"] == "token"]

    def until(self, check: Callable[[], object], timeout: float, what: str) -> float:
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > timeout:
                logs = "\n".join(f"--- {n}\n" + "\n".join(list(a.log)[-20:]) for n, a in self.running.items())
                raise AssertionError(f"not within {timeout} s: {what}\n{logs}")
            time.sleep(0.25)
        return time.monotonic() - start

    def fetched(self, name: str) -> set[str]:
        """The files of the export in the agent's shard cache (what it downloaded)."""
        found = set()
        for snapshot in self.shards(name).glob("models--*/snapshots/*"):
            found |= {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}
        return found

    def stop_all(self) -> None:
        for agent in self.running.values():
            agent.stop(timeout=5)
