"""The head's generation loop: speculative decoding over any :class:`~agent.head.targets.Target`.

Each step feeds the last emitted token plus K drafted ones (K+1 positions in one frame), and the
target answers at every position. The longest agreeing prefix is kept (greedy), or the
Leviathan/Chen accept/reject rule decides (sampling); the rejected positions are rewound by the
next step's ``rewind`` count, so no extra round trip is spent on it. With no drafter (or K = 0)
this is plain autoregressive decoding.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from agent.head.adaptive_k import AdaptiveK
from agent.head.drafters import Draft, Drafter
from agent.head.generate import check_prompt
from agent.head.sampling import SamplingParams
from agent.head.speculative import Verdict, verify_greedy, verify_sampled
from agent.head.targets import Target
from agent.runtime.readout import StepOutput


@dataclass
class DecodeStats:
    """What one generation did: steps, drafting, acceptance, the K chosen, where time went."""

    steps: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    k_chosen: list[int] = field(default_factory=list)
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    first_token_seconds: float = 0.0

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def median_k(self) -> float:
        return float(np.median(self.k_chosen)) if self.k_chosen else 0.0


async def decode(
    target: Target,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    stop_ids: frozenset[int],
    params: SamplingParams,
    context_tokens: int,
    drafter: Drafter | None = None,
    k_policy: AdaptiveK | None = None,
    executor: Executor | None = None,
    stats: DecodeStats | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> AsyncIterator[int]:
    """Yield completion tokens; stops at a stop token (not yielded) or after ``max_tokens``."""
    check_prompt(prompt_ids, max_tokens, context_tokens)
    stats = stats if stats is not None else DecodeStats()
    policy = k_policy or AdaptiveK()
    rng = np.random.default_rng(params.seed)
    loop = asyncio.get_running_loop()
    context = list(prompt_ids)

    started = clock()
    first = await target.step(context, 0, last_only=True)
    stats.target_seconds += clock() - started
    stats.first_token_seconds = clock() - started
    new_tokens = [_pick(first, rng, params)]
    rewind = 0
    produced = 0  # not stats.tokens: one stats object may add up several generations
    while True:
        for token in new_tokens:
            if token in stop_ids:
                return
            context.append(token)
            produced += 1
            stats.tokens += 1
            yield token
            if produced >= max_tokens:
                return
        room = max(min(max_tokens - produced - 1, context_tokens - len(context) - 1), 0)
        started = clock()
        draft, k = Draft([]), None
        if drafter is not None and drafter.drafts_cheaply:
            # Look up the longest usable draft, then let its evidence decide how much of it to send.
            draft = drafter.propose(context, min(policy.k_max, room))
            if draft.tokens:
                k = policy.choose(draft.evidence)
                draft = draft.truncated(k)
        elif drafter is not None and (k := min(policy.choose(), room)) > 0:
            if drafter.blocking:
                draft = await loop.run_in_executor(executor, drafter.propose, list(context), k)
            else:
                draft = drafter.propose(context, k)
        drafted_at = clock()
        output = await target.step([context[-1], *draft.tokens], rewind, last_only=False)
        done = clock()
        verdict = _verify(draft, output, rng, params)
        rewind = len(draft.tokens) - verdict.accepted
        if drafter is not None:
            drafter.commit(len(context) + verdict.accepted)
            policy.record(len(draft.tokens), verdict.accepted, done - started, drafted_at - started, draft.evidence)
        stats.steps += 1
        stats.drafted += len(draft.tokens)
        stats.accepted += verdict.accepted
        if k is not None:
            stats.k_chosen.append(k)
        stats.draft_seconds += drafted_at - started
        stats.target_seconds += done - drafted_at
        new_tokens = verdict.tokens


def _pick(output: StepOutput, rng: np.random.Generator, params: SamplingParams) -> int:
    if output.top1 is not None:
        return int(output.top1[-1])
    assert output.dists is not None
    return output.dists[-1].sample(rng)


def _verify(draft: Draft, output: StepOutput, rng: np.random.Generator, params: SamplingParams) -> Verdict:
    if output.positions != len(draft.tokens) + 1:
        from agent.errors import SessionFailedError

        raise SessionFailedError(f"the target answered {output.positions} positions for {len(draft.tokens) + 1}")
    if output.top1 is not None:
        return verify_greedy(draft.tokens, [int(t) for t in output.top1])
    assert output.dists is not None
    return verify_sampled(draft.tokens, draft.dists, output.dists, rng)
