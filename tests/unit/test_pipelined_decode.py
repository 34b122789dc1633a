"""The generation loop with several steps of one session in flight (pipelined speculation).

A scripted target answers from the tokens it holds, rewinds included, so a loop that feeds or rewinds
the wrong positions produces other tokens; outputs must equal plain decoding at every depth.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from scipy.stats import chisquare

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import Draft, NGramDrafter
from agent.sampling.distribution import SparseDistribution
from agent.sampling.keyed import PositionNoise
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import VOCAB, ScriptedTarget, dist_at, next_greedy, plain_greedy


class AlwaysDrafter:
    """Drafts the same token K times, believed fully: every continuation is sent."""

    blocking = False
    drafts_cheaply = True
    stops_on_belief = False

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return Draft([0] * k, evidence=None)

    def commit(self, context_len_kept: int) -> None:
        pass

    def reset(self) -> None:
        pass


class NoisyOracleDrafter(AlwaysDrafter):
    """Drafts the scripted model's own continuation, wrong at every fifth position."""

    def propose(self, context: Sequence[int], k: int) -> Draft:
        known = list(context)
        for _ in range(k):
            known.append((next_greedy(known) + (1 if len(known) % 5 == 0 else 0)) % VOCAB)
        return Draft(known[len(context) :], evidence=None)


def _run(
    target: ScriptedTarget,
    prompt: list[int],
    n: int,
    params: SamplingParams,
    drafter: object | None,
    depth: int,
    stats: DecodeStats | None = None,
    continue_above: float = 0.0,
    fixed_k: int | None = None,
) -> list[int]:
    async def go() -> list[int]:
        k_policy = AdaptiveK(k_max=6, k_initial=3, fixed=fixed_k)
        return [
            t
            async for t in decode(
                target,
                prompt,
                max_tokens=n,
                stop_ids=frozenset(),
                params=params,
                context_tokens=4096,
                drafter=drafter,  # type: ignore[arg-type]
                k_policy=k_policy,
                depth=depth,
                stats=stats,
                continue_above=continue_above,
            )
        ]

    return asyncio.run(go())


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("drafter", ["ngram", "oracle"])
def test_greedy_tokens_equal_plain_decoding_at_every_depth(depth: int, drafter: str) -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    target = ScriptedTarget()
    stats = DecodeStats()
    made = NGramDrafter() if drafter == "ngram" else NoisyOracleDrafter()
    out = _run(target, prompt, 150, SamplingParams(), made, depth, stats)
    assert out == plain_greedy(prompt, 150)
    assert 0 < stats.accepted < stats.drafted  # drafts were both kept and rejected
    # as deep as allowed; steps voided by a rejection may still be on their way while new ones go out
    assert depth <= target.max_in_flight <= 2 * depth - 1
    assert len(target.held) >= len(prompt) + 149  # every kept token is held; the last one was never fed


def test_continuations_wait_for_enough_belief() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    target = ScriptedTarget()
    out = _run(target, prompt, 60, SamplingParams(), AlwaysDrafter(), depth=3, continue_above=1.01)
    assert out == plain_greedy(prompt, 60)
    assert target.max_in_flight == 1


@pytest.mark.parametrize("depth", [1, 3])
def test_sampled_tokens_follow_the_target_when_pipelined(depth: int) -> None:
    """Drafts of token 0 are judged against the distribution of their own position: a loop that judges a
    continuation's first draft with the wrong answer row mixes the two alternating distributions up."""
    counts = {0: np.zeros(VOCAB), 1: np.zeros(VOCAB)}
    prompt = [5, 5, 5]
    for seed in range(60):
        target = ScriptedTarget(sampled=True)
        out = _run(target, prompt, 60, SamplingParams(temperature=1.0, seed=seed), AlwaysDrafter(), depth)
        for i, token in enumerate(out):
            counts[(len(prompt) + i) % 2][token] += 1
    for parity, observed in counts.items():
        expected = dist_at(parity) * observed.sum()
        assert chisquare(observed, expected).pvalue > 1e-4, (parity, observed)


