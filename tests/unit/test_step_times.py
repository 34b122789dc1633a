"""A stage's step durations in cumulative buckets, as Prometheus histograms count them (``le``: at most)."""

from __future__ import annotations

import pytest

from agent.node.step_times import StepTimes


def test_each_step_counts_in_every_bucket_at_or_above_its_duration() -> None:
    times = StepTimes(bounds=(0.01, 0.1, 1.0))
    for seconds in (0.005, 0.01, 0.05, 2.0):
        times.observe(seconds)
    assert times.to_json() == {"le": [0.01, 0.1, 1.0], "counts": [2, 3, 3], "count": 4, "sum": 2.065}


def test_bounds_must_ascend() -> None:
    with pytest.raises(ValueError, match="ascending"):
        StepTimes(bounds=(1.0, 0.1))
