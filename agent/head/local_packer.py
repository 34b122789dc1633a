"""The head's own stages, shared by its sessions: the steps they queue go through them packed (issue 45).

A head that holds stage 0 computes each session's step there before the frame goes on. One step after another,
the stages after it rarely had more than one step to pack. Here whatever the sessions queued while the head's
stages were busy goes through them in one ``run_packed`` call, as the stage server's worker does, chosen by the
same pure decision (``agent.runtime.packer.plan``): at most one step of each session per pack, each session's
steps in order, decode rows first and prompt chunks within the budget. No window: the head packs what is queued
when its stages free up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from agent.errors import LocalProtocolError
from agent.runtime.packed import PackedStep, kv_mode, packs_alike, run_packed_or_each
from agent.runtime.packer import Pack, PackPolicy, ReadyStep, Slice, Turns, Wait, plan
from agent.runtime.protocol import KVSession, Stage
from agent.runtime.repeatable import stages_alike, stages_exact, step_is_repeatable, step_is_settled

log = logging.getLogger(__name__)

HEAD_PACKING = PackPolicy()
"""A head packs its own stages' steps as a stage server does by default."""


@dataclass(frozen=True)
class LocalStep:
    """One session's step through the head's stages."""

    sessions: Sequence[KVSession]
    """The session's state on each of the head's stages."""
    ids: Sequence[int]
    position: int
    """The logical position of the first id (after the rewind)."""
    rewind: int
    prompt: bool
    """A prompt's step or chunk (computed as a prompt: ``last_only``)."""


@dataclass(frozen=True)
class LocalOutput:
    """What the head's stages made of a step: the hidden states to send on, and how they were computed."""

    hidden: np.ndarray
    seconds: float
    """Its share of the packs it was in (a pack's time divided among its steps)."""
    repeatable: bool
    """Computed as the session's step alone would always be (``agent.runtime.repeatable``)."""
    settled: bool
    """Computed as a fresh prompt's step would be; false where packed beside others changes its numbers."""


@dataclass
class _Queued:
    step: LocalStep
    future: asyncio.Future[LocalOutput]
    ready: ReadyStep
    hidden: list[np.ndarray] = field(default_factory=list)
    seconds: float = 0.0
    repeatable: bool = True
    settled: bool = True


