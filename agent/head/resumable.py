"""A target session that a conversation's next turn continues instead of starting afresh.

A chat's second turn sends the whole conversation again: the first turn's prompt, the answer, the new
message. Its KV state for all but the new message is already on the stages, held by the session that
answered the first turn. :class:`ResumableTarget` records which token ids its session's state holds
(every position fed and not rewound, rejected drafts of the last step included: their state is the
state of those tokens), and on :meth:`ResumableTarget.resume` turns the next prompt into a rewind to
what it can reuse plus the positions after it. The generation loop is unchanged: it sends its prompt
as always, and only the rest is computed.

What it can reuse: the held positions whose numbers are those a fresh prompt of the same tokens gives
them, up to where the two prompts part (:meth:`ResumableTarget.reusable`); the rest is computed again as a
fresh prompt computes it, so the answer is a fresh session's wherever the stages rewind exactly
(``RuntimeConfig.rewind``). Which positions those are depends on what the stages compute alike however
positions are grouped into steps (``agent.runtime.repeatable``), and every answer says it
(``StepOutput.settled``):

- f32 stages: every position, the answer's too, so a next turn computes only the new message (and any
  part of the answer the chat template spells otherwise).
- one-thread stages below f32, which compute every prompt step on their paged compilation: the positions
  of prompt steps, so a next turn computes the last answer (decoding computed it a position at a time, on
  the other compilation) and the new message. Its first step is given at least two positions
  (``ALIKE_MIN_PROMPT``: a one-position prompt step takes other kernels).
- elsewhere (several threads below f32) a position's numbers depend on how positions were grouped into
  steps (one thread on the SDPA compilation, int4 default precision: a 40-position prompt sent as 39 + 1
  moves the last logits by up to 0.45 and changed a greedy answer). A fresh session computes a prompt in
  chunks cut at multiples of ``grid`` (``agent.head.prefill``), so only the whole chunks of the prompts
  this session was sent are reused, up to the last chunk boundary both prompts share.

It also logs the steps its session was answered, as they were sent (ids, rewind), so that a session lost
with its ring can be rebuilt on a fresh one by :meth:`ResumableTarget.replay_into`: the same steps, the
same cuts, hence the same rounding of every position (one prompt step in its place would round otherwise
below f32), sent back to back rather than one round trip each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from agent.head.prefill import PrefillWatcher, chunk_floor
from agent.head.targets import Target
from agent.runtime.repeatable import ALIKE_MIN_PROMPT
from agent.sampling.params import SamplingParams
from agent.sampling.readout import StepOutput


@dataclass
class _SentStep:
    """One step as it was sent; whether it was answered, and settled (the answer itself is not kept)."""

    ids: list[int]
    rewind: int
    last_only: bool
    answered: bool = False
    settled: bool = False
    """Its answer said every stage computed its positions as a fresh prompt would (``StepOutput.settled``)."""

    def note(self, answer: asyncio.Future[StepOutput]) -> None:
        self.answered = not answer.cancelled() and answer.exception() is None
        self.settled = self.answered and answer.result().settled


class ResumableTarget:
    """A :class:`~agent.head.targets.Target` that knows the token ids its state holds, and how it got them."""

    def __init__(self, inner: Target, params: SamplingParams, grid: int) -> None:
        """``params``: the sampling the session was opened with (the stages sample with it); ``grid``: the chunk
        size ``inner`` cuts prompts at (multiples of it; 0: a prompt is one step)."""
        self.inner = inner
        self.params = params
        self.grid = grid
        self.held: list[int] = []
        """Token ids the session's state holds, in order."""
        self._resuming = False
        self._whole = False
        self.reused = 0
        """Positions the last resumed prompt did not have to compute."""
        self._sent: list[_SentStep] = []

    def common_prefix(self, ids: Sequence[int]) -> int:
        """How many leading ``ids`` the state already holds (at most all but the last: the loop needs the
        readout at the prompt's last position, so that one is always computed)."""
        limit = min(len(self.held), len(ids) - 1)
        for i in range(limit):
            if self.held[i] != ids[i]:
                return i
        return max(limit, 0)

    @property
    def settled(self) -> int:
        """How many leading held positions were computed as a fresh prompt computes them (see the module)."""
        return self._settled()[0]

    def _settled(self) -> tuple[int, str]:
        """:attr:`settled`, and what the stages compute alike however positions are grouped into steps, as far as
        their answers told (``agent.runtime.repeatable.ALIKE``: ``all`` once a step other than a prompt of
        ``ALIKE_MIN_PROMPT`` positions or more was settled, ``prompts`` once one was), from the steps sent: a
        step's positions are settled where its answer says so, or where it is a prompt from a chunk boundary (its
        whole chunks), with all before them settled; a rewind cuts into them."""
        held = settled = 0
        alike = "none"
        for step in self._sent:
            start = held - step.rewind
            held = start + len(step.ids)
            settled = min(settled, start)
            if step.settled:
                prompt = step.last_only and len(step.ids) >= ALIKE_MIN_PROMPT
                alike = "all" if alike == "all" or not prompt else "prompts"
                if settled == start:
                    settled = held
            elif step.last_only and settled == start == chunk_floor(start, self.grid):
                settled = max(start, chunk_floor(held, self.grid))
        return settled, alike

    def reusable(self, ids: Sequence[int]) -> int:
        """How many leading ``ids`` a resumed prompt takes over: held (within the common prefix), :attr:`settled`,
        and such that the prompt's rest is computed as a fresh prompt computes it: from a chunk boundary where
        the stages compute nothing alike but a fresh prompt's chunks; where they compute prompts alike, with a
        first step of at least ``ALIKE_MIN_PROMPT`` positions or one that starts on a boundary."""
        settled, alike = self._settled()
        start = min(self.common_prefix(ids), settled)
        floor = chunk_floor(start, self.grid)
        if alike == "none":
            return floor
        if alike == "all":
            return start
        first_cut = min(floor + self.grid if self.grid else len(ids), len(ids))
        on_boundary = start == floor if self.grid else start == 0
        if not on_boundary and first_cut - start < ALIKE_MIN_PROMPT:
            return start - 1
        return start

    def resume(self, whole: bool = False) -> None:
        """The next step is a new prompt: send only what :meth:`reusable` leaves to compute, or with ``whole``,
        everything the state does not hold yet (the answer goes on after a replay: its positions are to be
        those of the session it replays, not a fresh prompt's)."""
        self._resuming = True
        self._whole = whole

    def usable(self) -> bool:
        return self.inner.usable()

    def repeatable(self) -> bool:
        return self.inner.repeatable()

    async def park(self) -> None:
        await self.inner.park()

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        return await (await self.submit(ids, rewind, last_only))

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future[StepOutput]:
        if self._resuming:
            self._resuming = False
            if rewind:
                raise ValueError("a resumed prompt is sent whole, with no rewind of its own")
            common = self.common_prefix(ids) if self._whole else self.reusable(ids)
            self.reused = common
            rewind, fed = len(self.held) - common, ids[common:]
        else:
            fed = ids
        if rewind > len(self.held):
            raise ValueError(f"cannot rewind {rewind} of {len(self.held)} positions")
        answer = await self.inner.submit(fed, rewind, last_only)
        # Recorded once submitted: a step the target refused holds nothing.
        start = len(self.held) - rewind
        del self.held[start:]
        self.held.extend(fed)
        sent = _SentStep(list(fed), rewind, last_only)
        answer.add_done_callback(sent.note)
        self._sent.append(sent)
        return answer

    async def replay_into(self, fresh: Target) -> ResumableTarget:
        """A target over ``fresh`` (a new session) whose state is what this one's answered steps built: they
        are sent again as they were, back to back, and answered before it is returned. Steps after the first
        one left unanswered (the ring was lost under them) are left out, as their tokens were never judged."""
        replayed = ResumableTarget(fresh, self.params, self.grid)
        answers = []
        for step in self._sent:
            if not step.answered:
                break
            answers.append(await replayed.submit(step.ids, step.rewind, step.last_only))
        for answer in answers:
            await answer
        return replayed

    def useful_depth(self) -> int:
        return self.inner.useful_depth()

    def answers_elsewhere(self) -> bool:
        return self.inner.answers_elsewhere()

    def watch_prefill(self, watcher: PrefillWatcher | None) -> None:
        self.inner.watch_prefill(watcher)

    async def close(self) -> None:
        self.held = []
        self._sent = []
        await self.inner.close()
