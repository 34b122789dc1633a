"""Fakes of the TUI's data sources and clock, and status documents shaped like a real agent's.

The status documents copy what the head of an in-process fleet reported (``discovery/plan_service.py``'s
``plan`` section, ``discovery/service.py``'s ``members``): three stages on alpha, beta and gamma (layers 0-9,
10-19, 20-29 of 30), the user's PC (delta) heading chats and holding none; and what each stage agent reports
of itself (``agent/node/server.py``: device, step times, sessions, memory). :class:`FakeAdmin` is an admin
source with fixed lists, for the screenshots.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from agent.chat_client.protocol import ChatEvent
from agent.errors import FleetError, PeerUnavailableError
from tui.admin import AdminOutcome, AdminOverview, EnrolledEntry, JoinInvite, PinEntry
from tui.generation import GenerationSettings, Turn


def run(main: Callable[[], Awaitable[None]], timeout: float = 120.0) -> None:
    """Run a Pilot test's coroutine, failing it after ``timeout`` seconds rather than hanging the suite."""

    async def bounded() -> None:
        await asyncio.wait_for(main(), timeout)

    asyncio.run(bounded())


class FixedClock:
    """A clock that moves only when told to (``advance``), or by ``step`` at every reading."""

    def __init__(self, now: float = 1_800_000_000.0, step: float = 0.0) -> None:
        self.now = now
        self.step = step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def tokens(*texts: str, **stats: Any) -> list[ChatEvent]:
    """The events of an answer made of ``texts``, ending in a done event with ``stats``."""
    done = {"tokens": len(texts), "seconds": 0.5, "steps": len(texts), "drafted": 0, "accepted": 0, **stats}
    return [ChatEvent("token", id=i, text=t) for i, t in enumerate(texts)] + [ChatEvent("done", stats=done)]


class FakeChat:
    """Answers each request with the next script of events. Between events it waits ``pace`` seconds, and
    moves ``clock`` on by ``latency`` (so that the time to the first token is known); a script's ``None``
    holds the stream there until the client leaves (an answer still being computed). ``closed_early``
    records, for each answer, whether its client closed the stream before its end."""

    def __init__(
        self,
        *scripts: Sequence[ChatEvent | None],
        pace: float = 0.0,
        clock: FixedClock | None = None,
        latency: float = 0.0,
    ) -> None:
        self.scripts = list(scripts)
        self.pace = pace
        self.clock = clock
        self.latency = latency
        self.requests: list[tuple[tuple[Turn, ...], GenerationSettings]] = []
        self.closed_early: list[bool] = []
        self.holding = asyncio.Event()
        """Set when a script reached its ``None``."""

    async def answer(self, messages: Sequence[Turn], settings: GenerationSettings) -> AsyncGenerator[ChatEvent, None]:
        self.requests.append((tuple(messages), settings))
        script = self.scripts.pop(0) if self.scripts else tokens("(no script)")
        finished = False
        try:
            for event in script:
                if self.pace:
                    await asyncio.sleep(self.pace)
                if event is None:
                    self.holding.set()
                    await asyncio.Event().wait()  # until cancelled
                    continue
                if self.clock is not None:
                    self.clock.advance(self.latency)
                yield event
            finished = True
        finally:
            self.closed_early.append(not finished)


class FakeStatus:
    """Answers each poll with ``document`` (changeable meanwhile), or raises ``error`` if set."""

    def __init__(self, document: dict[str, Any] | None = None, error: str | None = None) -> None:
        self.document = document
        self.error = error
        self.polls = 0
        self.closed = False

    async def get(self) -> dict[str, Any]:
        self.polls += 1
        if self.error is not None or self.document is None:
            raise PeerUnavailableError(self.error or "no document")
        return copy.deepcopy(self.document)

    async def close(self) -> None:
        self.closed = True


NODES = {"alpha": "4f43af36b395", "beta": "b891466420a9", "gamma": "0c1d2e3f4a5b", "epsilon": "9a8b7c6d5e4f"}


