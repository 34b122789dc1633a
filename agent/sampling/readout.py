"""What the last stage hands back to the head: top-1 ids (greedy) or sampling distributions.

Full logits never travel by default: for greedy decoding the head only needs the argmax at each
position (4 bytes each); for sampling it needs the distribution it samples from, after
temperature / top-k / top-p, which is exactly the support with nonzero probability (ids + probs).
A session that asked for log-probabilities gets them besides (``agent.sampling.logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.sampling.distribution import SparseDistribution
from agent.sampling.logprobs import Logprobs, TokenScore, read_logprobs
from agent.sampling.params import SamplingParams, sampling_distribution


@dataclass(frozen=True)
class StepOutput:
    """The target model's answer for the positions of one step (all, or the last only)."""

    top1: np.ndarray | None = None
    """int32 ``[n]``: argmax at each position (greedy sessions)."""
    dists: list[SparseDistribution] | None = None
    """Sampling distributions at each position (sampling sessions)."""
    logprobs: Logprobs | None = None
    """The most likely tokens' log-probabilities at each position (sessions that asked for them)."""
    settled: bool = False
    """Every stage gave the step's positions the numbers a fresh prompt of the same tokens gives them, however
    that prompt's steps are cut (``agent.runtime.repeatable``): a later turn on the kept session may reuse them."""

    @property
    def positions(self) -> int:
        return len(self.top1) if self.top1 is not None else len(self.dists or ())

    def last(self) -> StepOutput:
        """The answer at the last position only."""
        logprobs = self.logprobs.rows(-1) if self.logprobs is not None else None
        if self.top1 is not None:
            return StepOutput(top1=self.top1[-1:], logprobs=logprobs, settled=self.settled)
        return StepOutput(dists=(self.dists or [])[-1:], logprobs=logprobs, settled=self.settled)

    def after(self, earlier: StepOutput) -> StepOutput:
        """``earlier``'s positions followed by this one's (both greedy or both sampled)."""
        logprobs = None
        if self.logprobs is not None and earlier.logprobs is not None:
            logprobs = self.logprobs.after(earlier.logprobs)
        settled = self.settled and earlier.settled
        if self.top1 is not None and earlier.top1 is not None:
            return StepOutput(top1=np.concatenate([earlier.top1, self.top1]), logprobs=logprobs, settled=settled)
        if self.dists is not None and earlier.dists is not None:
            return StepOutput(dists=[*earlier.dists, *self.dists], logprobs=logprobs, settled=settled)
        raise ValueError("cannot join a greedy answer with a sampled one")

    def score(self, row: int, token: int, params: SamplingParams) -> TokenScore | None:
        """The log-probability of ``token`` chosen at position ``row``, with the alternatives ``params`` asks for;
        None when the session asked for none."""
        if self.logprobs is None or params.logprobs is None:
            return None
        dist = self.dists[row] if self.dists is not None else None
        return self.logprobs.score(row, token, params.logprobs, params.temperature, dist)


def read_out(logits: np.ndarray, params: SamplingParams, last_only: bool) -> StepOutput:
    """Reduce ``[1, n, vocab]`` (or ``[n, vocab]``) logits to what the head needs."""
    rows = logits.reshape(-1, logits.shape[-1])
    if last_only:
        rows = rows[-1:]
    if params.greedy:
        output = StepOutput(top1=np.argmax(rows, axis=-1).astype(np.int32))
    else:
        output = StepOutput(dists=[SparseDistribution.from_probs(sampling_distribution(row, params)) for row in rows])
    if params.logprobs is None:
        return output
    logprobs = read_logprobs(rows, params.logprobs, params.temperature, output.dists)
    return StepOutput(output.top1, output.dists, logprobs)
