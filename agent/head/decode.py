"""The head's generation loop: speculative decoding over any :class:`~agent.head.targets.Target`.

Each step feeds the last emitted token plus K drafted ones (K+1 positions in one frame), and the
target answers at every position. The longest agreeing prefix is kept (greedy), or the
Leviathan/Chen accept/reject rule decides (sampling); the rejected positions are rewound by the
next step's ``rewind`` count, so no extra round trip is spent on it. With no drafter (or K = 0)
this is plain autoregressive decoding.

Pipelined speculation (``depth`` > 1): while a step is on its way, the loop may draft on past its
unjudged drafts and send the continuation right behind it, so that on a ring one stage verifies the
first piece while the one before it computes the next. Judging is unchanged: a continuation's first
draft is judged by the last answer of the step before it, so the pieces together are judged exactly as
one long step would be, and a continuation behind a rejected draft is void (rewound with the next step,
its answer ignored). The target says how deep is useful (``Target.useful_depth``): a ring that other
sessions already keep busy gains nothing from it and pays for every void step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from agent.head.adaptive_k import AdaptiveK
from agent.head.drafters import Draft, Drafter, HybridDrafter
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
    continued: int = 0
    """Steps sent behind an unjudged one (pipelined speculation)."""
    voided: int = 0
    """Of those, steps an earlier rejection made void (their positions were computed for nothing)."""

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def median_k(self) -> float:
        return float(np.median(self.k_chosen)) if self.k_chosen else 0.0


@dataclass
class _InFlight:
    """A step sent around the ring and not judged yet."""

    answer: asyncio.Future[StepOutput]
    draft: Draft
    leads: bool  # it feeds the last emitted token before its drafts (else it continues the step before it)
    k: int | None
    started: float
    drafted_at: float


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
    depth: int = 1,
    continue_above: float = 0.7,
    turn: asyncio.Lock | None = None,
    belief_stop: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> AsyncIterator[int]:
    """Yield completion tokens; stops at a stop token (not yielded) or after ``max_tokens``.

    ``depth``: steps of this session in flight at once. Above 1, while a step's drafts are being
    verified the loop drafts on past them (assuming they will be kept) and sends the continuation
    right behind, when the drafter's acceptance estimate for it is at least ``continue_above``; the
    stages then work on consecutive pieces of one long draft at the same time, and a continuation
    voided by an earlier rejection is rewound with the next step. Outputs are the same at every depth.

    ``turn``: one lock shared by the sessions of one head. A step's local work (drafting, then the
    head's own stages inside ``target.submit``) is done holding it, so sessions take whole turns on
    the head's core instead of interleaving their jobs on its executor: otherwise a session whose
    answer came first waits for another's draft before it may run its stage 0.

    ``belief_stop``: a draft model (``drafter.stops_on_belief``) drafts until its own chance that all
    its tokens are kept falls below what one more position costs (``AdaptiveK.belief_floor``), rather
    than a fixed K per step; the K controller still decides whether to draft at all.
    """
    check_prompt(prompt_ids, max_tokens, context_tokens)
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    stats = stats if stats is not None else DecodeStats()
    policy = k_policy or AdaptiveK()
    rng = np.random.default_rng(params.seed)
    loop = asyncio.get_running_loop()
    context = list(prompt_ids)
    hold = turn if turn is not None else contextlib.nullcontext()
    by_belief = drafter is not None and drafter.stops_on_belief and belief_stop

    def model_limit(evidence: int | None) -> int:
        """The most a draft model may draft for ``evidence``. A model that stops on its own chances may
        stretch a draft to twice the K controller's best K (+1) where its chances carry it: bounded by
        the measured acceptance, so that a model whose confidence means little (a truncated self-draft)
        cannot spend long drafts; where drafting does not pay, the controller's K (0, or 1 on an
        exploration step) holds."""
        best = policy.best_k(evidence)
        if by_belief and best > 0:
            return min(policy.k_max, 2 * best + 1)
        return policy.choose(evidence)

    async def draft_after(known: list[int], room: int, threshold: float | None) -> tuple[Draft, int | None]:
        """Draft at most ``room`` tokens after ``known``; with a ``threshold``, only drafts believed that much."""
        if drafter is None:
            return Draft([]), None
        longest = min(policy.k_max, max(room, 0))
        if drafter.drafts_cheaply:
            # Look up the longest usable draft, then let its evidence decide how much of it to send.
            if isinstance(drafter, HybridDrafter):  # a lookup that may fall back on a model, sized by the loop
                floor = policy.belief_floor(drafter.MODEL_EVIDENCE) if by_belief else 0.0
                draft = await loop.run_in_executor(executor, drafter.propose_sized, list(known), longest,
                                                   model_limit, floor)
            else:
                draft = drafter.propose(known, longest)
            if not draft.tokens or (threshold is not None and policy.alpha_for(draft.evidence) < threshold):
                return Draft([]), None
            if by_belief and isinstance(drafter, HybridDrafter) and draft.evidence == drafter.MODEL_EVIDENCE:
                return draft, len(draft.tokens)  # the model has cut it where its chances ran out
            k = policy.choose(draft.evidence)
            return draft.truncated(k), k
        if threshold is not None and policy.alpha < threshold:
            return Draft([]), None
        k = min(model_limit(None), longest)
        if k <= 0:
            return Draft([]), k
        if by_belief:
            draft = await loop.run_in_executor(executor, drafter.propose, list(known), k,  # type: ignore[call-arg]
                                               policy.belief_floor())
            return draft, len(draft.tokens)
        if drafter.blocking:
            return await loop.run_in_executor(executor, drafter.propose, list(known), k), k
        return drafter.propose(known, k), k

    started = clock()
    async with hold:
        prefill = await target.submit(context, 0, last_only=True)
    first = await prefill
    stats.target_seconds += clock() - started
    stats.first_token_seconds = clock() - started
    new_tokens = [_pick(first, rng, params)]
    rewind = 0
    produced = 0  # not stats.tokens: one stats object may add up several generations
    judged_steps = 0
    in_flight: deque[_InFlight] = deque()
    carry: StepOutput | None = None  # the answer at the last position judged: it judges the next step's first draft
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
        # Room for drafts: every in-flight draft and one more token must fit the budget and the context.
        room = min(max_tokens - produced, context_tokens - len(context)) - 1
        if not in_flight:
            async with hold:
                begun = clock()
                draft, k = await draft_after(context, room, None)
                drafted_at = clock()
                answer = await target.submit([context[-1], *draft.tokens], rewind, last_only=False)
            in_flight.append(_InFlight(answer, draft, True, k, begun, drafted_at))
            rewind = 0
        while len(in_flight) < depth and len(in_flight) < target.useful_depth():
            ahead = [t for sent in in_flight for t in sent.draft.tokens]
            if not in_flight[-1].draft.tokens or len(ahead) >= room:
                break
            async with hold:
                begun = clock()
                draft, k = await draft_after(context + ahead, room - len(ahead), continue_above)
                if not draft.tokens:
                    break
                drafted_at = clock()
                answer = await target.submit(list(draft.tokens), 0, last_only=False)
            in_flight.append(_InFlight(answer, draft, False, k, begun, drafted_at))
            stats.continued += 1

        step = in_flight.popleft()
        output = await step.answer
        done = clock()
        judged = output
        if not step.leads:
            assert carry is not None  # a continuation always follows a judged step
            judged = output.after(carry)
        verdict = _verify(step.draft, judged, rng, params, bonus=not in_flight)
        rejected = len(step.draft.tokens) - verdict.accepted
        if rejected:
            # Everything fed after the first rejected draft is void: this step's rest and every step behind it.
            rewind = rejected + sum(len(s.draft.tokens) for s in in_flight)
            stats.voided += len(in_flight)
            in_flight.clear()
        carry = output.last() if in_flight else None
        if drafter is not None:
            drafter.commit(len(context) + verdict.accepted)
            policy.record(len(step.draft.tokens), verdict.accepted, done - step.started,
                          step.drafted_at - step.started, step.draft.evidence, timed=judged_steps > 0)
        judged_steps += 1
        stats.steps += 1
        stats.drafted += len(step.draft.tokens)
        stats.accepted += verdict.accepted
        if step.k is not None:
            stats.k_chosen.append(step.k)
        stats.draft_seconds += step.drafted_at - step.started
        stats.target_seconds += done - step.drafted_at
        new_tokens = verdict.tokens


def _pick(output: StepOutput, rng: np.random.Generator, params: SamplingParams) -> int:
    if output.top1 is not None:
        return int(output.top1[-1])
    assert output.dists is not None
    return output.dists[-1].sample(rng)


def _verify(draft: Draft, output: StepOutput, rng: np.random.Generator, params: SamplingParams, *,
            bonus: bool) -> Verdict:
    if output.positions != len(draft.tokens) + 1:
        from agent.errors import SessionFailedError

        raise SessionFailedError(f"the target answered {output.positions} positions for {len(draft.tokens) + 1}")
    if output.top1 is not None:
        return verify_greedy(draft.tokens, [int(t) for t in output.top1], bonus=bonus)
    assert output.dists is not None
    return verify_sampled(draft.tokens, draft.dists, output.dists, rng, bonus=bonus)
