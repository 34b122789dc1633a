"""A coordinator frozen (SIGSTOP) long enough for the fleet to plan on without it never takes the fleet back to
its older plan when it wakes (issue 46 §3: the soak's chaos saw the fleet return to the frozen coordinator's
epoch 8 after the next one had planned epoch 9, moving the ring three times for one freeze).

Real ``shoal agent`` processes on loopback (``tests.support.soak_fleet``: three stages of SmolLM2 int4, a warm
standby, a spare, a head), ``--lost-after 4``; the coordinator is stopped 9 s. Every agent logs each plan it
follows with its epoch: among the plans made with a quorum, none may follow a lower epoch than one it followed
before, and the fleet ends on one plan. A plan made without a quorum (the woken coordinator's, made alone as its
members seemed lost) is provisional: the fleet's plan outranks it whatever the epochs
(``discovery.plan_service.supersedes``).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.soak_fleet import SoakFleet

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

FOLLOWED = re.compile(r"node=\w+ plan \w+ epoch (\d+) \(document (\d+)(, without a quorum)?\) from ")
FROZEN_FOR = 9.0


def epochs_followed(log: Path) -> list[tuple[int, int]]:
    """(document, epoch) of each plan made with a quorum that an agent's log says it followed, in order."""
    return [(int(m[2]), int(m[1])) for m in FOLLOWED.finditer(log.read_text(errors="replace")) if not m[3]]


def test_a_coordinator_woken_from_a_freeze_never_takes_the_fleet_back_to_an_older_plan(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    fleet = SoakFleet(tmp_path, cache_dir, exported(3, "int4"))
    try:
        fleet.form()
        coordinator = str(asyncio.run(fleet.plan())["coordinator"])
        before = int(asyncio.run(fleet.plan())["epoch"])
        fleet.pause(coordinator, True)
        stopped = time.monotonic()
        try:  # the others plan on without it
            fleet.wait(lambda: int(asyncio.run(fleet.plan()).get("epoch") or 0) > before, 30, "a plan without it")
            time.sleep(max(0.0, FROZEN_FOR - (time.monotonic() - stopped)))
        finally:
            fleet.pause(coordinator, False)
        fleet.wait(lambda: asyncio.run(fleet.agreed()), 120, "one plan again, every stage ready")
    finally:
        fleet.stop_all()
    for log in sorted(tmp_path.glob("*.log")):
        followed = epochs_followed(log)
        assert followed, f"{log.name} followed no plan"
        went_back = [(a, b) for a, b in itertools.pairwise(followed) if b < a]
        assert not went_back, f"{log.name} went back to an older plan: {went_back} of {followed}"
