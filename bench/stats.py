"""Pure helpers for benchmark figures: summaries of repeated runs, paired ratios, token agreement."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    """Median and range of one figure over several runs."""

    median: float
    min: float
    max: float
    runs: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if not values:
            raise ValueError("cannot summarise zero runs")
        return cls(median=statistics.median(values), min=min(values), max=max(values), runs=len(values))


def paired_ratios(values: Sequence[float], reference: Sequence[float]) -> list[float]:
    """``values[i] / reference[i]`` for runs measured side by side (same round of the interleaving)."""
    if len(values) != len(reference):
        raise ValueError(f"{len(values)} runs cannot be paired with {len(reference)} reference runs")
    return [v / r for v, r in zip(values, reference, strict=True) if r > 0]


@dataclass(frozen=True)
class Agreement:
    """How far two greedy completions coincide."""

    same: int
    """Positions holding the same token id."""
    total: int
    first_difference: int | None
    """Index of the first differing token, None when the two are identical."""


def agreement(tokens: Sequence[int], reference: Sequence[int]) -> Agreement:
    """Compare two token sequences position by position (a length difference counts as differing)."""
    total = max(len(tokens), len(reference))
    same = sum(1 for a, b in zip(tokens, reference, strict=False) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b), None)
    if first is None and len(tokens) != len(reference):
        first = min(len(tokens), len(reference))
    return Agreement(same=same, total=total, first_difference=first)
