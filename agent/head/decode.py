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

Drafting ahead (``draft_ahead``, greedy, a drafter that runs a model): while a step is answered on
other PCs the head's core has nothing to do, so the loop asks the drafter what it expects the answer to
end with (the token after the last draft) and what it would draft after that. When the answer keeps
every draft and ends with that token, the next step's draft is ready and the step goes out at once;
otherwise the guess is dropped. Nothing is sent on a guess, so outputs cannot change. Opt-in: on the
benchmark's answer about a quarter of the guesses held, and the wasted drafting cost more than the
confirmed ones saved (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import check_prompt
from agent.head.drafters import BeliefDrafter, Draft, Drafter, HybridDrafter
from agent.head.speculative import Verdict, verify_greedy, verify_sampled
from agent.head.targets import Target
from agent.head.turn import HeadTurn
from agent.sampling.keyed import PositionNoise
from agent.sampling.logprobs import TokenScore
from agent.sampling.params import SamplingParams
from agent.sampling.readout import StepOutput


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
    drafted_ahead: int = 0
    """Drafts made ahead, while a step was answered elsewhere."""
    ahead_used: int = 0
    """Of those, drafts the answer confirmed and the next step sent as drafted."""

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
    turn: HeadTurn | asyncio.Lock | None = None,
    belief_stop: bool = True,
    draft_ahead: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    scores: list[TokenScore] | None = None,
) -> AsyncGenerator[int, None]:
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

    ``draft_ahead``: with a greedy drafter that runs a model and a target that answers on other PCs
    (``Target.answers_elsewhere``), draft the next step while this one is answered (module docstring).
    The drafting holds ``turn`` like any other local work, so it fills the head's idle time; with a
    :class:`~agent.head.turn.HeadTurn` it also stops between tokens once another session waits for it.

    ``scores``: for a target read out with log-probabilities (``params.logprobs``), each token's
    :class:`~agent.sampling.logprobs.TokenScore` is appended to it just before the token is yielded.
    """
    check_prompt(prompt_ids, max_tokens, context_tokens)
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    stats = stats if stats is not None else DecodeStats()
    noise = PositionNoise(params.seed)  # draws keyed by position: the same seed, the same text (keyed.py)
    hold = turn if turn is not None else contextlib.nullcontext()
    policy = k_policy or AdaptiveK()
    drafting = _Drafting(
        drafter, policy, executor, turn, drafter is not None and drafter.stops_on_belief and belief_stop
    )
    steps = _Steps(target, drafting, hold, clock, stats, noise, params, list(prompt_ids))
    ahead_possible = (
        draft_ahead and drafter is not None and drafter.blocking and params.greedy and target.answers_elsewhere()
    )

    started = clock()
    async with hold:
        prefill = await target.submit(steps.context, 0, last_only=True)
    first = await prefill
    stats.target_seconds += clock() - started
    stats.first_token_seconds = clock() - started
    new_tokens = [_pick(first, noise, len(steps.context))]
    new_scores = [first.score(0, new_tokens[0], params)]
    produced = 0  # not stats.tokens: one stats object may add up several generations
    ahead: _DraftAhead | None = None  # a draft being made while the step in flight is answered
    try:
        while True:
            for token, score in zip(new_tokens, new_scores, strict=True):
                if token in stop_ids:
                    return
                if scores is not None and score is not None:
                    scores.append(score)
                steps.context.append(token)
                produced += 1
                stats.tokens += 1
                yield token
                if produced >= max_tokens:
                    return
            # Room for drafts: every in-flight draft and one more token must fit the budget and the context.
            room = min(max_tokens - produced, context_tokens - len(steps.context)) - 1
            await steps.send(room, depth, continue_above)
            if ahead_possible and len(steps.in_flight) == 1 and steps.in_flight[0].draft.tokens:
                ahead = steps.draft_ahead(room)
            step = steps.in_flight.popleft()
            output = await step.answer
            # A draft still being made is waited for (its thread cannot be stopped, and it may be right).
            guess = await ahead.finish() if ahead is not None else None
            ahead_seconds = ahead.seconds if ahead is not None else 0.0
            ahead = None
            new_tokens, new_scores = steps.judge(step, output, guess, ahead_seconds)
    finally:
        if ahead is not None:
            ahead.abandon()


@dataclass
class _Drafting:
    """How the loop drafts: the drafter's proposals, sized by the K controller (and, for a draft model that
    stops on its own chances, by its belief: ``by_belief``)."""

    drafter: Drafter | None
    policy: AdaptiveK
    executor: Executor | None
    turn: HeadTurn | asyncio.Lock | None
    by_belief: bool

    def model_limit(self, evidence: int | None) -> int:
        """The most a draft model may draft for ``evidence``. A model that stops on its own chances may
        stretch a draft to twice the K controller's best K (+1) where its chances carry it: bounded by
        the measured acceptance, so that a model whose confidence means little (a truncated self-draft)
        cannot spend long drafts; where drafting does not pay, the controller's K (0, or 1 on an
        exploration step) holds."""
        best = self.policy.best_k(evidence)
        if self.by_belief and best > 0:
            return min(self.policy.k_max, 2 * best + 1)
        return self.policy.choose(evidence)

    async def after(
        self, known: list[int], room: int, threshold: float | None, lead: int = 0
    ) -> tuple[Draft, int | None]:
        """Draft at most ``room`` tokens after ``known``; with a ``threshold``, only drafts believed that much.

        ``lead``: tokens drafted before the draft proper and not counted in its K (drafting ahead: the
        guess at the token the answer in flight ends with). A draft with a lead is made ahead, so it
        stops as soon as a session waits for the head's turn."""
        drafter, policy, turn = self.drafter, self.policy, self.turn
        stop = (lambda: turn.wanted) if lead and isinstance(turn, HeadTurn) else None
        if drafter is None:
            return Draft([]), None
        loop = asyncio.get_running_loop()
        longest = min(policy.k_max, max(room, 0))
        if drafter.drafts_cheaply:
            # Look up the longest usable draft, then let its evidence decide how much of it to send.
            if isinstance(drafter, HybridDrafter):  # a lookup that may fall back on a model, sized by the loop
                floor = policy.belief_floor(drafter.MODEL_EVIDENCE) if self.by_belief else 0.0
                draft = await loop.run_in_executor(
                    self.executor,
                    drafter.propose_sized,
                    list(known),
                    longest + lead,
                    lambda evidence: self.model_limit(evidence) + lead,
                    floor,
                    stop,
                )
            else:
                draft = drafter.propose(known, longest + lead)
            if not draft.tokens or (threshold is not None and policy.alpha_for(draft.evidence) < threshold):
                return Draft([]), None
            if self.by_belief and isinstance(drafter, HybridDrafter) and draft.evidence == drafter.MODEL_EVIDENCE:
                return draft, len(draft.tokens) - lead  # the model has cut it where its chances ran out
            k = policy.choose(draft.evidence)
            return draft.truncated(k + lead), k
        if threshold is not None and policy.alpha < threshold:
            return Draft([]), None
        k = min(self.model_limit(None), longest)
        if k <= 0:
            return Draft([]), k
        if self.by_belief:
            believer = cast(BeliefDrafter, drafter)  # by_belief: drafter.stops_on_belief, so a BeliefDrafter
            draft = await loop.run_in_executor(
                self.executor, believer.propose, list(known), k + lead, policy.belief_floor(), stop
            )
            return draft, len(draft.tokens) - lead
        if drafter.blocking:
            return await loop.run_in_executor(self.executor, drafter.propose, list(known), k + lead), k
        return drafter.propose(known, k + lead), k


