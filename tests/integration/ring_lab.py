"""Agents as real processes on loopback, for the ring tests: a fleet, identities, start/stop."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_agent, launch_ring

AgentProcess = LocalAgent


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


def start_agent(
    export_dir: Path,
    stage: int,
    identity: NodeIdentity,
    cache_dir: Path,
    *,
    next_address: tuple[str, int] | None = None,
    extra: list[str] | None = None,
    listen: str = "127.0.0.1:0",
    wrapper: list[str] | None = None,
) -> LocalAgent:
    """Start ``shoal agent`` for one stage (CPU, files not re-hashed) and wait until it serves."""
    return launch_agent(
        export_dir,
        stage,
        identity.cert.parent,
        cache_dir,
        next_address=next_address,
        listen=listen,
        extra_args=["--device", "CPU", "--no-verify", *(extra or [])],
        wrapper=wrapper,
    )


def start_ring(
    export_dir: Path, fleet: Fleet, cache_dir: Path, stages: int, prefix: str = "node", extra: list[str] | None = None
) -> list[LocalAgent]:
    """One agent per stage on loopback."""
    identities = [fleet.identity(f"{prefix}{stage}").cert.parent for stage in range(stages)]
    return launch_ring(export_dir, identities, cache_dir, extra_args=["--device", "CPU", "--no-verify", *(extra or [])])


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
    from agent.cli.status_link import fetch_status

    return asyncio.run(fetch_status(address, identity))
