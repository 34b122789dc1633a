"""The many-users report of ``python -m bench ring --users`` (bench.ring_users): figures per configuration and
number of users, and the ratios of packing on against off, from plain run records."""

from __future__ import annotations

from typing import Any

from bench.ring_bench import percentile
from bench.ring_users import build_users_report, render_users_table


def run(tok_s: float, per_user: list[float], packs: float = 0.0, steps: float = 0.0) -> dict[str, Any]:
    return {
        "tok_s": tok_s,
        "per_user_tok_s": per_user,
        "ttft_s": [0.1] * len(per_user),
        "gap_p50_s": 0.02,
        "gap_p99_s": 0.05,
        "tokens": [[5, 6, 7]] * len(per_user),
        "load_before": 2.0,
        "load_after": 3.0,
        "agent_packs": packs,
        "agent_packed_steps": steps,
    }


def test_percentile_is_the_nearest_rank() -> None:
    ordered = [float(i) for i in range(1, 101)]
    assert percentile(ordered, 0.5) == 50.0
    assert percentile(ordered, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0


def test_the_report_gives_medians_ratios_and_steps_per_pack() -> None:
    raw = {
        "settings": {},
        "machine": {},
        "runs": {
            "1": {"mono": [run(100.0, [100.0])], "pp": [run(40.0, [40.0], 10, 10)]},
            "4": {
                "pp": [run(40.0, [10.0] * 4, 10, 10), run(44.0, [11.0] * 4, 10, 10)],
                "packed": [run(80.0, [20.0] * 4, 10, 30), run(90.0, [22.0] * 4, 10, 30)],
            },
        },
    }
    report = build_users_report(raw)
    cell = report["cells"]["4"]["packed"]
    assert cell["tok_s"] == 85.0 and cell["per_user_tok_s"] == 21.0 and cell["steps_per_pack"] == 3.0
    assert report["ratios"]["4"]["packed/pp"] == 85.0 / 42.0
    assert report["ratios"]["4"]["packed/mono(1 user)"] == 0.85
    assert report["cells"]["1"]["mono"]["steps_per_pack"] is None
    assert "packed/pp 2.02x" in render_users_table(report)
