"""Statistical checks that a speculative verifier emits tokens from the target distribution.

Reusable with real model distributions: pass the dense target distributions ``p_1..p_{K+1}`` and the
draft's ``q_1..q_K`` (or fixed draft tokens for a deterministic drafter), then compare the histograms
with ``chi_square_pvalue``. Each trial judges its drafts at positions of its own under one keyed noise
(``agent.sampling.keyed``), and a draft model draws its guesses with that same noise, as the head's does.
The targets are taken as context-independent, so the second emitted token, given the first draft was
accepted, must follow ``p_2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import chisquare

from agent.head.speculative import Verdict
from agent.sampling.distribution import SparseDistribution
from agent.sampling.keyed import PositionNoise

VerifyFn = Callable[[Sequence[int], Sequence[SparseDistribution], PositionNoise, int], Verdict]


def emitted_token_histograms(
    verify: VerifyFn,
    p: Sequence[np.ndarray],
    q: Sequence[np.ndarray] | None,
    n: int,
    seed: int,
    draft_tokens: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n`` independent verification steps; count the first emitted token, and the second one when
    the first draft was accepted.

    ``p``: K+1 dense target distributions. ``q``: K dense draft distributions the drafts are drawn
    from (with the trial's noise), or None for a deterministic drafter that always drafts
    ``draft_tokens``. Returns two ``[vocab]`` count arrays.
    """
    vocab = len(p[0])
    k = len(p) - 1
    noise = PositionNoise(seed)
    targets = [SparseDistribution.from_probs(pi) for pi in p]
    if q is None:
        if draft_tokens is None or len(draft_tokens) != k:
            raise ValueError(f"a deterministic drafter needs {k} draft tokens")
    elif len(q) != k:
        raise ValueError(f"{k + 1} target distributions need {k} draft distributions")
    draft_dists = None if q is None else [SparseDistribution.from_probs(qi) for qi in q]
    first = np.zeros(vocab, dtype=np.int64)
    second = np.zeros(vocab, dtype=np.int64)
    for trial in range(n):
        start = trial * (k + 1)
        if draft_dists is None:
            row = [int(t) for t in draft_tokens or ()]
        else:
            row = [noise.sample(d, start + i) for i, d in enumerate(draft_dists)]
        verdict = verify(row, targets, noise, start)
        first[verdict.tokens[0]] += 1
        if verdict.accepted >= 1:
            second[verdict.tokens[1]] += 1
    return first, second


def chi_square_pvalue(counts: np.ndarray, p: np.ndarray) -> float:
    """Goodness of fit of ``counts`` to ``p``; bins expecting fewer than 5 samples are pooled.

    A sample in a zero-probability bin is impossible under ``p``, so it gives 0.0. With fewer than two
    bins left there is nothing to test and the result is 1.0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    total = counts.sum()
    if total <= 0:
        raise ValueError("no samples")
    if counts[p == 0].sum() > 0:
        return 0.0
    observed, expected = counts[p > 0], total * p[p > 0]
    order = np.argsort(expected, kind="stable")
    observed, expected = observed[order], expected[order]
    small = int(np.count_nonzero(expected < 5))
    if small:
        # Pool the small bins, and keep adding the next smallest until the pool itself expects >= 5.
        cut = max(small, int(np.searchsorted(np.cumsum(expected), 5.0)) + 1)
        observed = np.concatenate([[observed[:cut].sum()], observed[cut:]])
        expected = np.concatenate([[expected[:cut].sum()], expected[cut:]])
    if observed.size < 2:
        return 1.0
    return float(chisquare(observed, expected).pvalue)