@dataclass
class _Steps:
    """The steps of one generation: those sent and not judged yet, and what judging them leaves for the next."""

    target: Target
    drafting: _Drafting
    hold: contextlib.AbstractAsyncContextManager[object]
    clock: Callable[[], float]
    stats: DecodeStats
    noise: PositionNoise
    params: SamplingParams
    context: list[int]
    """The prompt and every token emitted."""
    in_flight: deque[_InFlight] = field(default_factory=deque)
    rewind: int = 0
    """Positions the next leading step rewinds (the drafts the last judged step rejected, and all behind them)."""
    carry: StepOutput | None = None
    """The answer at the last position judged: it judges the next continuation's first draft."""
    ready: tuple[Draft, int | None, float] | None = None
    """A draft made ahead that the answer confirmed, and its drafting time."""
    judged_steps: int = 0

    async def send(self, room: int, depth: int, continue_above: float) -> None:
        """Send a leading step if none is in flight, then continuations behind it while ``depth`` and the
        target allow and the drafter believes in them (``continue_above``)."""
        target, clock = self.target, self.clock
        if not self.in_flight:
            async with self.hold:
                begun = clock()
                if self.ready is not None and room > 0:
                    # Timed as if drafted now: K is chosen by what drafting costs whenever a guess fails,
                    # and a confirmed guess must not make longer drafts look free.
                    draft, k, begun = self.ready[0].truncated(room), self.ready[1], begun - self.ready[2]
                else:
                    draft, k = await self.drafting.after(self.context, room, None)
                self.ready = None
                drafted_at = clock()
                answer = await target.submit([self.context[-1], *draft.tokens], self.rewind, last_only=False)
            self.in_flight.append(_InFlight(answer, draft, True, k, begun, drafted_at))
            self.rewind = 0
        while len(self.in_flight) < depth and len(self.in_flight) < target.useful_depth():
            ahead = [t for sent in self.in_flight for t in sent.draft.tokens]
            if not self.in_flight[-1].draft.tokens or len(ahead) >= room:
                break
            async with self.hold:
                begun = clock()
                draft, k = await self.drafting.after(self.context + ahead, room - len(ahead), continue_above)
                if not draft.tokens:
                    break
                drafted_at = clock()
                answer = await target.submit(list(draft.tokens), 0, last_only=False)
            self.in_flight.append(_InFlight(answer, draft, False, k, begun, drafted_at))
            self.stats.continued += 1

    def draft_ahead(self, room: int) -> _DraftAhead:
        """Start drafting the step after the one in flight, on a guess at the token its answer ends with."""
        sent = list(self.in_flight[0].draft.tokens)
        turn = self.drafting.turn
        spare = turn.spare() if isinstance(turn, HeadTurn) else self.hold
        draft_next = functools.partial(self.drafting.after, self.context + sent, room - len(sent) - 1, None, lead=1)
        return _DraftAhead.start(spare, self.clock, draft_next)

    def judge(
        self, step: _InFlight, output: StepOutput, guess: tuple[Draft, int | None] | None, ahead_seconds: float
    ) -> tuple[list[int], list[TokenScore | None]]:
        """Judge ``step`` by its ``output``: the tokens it emits and their scores. A rejection voids every step
        behind it; a ``guess`` drafted ahead that the answer confirms is kept for the next step."""
        stats, drafter, done = self.stats, self.drafting.drafter, self.clock()
        judged = output
        if not step.leads:
            assert self.carry is not None  # a continuation always follows a judged step
            judged = output.after(self.carry)
        # every token before this step's drafts is in the context: its first draft is at len(context)
        verdict = _verify(step.draft, judged, self.noise, len(self.context), bonus=not self.in_flight)
        rejected = len(step.draft.tokens) - verdict.accepted
        if rejected:
            # Everything fed after the first rejected draft is void: this step's rest and every step behind it.
            self.rewind = rejected + sum(len(s.draft.tokens) for s in self.in_flight)
            stats.voided += len(self.in_flight)
            self.in_flight.clear()
        self.carry = output.last() if self.in_flight else None
        if guess is not None and guess[0].tokens:
            stats.drafted_ahead += 1
            made, k_ahead = guess
            kept_all = not rejected and not self.in_flight
            if kept_all and len(made.tokens) > 1 and made.tokens[0] == verdict.tokens[-1]:
                # The drafter's cache already holds the guess and its continuation: no commit to cut it.
                self.ready = Draft(made.tokens[1:], None, made.evidence), k_ahead, ahead_seconds
                stats.ahead_used += 1
        if drafter is not None:
            if self.ready is None:
                drafter.commit(len(self.context) + verdict.accepted)
            self.drafting.policy.record(
                len(step.draft.tokens),
                verdict.accepted,
                done - step.started,
                step.drafted_at - step.started,
                step.draft.evidence,
                timed=self.judged_steps > 0,
            )
        self.judged_steps += 1
        stats.steps += 1
        stats.drafted += len(step.draft.tokens)
        stats.accepted += verdict.accepted
        if step.k is not None:
            stats.k_chosen.append(step.k)
        stats.draft_seconds += step.drafted_at - step.started
        stats.target_seconds += done - step.drafted_at
        # the tokens judged were chosen at the judged positions, in order
        return verdict.tokens, [judged.score(i, token, self.params) for i, token in enumerate(verdict.tokens)]


