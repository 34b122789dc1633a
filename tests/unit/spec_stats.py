"""Statistical checks that a speculative verifier emits tokens from the target distribution.

Reusable with real model distributions: pass the dense target distributions ``p_1..p_{K+1}`` and the
draft's ``q_1..q_K`` (or fixed draft tokens for a deterministic drafter), then compare the histograms
with ``chi_square_pvalue``. The targets are taken as context-independent, so the second emitted token,
given the first draft was accepted, must follow ``p_2`` (acceptance of the first token depends only on
its own draws).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import chisquare

from agent.head.speculative import Verdict
from agent.sampling.distribution import SparseDistribution

VerifyFn = Callable[
    [Sequence[int], Sequence[SparseDistribution] | None, Sequence[SparseDistribution], np.random.Generator],
    Verdict,
]


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

    ``p``: K+1 dense target distributions. ``q``: K dense draft distributions the drafts are sampled
    from, or None for a deterministic drafter that always drafts ``draft_tokens`` (verified with
    ``draft_dists=None``). Returns two ``[vocab]`` count arrays.
    """
    vocab = len(p[0])
    k = len(p) - 1
    rng = np.random.default_rng(seed)
    targets = [SparseDistribution.from_probs(pi) for pi in p]
    if q is None:
        if draft_tokens is None or len(draft_tokens) != k:
            raise ValueError(f"a deterministic drafter needs {k} draft tokens")
        drafts = np.tile(np.asarray(draft_tokens, dtype=np.int64), (n, 1))
        draft_dists = None
    else:
        if len(q) != k:
            raise ValueError(f"{k + 1} target distributions need {k} draft distributions")
        draft_dists = [SparseDistribution.from_probs(qi) for qi in q]
        # Sample from the float32 support actually handed to the verifier, so q(x) > 0 for every draft.
        drafts = np.stack(
            [rng.choice(d.ids, size=n, p=d.probs / d.probs.sum(dtype=np.float64)) for d in draft_dists], axis=1
        ).reshape(n, k)
    first = np.zeros(vocab, dtype=np.int64)
    second = np.zeros(vocab, dtype=np.int64)
    for row in drafts:
        verdict = verify(row.tolist(), draft_dists, targets, rng)
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
