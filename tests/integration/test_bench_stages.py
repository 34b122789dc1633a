"""``shoal bench stages``: every stage is timed, and the planner's shares are set beside the measured ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agent.measure.stages import render_table, time_stages, time_stages_together


def test_every_stage_is_timed_beside_its_planned_share(exported: Callable[..., Path], cache_dir: Path) -> None:
    stages = 3  # a first, a middle and a last stage (the int4 3-stage export is shared with other tests)
    export = exported(stages, "int4")
    timings = time_stages(export, threads=1, prompt_tokens=8, tokens=2, cache_dir=cache_dir)
    assert [t.name for t in timings] == [f"stage-{i}" for i in range(stages)]
    assert sum(t.layers for t in timings) == 30
    assert timings[0].embeddings and timings[-1].head and not timings[0].head
    assert all(0 < t.ms_min <= t.ms_median for t in timings)
    assert sum(t.planned_share for t in timings) == pytest.approx(1.0)
    table = render_table(str(export), timings)
    assert table.count("| stage-") == stages and "LM head" in table


def test_stages_are_also_timed_all_at_once(exported: Callable[..., Path], cache_dir: Path) -> None:
    export = exported(3, "int4")
    together = time_stages_together(export, [0, 0, 0], threads=1, prompt_tokens=8, tokens=3, cache_dir=cache_dir)
    assert len(together) == 3 and all(t.alone_ms > 0 and t.together_ms > 0 for t in together)
    # three stages sharing one core: each waits for the others' steps when they all run
    assert sum(t.together_ms for t in together) > sum(t.alone_ms for t in together)
    table = render_table(
        str(export), time_stages(export, threads=1, prompt_tokens=8, tokens=2, cache_dir=cache_dir), together
    )
    rows = [line for line in table.splitlines() if line.startswith("| stage-")]
    assert len(rows) == 3 and all(" → " in row for row in rows) and "Users keeping every stage busy" in table
