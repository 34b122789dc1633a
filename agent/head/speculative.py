"""Acceptance rules for speculative decoding: which drafted tokens to keep, and the token after them.

The head drafts ``x_1..x_K``; one frame carries the K+1 positions through the ring, and the last stage
returns the target model's choice (greedy) or distribution (sampled) after each prefix:
``p_1`` after the context, ``p_i`` after ``x_1..x_{i-1}``, and ``p_{K+1}`` after all drafts.

Greedy: keep the longest prefix where the draft equals the target's argmax, then emit the target's
argmax at the first mismatch (or after the last draft). Every emitted token is the target's argmax
given the tokens before it, so the output is token-identical to non-speculative greedy decoding.

Sampled (Leviathan et al. 2023, Chen et al. 2023): the draft token ``x ~ q`` is accepted with
probability ``min(1, p(x)/q(x))``; on rejection a replacement is drawn from the residual
``r = max(0, p - q) / Z`` and the step ends. Why the emitted token is distributed exactly as ``p``::

    P(emit y) = q(y) min(1, p(y)/q(y))  +  P(reject) r(y)
              = min(p(y), q(y))         +  (1 - sum_z min(p(z), q(z))) max(0, p(y) - q(y)) / Z

and ``Z = sum_z max(0, p(z) - q(z)) = 1 - sum_z min(p(z), q(z))`` (both sum to 1), so the second term is
``max(0, p(y) - q(y))`` and ``P(emit y) = min(p, q)(y) + max(0, p - q)(y) = p(y)``.
An accepted token is the token the target would have produced at that position, so the next position
is judged against ``p`` conditioned on the same prefix the target would have seen; by induction every
emitted token follows the target's distribution given the tokens before it. When all K drafts are
accepted the bonus token is drawn from ``p_{K+1}`` directly. The draft distribution only changes how
many tokens one step yields, never what distribution they come from.

A deterministic drafter (n-gram lookup) has ``q`` one-hot on its token ``x``: accept with probability
``p(x)``, otherwise draw from ``p`` with ``x`` removed and renormalised; the proof above applies as is.
``Z = 0`` means ``p <= q`` everywhere, i.e. ``p == q``, where rejection has probability zero; should
rounding reject anyway, the residual is meaningless and we draw from ``p`` itself.

Distributions from the wire sum to 1 only within 1e-3, so ``p`` and ``q`` are renormalised here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.sampling.distribution import SparseDistribution, draw

# Residual mass at or below this is rounding noise (p == q up to float32): draw from p instead.
_MIN_RESIDUAL = 1e-9


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens were kept
    tokens: list[int]  # the tokens to emit this step: the accepted drafts, then one token from the target


def verify_greedy(draft: Sequence[int], target_top1: Sequence[int], *, bonus: bool = True) -> Verdict:
    """Keep drafts while they equal the target's argmax; ``target_top1`` has ``len(draft) + 1`` entries.

    ``bonus=False``: when every draft is kept, emit no token after them (more drafts follow in flight,
    judged by the last entry).
    """
    if len(target_top1) != len(draft) + 1:
        raise ValueError(f"{len(draft)} drafted tokens need {len(draft) + 1} target tokens, got {len(target_top1)}")
    accepted = 0
    while accepted < len(draft) and int(draft[accepted]) == int(target_top1[accepted]):
        accepted += 1
    emitted = accepted + 1 if bonus or accepted < len(draft) else accepted
    return Verdict(accepted, [int(t) for t in target_top1[:emitted]])


def verify_sampled(
    draft: Sequence[int],
    draft_dists: Sequence[SparseDistribution] | None,
    target_dists: Sequence[SparseDistribution],
    rng: np.random.Generator,
    *,
    bonus: bool = True,
) -> Verdict:
    """Speculative sampling; ``draft_dists=None`` means a deterministic drafter (``q`` one-hot on the draft).

    ``bonus=False``: when every draft is kept, draw no token after them (more drafts follow in flight).
    """
    if len(target_dists) != len(draft) + 1:
        raise ValueError(
            f"{len(draft)} drafted tokens need {len(draft) + 1} target distributions, got {len(target_dists)}"
        )
    if draft_dists is not None and len(draft_dists) != len(draft):
        raise ValueError(f"{len(draft)} drafted tokens but {len(draft_dists)} draft distributions")
    tokens: list[int] = []
    for i, token in enumerate(draft):
        x = int(token)
        p = target_dists[i]
        q = None if draft_dists is None else draft_dists[i]
        px = p.prob(x) / _total(p)
        qx = 1.0 if q is None else q.prob(x) / _total(q)
        if qx <= 0:
            raise ValueError(f"draft token {x} at position {i} is outside its draft distribution's support")
        # One uniform per judged draft keeps the random stream a function of the seed and the inputs only.
        if rng.random() < _acceptance(px, qx):
            tokens.append(x)
            continue
        ids, weights = _residual(p, q, x)
        tokens.append(draw(ids, weights, rng))
        return Verdict(i, tokens)
    if bonus:
        tokens.append(target_dists[len(draft)].sample(rng))
    return Verdict(len(draft), tokens)


def _total(d: SparseDistribution) -> float:
    return float(d.probs.sum(dtype=np.float64))


def _acceptance(px: float, qx: float) -> float:
    """The probability of keeping a draft token: min(1, p(x)/q(x))."""
    return min(1.0, px / qx)


def _residual(p: SparseDistribution, q: SparseDistribution | None, x: int) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, weights)`` of norm(max(0, p - q)), unnormalised; it lives on p's support, so nothing is densified."""
    pw = p.probs.astype(np.float64) / _total(p)
    if q is None:
        weights = np.where(p.ids == x, 0.0, pw)
    else:
        # q evaluated on p's support: a binary search per entry instead of a vocabulary-sized array.
        at = np.minimum(np.searchsorted(q.ids, p.ids), q.ids.size - 1)
        qw = np.where(q.ids[at] == p.ids, q.probs[at].astype(np.float64), 0.0) / _total(q)
        weights = np.maximum(pw - qw, 0.0)
    if weights.sum() <= _MIN_RESIDUAL:
        weights = pw
    return p.ids, weights
