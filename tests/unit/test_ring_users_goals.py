"""Issue 45's goals in the many-users report (bench.ring_users.users_goals): each measured against the cells it
needs, left out where the run did not measure them, a time between tokens held to at most its target."""

from __future__ import annotations

from typing import Any

import pytest

from bench.ring_users import goal_text, users_goals


def cell(tok_s: float, gap_p99_s: float = 0.05) -> dict[str, Any]:
    return {"tok_s": tok_s, "gap_p99_s": gap_p99_s}


CELLS = {
    "1": {"mono": cell(20.0), "pp": cell(15.0, 0.06), "packed": cell(14.0, 0.05)},
    "8": {"pp": cell(40.0), "packed": cell(100.0, 0.20), "cb": cell(90.0)},
    "16": {"packed": cell(110.0)},
}


def test_each_goal_is_its_ratio_against_its_target() -> None:
    goals = users_goals(CELLS)
    assert goals["packed, 8 users / mono"] == {"ratio": 5.0, "target": 4.0, "at_most": False, "pass": True}
    assert goals["packed, 16 users / mono"]["ratio"] == 5.5 and not goals["packed, 16 users / mono"]["pass"]
    assert goals["packed/pp, 8 users"]["ratio"] == 2.5 and goals["packed/pp, 8 users"]["pass"]
    assert goals["packed/pp, 1 user"]["ratio"] == pytest.approx(14.0 / 15.0)
    assert not goals["packed/pp, 1 user"]["pass"]  # 0.933 < 0.97
    close = {"ratio": 0.9689, "target": 0.97, "at_most": False, "pass": False}
    assert goal_text("alone", close) == "alone: 0.969x (>= 0.97x) FAIL"


def test_the_time_between_tokens_must_stay_below_its_target() -> None:
    gap = users_goals(CELLS)["packed p99 gap, 8 users / 1 user"]
    assert gap["ratio"] == pytest.approx(4.0) and gap["at_most"] and not gap["pass"]
    assert goal_text("gap", gap) == "gap: 4.00x (<= 3.00x) FAIL"
    fast = users_goals({**CELLS, "8": {**CELLS["8"], "packed": cell(100.0, 0.15)}})
    assert fast["packed p99 gap, 8 users / 1 user"]["pass"]


def test_goals_whose_cells_were_not_measured_are_left_out() -> None:
    goals = users_goals(CELLS)
    assert not any(name.startswith("packed+sd") for name in goals)  # no packed+sd cell at all
    without_mono = users_goals({n: {c: f for c, f in cells.items() if c != "mono"} for n, cells in CELLS.items()})
    assert not any("mono" in name for name in without_mono)