def _member(name: str, state: str = "member", stages: Sequence[str] = (), heard: float | None = 0.7) -> dict[str, Any]:
    return {
        "node": NODES[name],
        "name": name,
        "state": state,
        "address": f"127.0.0.1:{44000 + len(name)}",
        "last_heard": heard,
        "found": ["gossip", "inbound"],
        "why": "" if state == "member" else "unheard for 3 s",
        "clock_skew": -0.002,
        "announces": {"devices": ["CPU"], "memory_mb": 15562, "stages": list(stages), "donor": "serving"},
    }


def _stage(stage: int, name: str | None, state: str, progress: int | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "stage": stage,
        "node": NODES[name] if name else None,
        "name": name,
        "layers": [stage * 10, stage * 10 + 10],
        "state": "uncovered" if name is None else state,
        "progress": progress,
        "standbys": extra.get("standbys", []),
        "reason": extra.get("reason", f"given to {name}, a free member that can hold it" if name else ""),
    }


def fleet_status(*, stage0: str | None = "alpha", ready: bool = True, lost: str | None = None) -> dict[str, Any]:
    """The head's status: stages 0-2 on alpha (or ``stage0``; None: uncovered), beta and gamma (compiling
    when not ``ready``), epsilon standing by for stage 1; ``lost``: a member unheard since."""
    no_room = "every member that can hold it serves another stage"
    stages = [
        _stage(0, stage0, "ready", reason=no_room if stage0 is None else ""),
        _stage(
            1,
            "beta",
            "ready",
            standbys=[{"node": NODES["epsilon"], "name": "epsilon", "state": "downloading", "progress": 40}],
        ),
        _stage(2, "gamma", "ready" if ready else "downloading", None if ready else 70),
    ]
    waiting = None
    if stage0 is None:
        waiting = f"stage 0 is uncovered: {stages[0]['reason']}"
    elif not ready:
        waiting = "stage 2 on gamma is downloading"
    members = [
        _member("alpha", stages=["0:ready"]),
        _member("beta", stages=["1:ready"]),
        _member("gamma", stages=["2:ready"]),
        _member("epsilon", stages=["1:downloading@40"]),
    ]
    if lost is not None:
        for member in members:
            if member["name"] == lost:
                member.update(state="lost", last_heard=12.0, why="unheard for 12 s")
    return {
        "node": "delta",
        "stages": [],
        "sessions": [],
        "max_sessions": 8,
        "chat": {"endpoint": "127.0.0.1:41685", "answered": 3, "running": 0},
        "members": {"node": "559fae05041c", "name": "delta", "fleet": "cdd53fa11d48ac46", "members": members},
        "plan": {
            "document": 2,
            "model": "/exports/smollm2-3stage",
            "export": "e1f2",
            "manifest_error": None,
            "coordinator": "alpha",
            "hash": "3f77186a9c0d" + "0" * 52,
            "epoch": 4,
            "planned_by": "alpha",
            "planned_for": 2,
            "complete": stage0 is not None,
            "ready": ready and stage0 is not None and lost is None,
            "waiting": waiting,
            "bottleneck": 0.2,
            "layers": 30,
            "stages": stages,
            "pins": [],
        },
        "ring": {"activity": "serving no stage (the plan needs no more PCs)", "held": None, "download": None},
    }


def stage_status(
    name: str, *, steps: int = 400, step_ms: float = 10.0, sessions: int = 2, parked: int = 1, memory_mb: int = 812
) -> dict[str, Any]:
    """What a stage agent reports of itself (``agent/node/server.py``): ``steps`` steps of ``step_ms`` each."""
    stage = {"alpha": 0, "beta": 1, "gamma": 2}.get(name, 0)
    return {
        "node": name,
        "layers": [stage * 10, stage * 10 + 10],
        "stages": [stage],
        "device": "CPU",
        "sessions": [f"{i + 1:016x}" for i in range(sessions)],
        "parked": parked,
        "evicted": 0,
        "max_sessions": 8,
        "steps_served": steps,
        "step_seconds": {"le": [0.01, 0.1], "counts": [steps, steps], "count": steps, "sum": steps * step_ms / 1000},
        "memory_mb": memory_mb,
    }


