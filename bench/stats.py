"""Pure helpers for benchmark figures: summaries of repeated runs, paired ratios, token agreement, users' figures
from the time stamps of their tokens."""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class StampFigures:
    """The users' figures from the time stamps of their tokens, as ``python -m bench ring`` measures a ring."""

    tok_s: float
    """Tokens stamped after the last user's first token, over the time from then to the last token."""
    per_user_tok_s: list[float]
    ttft_s: list[float]
    window_s: float
    window_tokens: int
    gap_p50_s: float | None
    gap_p99_s: float | None
    """Median and 99th percentile of the time between a user's consecutive tokens (tokens of one step: 0)."""

    @classmethod
    def of(cls, stamps: Sequence[Sequence[float]], started: float) -> StampFigures:
        """Figures of users whose tokens were stamped ``stamps`` (one list per user, every list non-empty) in a run
        that began at ``started``."""
        t0 = max(s[0] for s in stamps)
        t1 = max(s[-1] for s in stamps)
        counted = sum(1 for user_stamps in stamps for t in user_stamps if t > t0)
        window = t1 - t0
        gaps = sorted(b - a for user_stamps in stamps for a, b in itertools.pairwise(user_stamps))
        return cls(
            tok_s=counted / window if window > 0 else 0.0,
            per_user_tok_s=[(len(s) - 1) / (s[-1] - s[0]) if len(s) > 1 and s[-1] > s[0] else 0.0 for s in stamps],
            ttft_s=[s[0] - started for s in stamps],
            window_s=window,
            window_tokens=counted,
            gap_p50_s=percentile(gaps, 0.5) if gaps else None,
            gap_p99_s=percentile(gaps, 0.99) if gaps else None,
        )


def percentile(ordered: Sequence[float], share: float) -> float:
    """The value below which ``share`` of the sorted ``ordered`` values lie (nearest rank)."""
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]