class LocalPacker:
    """Runs the steps of a head's sessions on its stages, packed; one per head, on the head's compute thread."""

    def __init__(
        self,
        stages: Sequence[Stage],
        executor: Executor | None,
        policy: PackPolicy | None,
        wire_dtype: type[np.generic] | np.dtype[np.generic],
        node: str = "",
        clock: Callable[[], float] = time.monotonic,
        on_pack: Callable[[int], None] | None = None,
        make_room: Callable[[Iterable[PackedStep]], None] | None = None,
    ) -> None:
        """``policy``: the packing budget (None, or stages without paged KV: one step at a time, whole, in the order
        they came); ``on_pack``: told the steps (or prompt chunks) of each pack computed (on the event loop);
        ``make_room``: asked, on the event loop, to free the KV blocks a pack's steps need (the agent's stage
        server evicts sessions parked there: ``StageServer.make_kv_room``)."""
        self._stages = list(stages)
        self._executor = executor
        alike = stages_alike(self._stages)
        # As a stage server: stages whose sessions keep their own KV state compute a pack one step after another,
        # which would only hold the first step back until the last is computed; and a prompt alone goes whole where
        # the stages compute it the same however it is cut.
        paged = any(kv_mode(stage) == "paged" for stage in self._stages)
        self._policy = None if policy is None or not paged else dataclasses.replace(policy, fixed_cuts=alike == "none")
        self._alike = alike
        self._exact = stages_exact(self._stages)
        self._packs_alike = packs_alike(self._stages)
        self._wire_dtype = wire_dtype
        self._node = node
        self._clock = clock
        self._on_pack = on_pack
        self._make_room = make_room
        self._queues: dict[int, deque[_Queued]] = {}
        self._turns = Turns()
        self._worker: asyncio.Task[None] | None = None
        self.packs = 0
        self.packed_steps = 0
        """Packed inferences run, and the session steps (or prompt chunks) they held."""

    def queue(self, session: int, step: LocalStep) -> asyncio.Future[LocalOutput]:
        """Queue ``step`` of ``session`` after its earlier ones; the future holds its hidden states. Not a
        coroutine: a session queues all the chunks of a step at once, before anything else may come between."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[LocalOutput] = loop.create_future()
        future.add_done_callback(_retrieved)  # a session that failed stops reading its outputs
        ready = ReadyStep(session, 0, len(step.ids), step.prompt, self._clock())
        self._queues.setdefault(session, deque()).append(_Queued(step, future, ready))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._work())
        return future

    async def _work(self) -> None:
        """Pack what is queued until nothing is; a failure fails only the sessions of the pack it hit."""
        while self._queues:
            firsts = {session: queue[0] for session, queue in self._queues.items()}
            held = set(firsts)
            try:
                pack = self._plan([q.ready for q in firsts.values()])
                held = {piece.session for piece in pack.slices}
                await self._run(pack, firsts)
            except Exception as exc:  # the loop outlives any pack; the sessions it held learn why
                log.warning("node=%s a pack of the head's stages failed: %s", self._node, exc)
                for session in held:
                    self._fail(session, exc)

    async def _run(self, pack: Pack, firsts: dict[int, _Queued]) -> None:
        """Compute ``pack`` on the head's compute thread, then hand each finished step its output."""
        batch = [(firsts[piece.session], piece) for piece in pack.slices]
        if self._make_room is not None:  # a prompt's whole rest counts, as on a stage server
            self._make_room(self._piece(q, piece.to_end(q.ready.count)) for q, piece in batch)
        outputs, seconds = await asyncio.get_running_loop().run_in_executor(
            self._executor, self._run_local, [self._piece(q, piece) for q, piece in batch]
        )
        self.packs += 1
        self.packed_steps += len(batch)
        if self._on_pack is not None:
            self._on_pack(len(batch))
        self._turns = self._turns.after(pack, [q.ready for q in firsts.values()])
        beside = len(batch) > 1 and not self._packs_alike
        for (queued, piece), x in zip(batch, outputs, strict=True):
            if isinstance(x, Exception):
                self._fail(piece.session, x)
            else:
                self._took(queued, piece, x, seconds / len(batch), beside)

    def _plan(self, ready: list[ReadyStep]) -> Pack:
        if self._policy is None:
            first = min(ready, key=lambda r: r.arrived)
            return Pack((Slice(first.session, first.done, first.rows, last=True),))
        decision = plan(ready, self._clock(), None, self._policy, self._turns)  # None: no gathering window
        if decision is None or isinstance(decision, Wait):
            raise LocalProtocolError(f"the head's packer waited with no window: {decision}")  # our bug
        return decision

    @staticmethod
    def _piece(queued: _Queued, piece: Slice) -> PackedStep:
        step = queued.step
        return PackedStep(
            step.sessions,
            np.asarray([step.ids[piece.start : piece.start + piece.rows]], dtype=np.int64),
            step.position + piece.start,
            rewind=step.rewind if piece.start == 0 else 0,
            last_only=step.prompt,
        )

    def _run_local(self, steps: list[PackedStep]) -> tuple[list[np.ndarray | Exception], float]:
        """Runs on the executor: the pack, and its seconds. (Named as the head's step was before: the benchmark's
        timing executor counts the head's stage time by this name.)"""
        started = time.perf_counter()
        outputs: list[np.ndarray | Exception] = list(run_packed_or_each(steps))
        wired = [x if isinstance(x, Exception) else np.array(x, dtype=self._wire_dtype) for x in outputs]
        return wired, time.perf_counter() - started

    def _took(self, queued: _Queued, piece: Slice, x: np.ndarray, seconds: float, beside: bool) -> None:
        """Note a slice's output; once the step is whole, answer it and let the session's next step be planned."""
        rewind = queued.step.rewind if piece.start == 0 else 0
        queued.repeatable &= not beside and step_is_repeatable(self._exact, piece.rows, rewind, queued.step.prompt)
        queued.settled &= not beside and step_is_settled(self._alike, piece.rows, queued.step.prompt)
        queued.hidden.append(x)
        queued.seconds += seconds
        queued.ready = dataclasses.replace(queued.ready, done=piece.start + piece.rows)
        if not piece.last:
            return
        self._pop(piece.session)
        hidden = queued.hidden[0] if len(queued.hidden) == 1 else np.concatenate(queued.hidden, axis=1)
        if not queued.future.done():  # a caller that stopped waiting: its step was computed all the same
            queued.future.set_result(LocalOutput(hidden, queued.seconds, queued.repeatable, queued.settled))

    def _pop(self, session: int) -> None:
        queue = self._queues[session]
        queue.popleft()
        if not queue:
            del self._queues[session]

    def _fail(self, session: int, error: Exception) -> None:
        """Fail the session's queued steps: its state on the head's stages no longer follows its steps."""
        for queued in self._queues.pop(session, ()):
            if not queued.future.done():
                queued.future.set_exception(error)


def _retrieved(future: asyncio.Future[LocalOutput]) -> None:
    """Mark a failure as seen: no "exception never retrieved" for an output its session no longer reads."""
    if not future.cancelled():
        future.exception()