def peer_statuses() -> dict[str, dict[str, Any]]:
    """The three stage agents of :func:`fleet_status`, by node id: beta the slowest."""
    return {
        NODES["alpha"]: stage_status("alpha", step_ms=8.0, sessions=2, parked=1, memory_mb=812),
        NODES["beta"]: stage_status("beta", step_ms=24.0, sessions=2, parked=1, memory_mb=1630),
        NODES["gamma"]: stage_status("gamma", step_ms=8.0, sessions=3, parked=0, memory_mb=790),
    }


class FakePeers:
    """Answers a poll of a node with ``documents[node]``, or raises for a node in ``failing`` or not known."""

    def __init__(self, documents: dict[str, dict[str, Any]] | None = None) -> None:
        self.documents = documents if documents is not None else peer_statuses()
        self.failing: set[str] = set()
        self.asked: list[tuple[str, str]] = []
        self.closed = False

    async def get(self, node: str, address: str) -> dict[str, Any]:
        self.asked.append((node, address))
        if node in self.failing or node not in self.documents:
            raise PeerUnavailableError(f"cannot reach {address}")
        return copy.deepcopy(self.documents[node])

    async def close(self) -> None:
        self.closed = True


class FakeAdmin:
    """An admin source with fixed lists that does what it is asked to in memory (the screenshots' data)."""

    def __init__(self) -> None:
        self.version = 3
        self.pins = [PinEntry("beta", 1, True)]
        self.nodes = [
            EnrolledEntry(name, NODES[name], "sha256:" + "ab" * 32, "2026-11-30 09:1" + str(i), how, False)
            for i, (name, how) in enumerate(
                [("alpha", "issued"), ("beta", "issued"), ("gamma", "token k3x9pa"), ("epsilon", "token 7hq2md")]
            )
        ]
        self.calls: list[tuple[Any, ...]] = []

    async def overview(self) -> AdminOverview:
        return AdminOverview(
            "/home/ada/.local/share/shoal/fleet",
            self.version,
            "/exports/smollm2-3stage",
            tuple(self.pins),
            tuple(self.nodes),
        )

    async def pin(self, node: str, stage: int, prefer: bool) -> AdminOutcome:
        self.calls.append(("pin", node, stage, prefer))
        self.pins = [p for p in self.pins if p.node != node and p.stage != stage] + [PinEntry(node, stage, not prefer)]
        self.version += 1
        return AdminOutcome(f"pinned stage {stage} to {node}: version {self.version}")

    async def unpin(self, node: str) -> AdminOutcome:
        self.calls.append(("unpin", node))
        if not any(p.node == node for p in self.pins):
            raise FleetError(f"{node} has no pin in fleet document version {self.version}")
        self.pins = [p for p in self.pins if p.node != node]
        self.version += 1
        return AdminOutcome(f"unpinned {node}: version {self.version}")

    async def token(self) -> JoinInvite:
        self.calls.append(("token",))
        return JoinInvite(
            "shoal join k3x9pa.0123456789abcdef0123456789abcdef.fedcba98@10.0.0.5:7300",
            "k3x9pa",
            "2026-12-04 09:00",
            1,
            "It is redeemed while `shoal fleet serve-enrollment --listen 10.0.0.5:7300` runs on this PC.",
        )

    async def revoke(self, node: str, drop_pins: bool = False) -> AdminOutcome:
        self.calls.append(("revoke", node, drop_pins))
        self.nodes = [n if node not in (n.name, n.node_id) else replace(n, revoked=True) for n in self.nodes]
        return AdminOutcome(f"revoked {node}: revocation list version 1; no agent runs on this PC", "warning")


async def until(pilot: Any, condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Let the app run (``pilot.pause``) until ``condition`` holds; fail naming ``what`` after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await pilot.pause(0.02)