class _DraftAhead:
    """A draft made while a step is answered elsewhere; it takes the head's turn only once it is free."""

    def __init__(self) -> None:
        self.running = False
        self.seconds = 0.0
        """How long the drafting took once it had the turn."""
        self.task: asyncio.Task[tuple[Draft, int | None]] | None = None

    @classmethod
    def start(
        cls,
        hold: contextlib.AbstractAsyncContextManager[object],
        clock: Callable[[], float],
        drafting: Callable[[], Coroutine[object, object, tuple[Draft, int | None]]],
    ) -> _DraftAhead:
        ahead = cls()

        async def run() -> tuple[Draft, int | None]:
            async with hold:
                ahead.running = True
                began = clock()
                try:
                    return await drafting()
                finally:
                    ahead.seconds = clock() - began

        ahead.task = asyncio.get_running_loop().create_task(run())
        return ahead

    async def finish(self) -> tuple[Draft, int | None] | None:
        """The draft, once made; None when it had not begun (it is called off: the answer came first)."""
        assert self.task is not None
        if not self.running and not self.task.done():
            self.abandon()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            return None
        return await self.task

    def abandon(self) -> None:
        assert self.task is not None
        self.task.cancel()


def _pick(output: StepOutput, noise: PositionNoise, position: int) -> int:
    if output.top1 is not None:
        return int(output.top1[-1])
    assert output.dists is not None
    return noise.sample(output.dists[-1], position)


def _verify(draft: Draft, output: StepOutput, noise: PositionNoise, start: int, *, bonus: bool) -> Verdict:
    if output.positions != len(draft.tokens) + 1:
        from agent.errors import SessionFailedError

        raise SessionFailedError(f"the target answered {output.positions} positions for {len(draft.tokens) + 1}")
    if output.top1 is not None:
        return verify_greedy(draft.tokens, [int(t) for t in output.top1], bonus=bonus)
    assert output.dists is not None
    return verify_sampled(draft.tokens, output.dists, noise, start, bonus=bonus)
