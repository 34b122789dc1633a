"""The fleet view of a peer whose clock is set days wrong (issue 41 §4): its row says why, in red, and an
uncovered stage's banner names it."""

from __future__ import annotations

import pytest

from tests.tui.fakes import fleet_status
from tui.fleet import fleet_report

pytestmark = pytest.mark.tui

CLOCK = (
    "pc3's clock is 2 days behind this PC's (delta): delta's certificate is not yet valid by it; set pc3's clock (NTP)"
)


def test_a_peer_that_cannot_link_for_its_clock_says_why_in_its_row_and_in_the_banner() -> None:
    status = fleet_status(stage0=None)
    pc3 = {
        "node": "3c3c3c3c3c3c",
        "name": "pc3",
        "state": "unverified",
        "address": "10.0.0.3:7100",
        "last_heard": None,
        "found": ["mdns"],
        "why": CLOCK,
        "clock_skew": -172800.0,
        "clock": CLOCK,
        "announces": {"devices": ["CPU"], "memory_mb": 15562, "stages": [], "donor": "serving"},
    }
    status["members"]["members"].append(pc3)
    reason = f"pc3 could hold it but is unverified ({CLOCK}); every member that can hold it serves another stage"
    status["plan"]["stages"][0]["reason"] = reason  # as discovery.placement words it
    report = fleet_report(status)
    row = next(r for r in report.others if r.name == "pc3")
    assert (row.state, row.role, row.health, row.heard) == ("unverified", CLOCK, "bad", "never")
    assert report.banner == f"Stage 0 is uncovered: {reason}" and report.severity == "error"
    # a peer that is merely unverified yet (no clock to blame) is no alarm
    pc3.update(why="", clock=None)
    assert next(r for r in fleet_report(status).others if r.name == "pc3").health == "idle"
