"""What a generation loop drives: anything that takes token ids and returns the target's readout.

:class:`LocalTarget` runs every stage in this process (the reference pipeline);
:class:`agent.head.ring_client.RingSession` sends the same steps around the ring.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import Protocol

import numpy as np

from agent.head.prefill import DEFAULT_PREFILL_CHUNK, PrefillWatcher, prefill_chunks
from agent.runtime.pipeline import PipelineSession
from agent.runtime.repeatable import step_is_repeatable, step_is_settled
from agent.sampling.params import SamplingParams
from agent.sampling.readout import StepOutput, read_out


def ignore_unawaited_failure(future: asyncio.Future[StepOutput]) -> None:
    """Done callback for a submitted step: a step whose answer nobody awaits any more (its drafts were
    rejected) must not log "exception never retrieved" when the session fails."""
    if not future.cancelled():
        future.exception()


class Target(Protocol):
    """One session of the target model, stepped asynchronously."""

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        """Forget ``rewind`` earlier positions, feed ``ids``; the readout at every (or the last) position."""
        ...

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future[StepOutput]:
        """Start :meth:`step` and return its pending readout at once: steps run in submission order, so a
        loop may send the next step before the answer to this one (pipelined speculation)."""
        ...

    def useful_depth(self) -> int:
        """How many steps of this session in flight keep the target's stages busy without making other
        sessions wait: more than one only where stages would otherwise idle during a round trip."""
        ...

    def answers_elsewhere(self) -> bool:
        """True when part of every step is computed off this head (on other PCs), so that the head's core
        is free while it waits for an answer: time in which the loop may draft ahead."""
        ...

    def usable(self) -> bool:
        """Whether the session can take more steps (not closed, its ring not lost, not evicted)."""
        ...

    def repeatable(self) -> bool:
        """Whether every step so far was computed as any other grouping of its positions would be
        (``agent.runtime.repeatable``): the readouts are those plain decoding gives, whatever was drafted."""
        ...

    def watch_prefill(self, watcher: PrefillWatcher | None) -> None:
        """Tell ``watcher`` how far each later prompt has gone, where it is computed in chunks (a ring's
        pipelined prefill, ``agent.head.prefill``); ``None``: stop telling."""
        ...

    async def park(self) -> None:
        """The session waits for its conversation's next turn: stages that hold it may give its place to a new
        session meanwhile, and then it is no longer :meth:`usable`."""
        ...

    async def close(self) -> None: ...


class LocalTarget:
    """The in-process pipeline as a :class:`Target` (blocking inference runs on ``executor``)."""

    def __init__(
        self,
        session: PipelineSession,
        params: SamplingParams,
        executor: Executor | None = None,
        exact: bool | None = None,
        on_step: Callable[[float], None] | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        alike: str = "none",
    ) -> None:
        """``exact``: the stages' speculation exactness (``agent.runtime.repeatable.stages_exact``; None, not
        known: no step that could round otherwise counts as repeatable); ``on_step``: told the seconds of each
        step (on the event loop: an agent counts them with its stages' ring steps); ``prefill_chunk``: a prompt
        is computed in steps cut at its multiples, as a ring's head sends it (``agent.head.prefill``; 0: one
        step); ``alike``: what the stages compute the same however positions are grouped into steps
        (``agent.runtime.repeatable.stages_alike``), which tells each answer whether it is ``settled``."""
        self._session = session
        self._prefill_chunk = prefill_chunk
        self._params = params
        self._executor = executor
        self._exact = exact
        self._on_step = on_step
        self._alike = alike
        self._repeatable = True
        self._order = asyncio.Lock()  # FIFO: submitted steps run one after the other, in order

    def _run(self, ids: list[int], rewind: int, last_only: bool) -> tuple[StepOutput, float]:
        started = time.perf_counter()
        self._session.rewind(rewind)
        start = self._session.logical_length
        sizes = prefill_chunks(start, len(ids), self._prefill_chunk) if last_only else [len(ids)]
        for size in sizes:
            done = self._session.logical_length - start
            logits = self._session.step(np.asarray([ids[done : done + size]], dtype=np.int64), last_only=last_only)
        settled = all(step_is_settled(self._alike, size, last_only) for size in sizes)
        output = replace(read_out(logits, self._params, last_only), settled=settled)
        return output, time.perf_counter() - started  # the step's work, as a stage server times its steps

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        if not step_is_repeatable(self._exact, len(ids), rewind, last_only):
            self._repeatable = False
        async with self._order:
            loop = asyncio.get_running_loop()
            output, seconds = await loop.run_in_executor(self._executor, self._run, ids, rewind, last_only)
        if self._on_step is not None:
            self._on_step(seconds)
        return output

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future[StepOutput]:
        task = asyncio.get_running_loop().create_task(self.step(ids, rewind, last_only))
        task.add_done_callback(ignore_unawaited_failure)
        return task

    def useful_depth(self) -> int:
        return 1  # the stages run one after another in this process: nothing to overlap

    def answers_elsewhere(self) -> bool:
        return False  # every stage runs on this head's executor: drafting ahead would queue behind them

    def usable(self) -> bool:
        return True

    def repeatable(self) -> bool:
        return self._repeatable

    def watch_prefill(self, watcher: PrefillWatcher | None) -> None:
        """Nothing to tell: a prompt's chunks run back to back in this process, in one job."""

    async def park(self) -> None:
        """Nothing to tell: the state is this process's, and so is the choice of what to keep."""

    async def close(self) -> None:
        async with self._order:  # after the steps still in flight
            self._session.reset()