def test_the_first_step_after_the_prompt_is_not_timed() -> None:
    flags: list[bool] = []

    class SpyK(AdaptiveK):
        def record(self, *args: object, timed: bool = True, **kwargs: object) -> None:
            flags.append(timed)
            super().record(*args, timed=timed, **kwargs)  # type: ignore[arg-type]

    async def go() -> list[int]:
        return [
            t
            async for t in decode(
                ScriptedTarget(),
                [1, 2, 3, 1, 2],
                max_tokens=20,
                stop_ids=frozenset(),
                params=SamplingParams(),
                context_tokens=4096,
                drafter=NGramDrafter(),
                k_policy=SpyK(),
            )
        ]

    asyncio.run(go())
    assert flags[0] is False and all(flags[1:]) and len(flags) > 3


def _draftdist_at(position: int) -> np.ndarray:
    """A draft that gives token 0 half its mass at odd positions (the target: 12/78) and 0.2 at even ones."""
    q = np.empty(VOCAB)
    q[0] = 0.5 if position % 2 else 0.2
    q[1:] = (1.0 - q[0]) / (VOCAB - 1)
    return q


class SampledBeliefDrafter(AlwaysDrafter):
    """Samples each token from ``_draft_dist_at`` and stops where its chances run low, the way
    ``ModelDrafter`` does: on the product of its top probabilities, known before each draw. With
    ``stop_on_drawn`` it stops instead on the probability of the token it drew (dropping that token),
    which makes whether a token is sent depend on the token (it biased the classic acceptance rule)."""

    drafts_cheaply = False
    stops_on_belief = True

    def __init__(self, seed: int, stop_on_drawn: bool = False) -> None:
        self._noise = PositionNoise(seed + 1)  # draws of its own, not the head's (no coupling)
        self._stop_on_drawn = stop_on_drawn

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        tokens: list[int] = []
        dists: list[SparseDistribution] = []
        belief = 1.0
        for i in range(k):
            q = _draftdist_at(len(context) + i)
            dist = SparseDistribution.from_probs(q)
            if not self._stop_on_drawn:
                belief *= float(q.max())
                if belief < 0.3:
                    break
            token = self._noise.sample(dist, len(context) + i)
            if self._stop_on_drawn:
                belief *= float(q[token])
                if belief < 0.3:
                    break
            tokens.append(token)
            dists.append(dist)
        return Draft(tokens, dists)


@pytest.mark.parametrize("on_drawn", [False, True])
def test_belief_stopped_sampled_drafts_keep_the_target_distribution(on_drawn: bool) -> None:
    """Drafts cut by the draft's own chances, through the whole loop: emitted tokens follow the target,
    whether the stop is decided before each draw or on the drawn token. (The classic acceptance rule was
    biased by the second; the keyed rule emits the target's own draws, whatever was drafted.) K is fixed:
    the adaptive K follows measured step times, and the test must not."""
    counts = {0: np.zeros(VOCAB), 1: np.zeros(VOCAB)}
    prompt = [5, 5, 5]
    stats = DecodeStats()
    for seed in range(80):
        target = ScriptedTarget(sampled=True)
        drafter = SampledBeliefDrafter(seed, stop_on_drawn=on_drawn)
        out = _run(
            target, prompt, 60, SamplingParams(temperature=1.0, seed=seed), drafter, depth=1, stats=stats, fixed_k=4
        )
        for i, token in enumerate(out):
            counts[(len(prompt) + i) % 2][token] += 1
    pvalues = [chisquare(observed, dist_at(parity) * observed.sum()).pvalue for parity, observed in counts.items()]
    assert stats.drafted > 500 and 0 < stats.accepted < stats.drafted  # drafts went out and were judged
    print(f"\ndrafted {stats.drafted}, accepted {stats.accepted}, p-values {pvalues}")
    assert min(pvalues) > 1e-4, pvalues
