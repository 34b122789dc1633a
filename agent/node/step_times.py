"""How long a stage's steps take, counted into fixed buckets (``shoal status``, the ``/metrics`` histogram)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds in seconds: a one-token decode step of a small stage takes milliseconds, a long prompt's
prefill step tens of seconds."""


@dataclass
class StepTimes:
    """A cumulative histogram of step durations: ``counts[i]`` steps took at most ``bounds[i]`` seconds."""

    bounds: tuple[float, ...] = STEP_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(self.bounds) or not self.bounds:
            raise ValueError(f"bucket bounds must be ascending, not {self.bounds}")
        self.counts = self.counts or [0] * len(self.bounds)

    def observe(self, seconds: float) -> None:
        """Count one step of ``seconds``."""
        for i in range(bisect.bisect_left(self.bounds, seconds), len(self.bounds)):
            self.counts[i] += 1
        self.total += 1
        self.seconds += seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "le": list(self.bounds),
            "counts": list(self.counts),
            "count": self.total,
            "sum": round(self.seconds, 6),
        }
