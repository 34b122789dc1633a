"""Acceptance rules for speculative decoding: which drafted tokens to keep, and the token after them.

The head drafts ``x_1..x_K``; one frame carries the K+1 positions through the ring, and the last stage
returns the target model's choice (greedy) or distribution (sampled) after each prefix:
``p_1`` after the context, ``p_i`` after ``x_1..x_{i-1}``, and ``p_{K+1}`` after all drafts.

Greedy: keep the longest prefix where the draft equals the target's argmax, then emit the target's
argmax at the first mismatch (or after the last draft). Every emitted token is the target's argmax
given the tokens before it, so the output is token-identical to non-speculative greedy decoding.

Sampled: the target's token at each position is its keyed draw there (``agent.sampling.keyed``: Gumbel-max
with noise fixed by the seed, the position and the token id), and a drafted token is kept exactly when it
equals that draw; at the first that does not, the draw is emitted instead and the step ends. So every
emitted token is the draw plain decoding makes at its position, distributed exactly as ``p`` given the
tokens before it: the drafter, K, and how positions were grouped into steps change how many tokens one
step yields, never which. (This replaces the classic rule of Leviathan et al. 2023, keep with probability
``min(1, p(x)/q(x))`` and redraw from the residual, which is just as exact in distribution but whose
tokens depend on how many uniforms earlier steps consumed: the same seed gave different texts with
different drafters.) A draft model that draws its guesses with the same noise guesses the target's
token wherever its distribution is close to the target's, so it loses little acceptance to the classic
rule; the draft distributions are not needed to judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.sampling.distribution import SparseDistribution
from agent.sampling.keyed import PositionNoise


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
    target_dists: Sequence[SparseDistribution],
    noise: PositionNoise,
    start: int,
    *,
    bonus: bool = True,
) -> Verdict:
    """Keep drafts while each equals the target's keyed draw at its position (``start`` is the first
    draft's); then emit that draw. ``target_dists`` has ``len(draft) + 1`` entries.

    ``bonus=False``: when every draft is kept, draw no token after them (more drafts follow in flight).
    """
    if len(target_dists) != len(draft) + 1:
        raise ValueError(
            f"{len(draft)} drafted tokens need {len(draft) + 1} target distributions, got {len(target_dists)}"
        )
    tokens: list[int] = []
    for i, token in enumerate(draft):
        drawn = noise.sample(target_dists[i], start + i)
        if _keeps(int(token), drawn, target_dists[i]):
            tokens.append(int(token))
            continue
        tokens.append(drawn)
        return Verdict(i, tokens)
    if bonus:
        tokens.append(noise.sample(target_dists[len(draft)], start + len(draft)))
    return Verdict(len(draft), tokens)


def _keeps(draft: int, drawn: int, target: SparseDistribution) -> bool:
    """Whether a drafted token stands: it is the target's own draw at its position."""
    return draft == drawn
