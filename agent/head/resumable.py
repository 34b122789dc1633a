"""A target session that a conversation's next turn continues instead of starting afresh.

A chat's second turn sends the whole conversation again: the first turn's prompt, the answer, the new
message. Its KV state for all but the new message is already on the stages, held by the session that
answered the first turn. :class:`ResumableTarget` records which token ids its session's state holds
(every position fed and not rewound, rejected drafts of the last step included: their state is the
state of those tokens), and on :meth:`ResumableTarget.resume` turns the next prompt into a rewind to
what it can reuse plus the positions after it. The generation loop is unchanged: it sends its prompt
as always, and only the rest is computed.

What it can reuse: below f32 a position's numbers depend on how positions were grouped into steps, not
only on the tokens up to it (one thread, int4 default precision: a 40-position prompt sent as 39 + 1
moves the last logits by up to 0.45 and changed a greedy answer). A fresh session computes a prompt in
chunks cut at multiples of ``grid`` (``agent.head.prefill``), so the positions a later prompt can take
over are those computed the same way: the whole chunks of the prompts this session was sent, up to the
last chunk boundary both prompts share. The rest (a partial last chunk, the answer's positions, which
decoding computed one step at a time, the new message) is computed again as a fresh prompt computes it,
so the answer is a fresh session's wherever the stages rewind exactly (``RuntimeConfig.rewind``).

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
from agent.sampling.params import SamplingParams
from agent.sampling.readout import StepOutput


@dataclass
class _SentStep:
    """One step as it was sent; whether it was answered (the answer itself is not kept)."""

    ids: list[int]
    rewind: int
    last_only: bool
    answered: bool = False

    def note(self, answer: asyncio.Future[StepOutput]) -> None:
        self.answered = not answer.cancelled() and answer.exception() is None


class ResumableTarget:
    """A :class:`~agent.head.targets.Target` that knows the token ids its state holds, and how it got them."""

    def __init__(self, inner: Target, params: SamplingParams, grid: int) -> None:
        """``params``: the sampling the session was opened with (the stages sample with it); ``grid``: the chunk
        size ``inner`` cuts prompts at (multiples of it; 0: a prompt is one step, and nothing can be reused)."""
        self.inner = inner
        self.params = params
        self.grid = grid
        self.held: list[int] = []
        """Token ids the session's state holds, in order."""
        self.settled = 0
        """How many leading held positions were computed as a fresh prompt computes them (whole chunks of
        prompts that started at a chunk boundary, all before them settled too; a rewind may cut into them)."""
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

    def reusable(self, ids: Sequence[int]) -> int:
        """How many leading ``ids`` a resumed prompt takes over: held, and computed as a fresh prompt would
        compute them (up to the last chunk boundary within :attr:`settled` and the common prefix)."""
        return chunk_floor(min(self.common_prefix(ids), self.settled), self.grid)

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
        self.settled = min(self.settled, start)
        if last_only and self.settled == start == chunk_floor(start, self.grid):
            # a prompt from a chunk boundary with everything before it settled: its whole chunks are too
            self.settled = max(start, chunk_floor(len(self.held), self.grid))
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
        self.settled = 0
        self._sent = []
        await self.inner.close()
