"""What the last stage hands back to the head: top-1 ids (greedy) or sampling distributions.

Full logits never travel by default: for greedy decoding the head only needs the argmax at each
position (4 bytes each); for sampling it needs the distribution it samples from, after
temperature / top-k / top-p, which is exactly the support with nonzero probability (ids + probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.sampling.distribution import SparseDistribution
from agent.sampling.params import SamplingParams, sampling_distribution


@dataclass(frozen=True)
class StepOutput:
    """The target model's answer for the positions of one step (all, or the last only)."""

    top1: np.ndarray | None = None
    """int32 ``[n]``: argmax at each position (greedy sessions)."""
    dists: list[SparseDistribution] | None = None
    """Sampling distributions at each position (sampling sessions)."""

    @property
    def positions(self) -> int:
        return len(self.top1) if self.top1 is not None else len(self.dists or ())

    def last(self) -> StepOutput:
        """The answer at the last position only."""
        if self.top1 is not None:
            return StepOutput(top1=self.top1[-1:])
        return StepOutput(dists=(self.dists or [])[-1:])

    def after(self, earlier: StepOutput) -> StepOutput:
        """``earlier``'s positions followed by this one's (both greedy or both sampled)."""
        if self.top1 is not None and earlier.top1 is not None:
            return StepOutput(top1=np.concatenate([earlier.top1, self.top1]))
        if self.dists is not None and earlier.dists is not None:
            return StepOutput(dists=[*earlier.dists, *self.dists])
        raise ValueError("cannot join a greedy answer with a sampled one")


def read_out(logits: np.ndarray, params: SamplingParams, last_only: bool) -> StepOutput:
    """Reduce ``[1, n, vocab]`` (or ``[n, vocab]``) logits to what the head needs."""
    rows = logits.reshape(-1, logits.shape[-1])
    if last_only:
        rows = rows[-1:]
    if params.greedy:
        return StepOutput(top1=np.argmax(rows, axis=-1).astype(np.int32))
    return StepOutput(dists=[SparseDistribution.from_probs(sampling_distribution(row, params)) for row in rows])
