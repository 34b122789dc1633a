"""The soak's chaos driver: a bounded list of faults, injected into a running fleet while it serves.

:func:`schedule` is a pure function of a random generator: which faults, and after how many finished requests
each is injected (request counts, not seconds, so that a slow machine sees the same faults in the same places).
:class:`Chaos` applies them one after another to a :class:`tests.support.soak_fleet.SoakFleet` and records, for
each, what it hit, how long it lasted and how long the fleet took to follow one plan hash again.

Faults (``KINDS``): ``kill`` (``kill -9`` of a stage's agent, the stage its standby has if one stands by; the
agent is started again ``hold`` seconds later and rejoins), ``stop`` (SIGSTOP of a stage's agent for ``hold``
seconds, 8-30, then SIGCONT), ``coordinator`` (the coordinator stopped and started again), ``revoke`` (the spare
node's certificate revoked, at most once). ``LAB_KINDS`` adds ``cut``: a stage agent's host cut off the network
for ``hold`` seconds, 3-8, then plugged back (its cable pulled: its peers see nothing but silence); it needs the
fleet in a lab of network namespaces (``python -m bench soak --lab``), so on loopback it is never scheduled.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.support.soak_fleet import HEAD, SPARE, SoakFleet

log = logging.getLogger(__name__)

KINDS = ("kill", "stop", "coordinator", "revoke")
LAB_KINDS = (*KINDS, "cut")
HOLDS = {"kill": (15.0, 30.0), "stop": (8.0, 30.0), "cut": (3.0, 8.0), "coordinator": (0.0, 0.0), "revoke": (0.0, 0.0)}
"""Seconds each kind of fault holds, at least and at most (before ``schedule``'s ``max_hold``)."""
ONE_PLAN_TIMEOUT = 180.0
"""Seconds a fault's fleet is given to follow one plan hash again before the driver notes it and goes on."""


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, the number of finished requests it waits for, and how long it holds (seconds)."""

    kind: str
    after_requests: int
    hold: float


def schedule(
    rng: random.Random, count: int, requests: int, kinds: tuple[str, ...] = KINDS, max_hold: float = 30.0
) -> tuple[Fault, ...]:
    """``count`` faults spread over the middle of ``requests`` requests (none in the first or last tenth), the
    kinds taken in turn from a shuffled ``kinds`` (a revocation at most once: there is one spare); no fault
    holds longer than ``max_hold`` seconds (the short soak's)."""
    order = list(kinds)
    rng.shuffle(order)
    picked = [order[i % len(order)] for i in range(count)]
    picked = [k for i, k in enumerate(picked) if k != "revoke" or "revoke" not in picked[:i]]
    low, high = max(1, requests // 10), max(2, requests - requests // 10)
    marks = sorted(rng.randint(low, high) for _ in picked)
    return tuple(
        Fault(k, m, round(min(max_hold, rng.uniform(*HOLDS[k])), 1)) for k, m in zip(picked, marks, strict=True)
    )


@dataclass
class FaultRecord:
    """What one fault did: its target, when it was injected and ended (monotonic seconds), and when the fleet
    followed one ready plan again (``one_plan_s``: seconds from the fault's end; None: not within the timeout)."""

    kind: str
    target: str
    injected: float
    ended: float = 0.0
    one_plan_s: float | None = None
    note: str = ""
    plan_hash: str | None = None
    covered: bool = False
    """Whether a standby stood by for the target's stage when the fault came (answers lost count only there)."""

    def to_json(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Chaos:
    """Injects ``faults`` into ``fleet`` as ``finished()`` (the count of finished requests) reaches each, until
    ``over()``."""

    fleet: SoakFleet
    faults: tuple[Fault, ...]
    finished: Callable[[], int]
    over: Callable[[], bool] = lambda: False
    """Whether the load has ended: the faults still waiting are then never injected."""
    clock: Callable[[], float] = time.monotonic
    records: list[FaultRecord] = field(default_factory=list)

    async def run(self) -> list[FaultRecord]:
        for fault in self.faults:
            while self.finished() < fault.after_requests:
                if self.over():
                    return self.records
                await asyncio.sleep(0.2)
            try:
                record = await self._inject(fault)
            except Exception as exc:  # a fault that could not be injected is noted, and the soak goes on
                log.exception("chaos: %s failed", fault.kind)
                record = FaultRecord(fault.kind, "", self.clock(), self.clock(), note=f"not injected: {exc}")
            self.records.append(record)
            log.warning("chaos: %s", record.to_json())
        return self.records

    async def _inject(self, fault: Fault) -> FaultRecord:
        fleet = self.fleet
        if fault.kind == "revoke":
            record = FaultRecord("revoke", SPARE, self.clock(), covered=True)  # the spare holds no stage
            await fleet.revoke(SPARE)
            await asyncio.to_thread(fleet.stop, SPARE)  # refused by every peer now: it has nothing left to do
        elif fault.kind == "coordinator":
            target = str((await fleet.plan()).get("coordinator"))
            record = FaultRecord("coordinator", target, self.clock(), covered=await fleet.standing_by() == target)
            await asyncio.to_thread(fleet.stop, target)
            await asyncio.to_thread(fleet.start, target, seed=HEAD)
        else:
            covered = await fleet.standing_by()
            target = covered or _pick(await fleet.stage_holders())
            record = FaultRecord(fault.kind, target, self.clock(), note=f"hold {fault.hold:g} s", covered=bool(covered))
            begin, end = {
                "kill": (lambda: fleet.kill(target), lambda: fleet.start(target, seed=HEAD)),
                "stop": (lambda: fleet.pause(target, True), lambda: fleet.pause(target, False)),
                "cut": (lambda: fleet.cut(target, True), lambda: fleet.cut(target, False)),
            }[fault.kind]
            await asyncio.to_thread(begin)
            await asyncio.sleep(fault.hold)
            await asyncio.to_thread(end)
        record.ended = self.clock()
        deadline = record.ended + ONE_PLAN_TIMEOUT
        while self.clock() < deadline:
            if (found := await fleet.agreed()) is not None:
                record.one_plan_s, record.plan_hash = self.clock() - record.ended, found
                break
            await asyncio.sleep(0.5)
        return record


def _pick(holders: list[str]) -> str:
    if not holders:
        raise RuntimeError("the plan names no stage holder")
    return random.choice(holders)
