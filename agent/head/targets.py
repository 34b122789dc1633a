"""What a generation loop drives: anything that takes token ids and returns the target's readout.

:class:`LocalTarget` runs every stage in this process (the reference pipeline);
:class:`agent.head.ring_client.RingSession` sends the same steps around the ring.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Protocol

import numpy as np

from agent.head.sampling import SamplingParams
from agent.runtime.pipeline import PipelineSession
from agent.runtime.readout import StepOutput, read_out


class Target(Protocol):
    """One session of the target model, stepped asynchronously."""

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        """Forget ``rewind`` earlier positions, feed ``ids``; the readout at every (or the last) position."""
        ...

    async def close(self) -> None: ...


class LocalTarget:
    """The in-process pipeline as a :class:`Target` (blocking inference runs on ``executor``)."""

    def __init__(self, session: PipelineSession, params: SamplingParams, executor: Executor | None = None) -> None:
        self._session = session
        self._params = params
        self._executor = executor

    def _run(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        self._session.rewind(rewind)
        logits = self._session.step(np.asarray([ids], dtype=np.int64), last_only=last_only)
        return read_out(logits, self._params, last_only)

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, ids, rewind, last_only)

    async def close(self) -> None:
        self._session.reset()
