"""The progress of a long prompt, told to the chat client while it waits for the first token.

A prompt cut into chunks (``agent.head.prefill``) reports each chunk that has gone through the whole ring.
Those reports come on the ring client's reader while the answer waits for its first token; they are queued
here and come out of :meth:`PromptProgress.before_first` between the answer's tokens, as ``progress``
events. After the first token nothing is reported: the prompt is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from agent.chat_client.protocol import ChatEvent


class PromptProgress:
    """The progress reports of one answer's prompt (``report`` is its ``PrefillWatcher``), as chat events."""

    def __init__(self, started: float, clock: Callable[[], float] = time.perf_counter) -> None:
        """``started``: when the answer began, on ``clock``; each event tells the seconds since."""
        self._started = started
        self._clock = clock
        self._reports: asyncio.Queue[ChatEvent] = asyncio.Queue()
        self.latest: tuple[int, int] | None = None
        """The last report (positions done, positions in all), for the agent's status; None before one."""

    def report(self, done: int, total: int) -> None:
        """Queue one report (called on the event loop, by the ring client)."""
        self.latest = (done, total)
        self._reports.put_nowait(ChatEvent.progress(done, total, self._clock() - self._started))

    async def before_first(self, tokens: AsyncIterator[int]) -> AsyncGenerator[int | ChatEvent, None]:
        """``tokens`` as they come, and before the first of them every report queued meanwhile.

        The wait for the first token runs as a task of its own, so that a report can be passed on while it
        waits; the tokens after it are read in the caller's task, one at a time as the caller asks (a stop
        sequence that ends the answer stops the decoding at once). An error of the first step is raised
        here, as reading ``tokens`` would raise it."""
        first: asyncio.Future[int] = asyncio.ensure_future(anext(tokens))
        report: asyncio.Future[ChatEvent] | None = None
        try:
            while not first.done():
                report = asyncio.ensure_future(self._reports.get())
                either: set[asyncio.Future[Any]] = {first, report}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if report.done():
                    yield report.result()
                report.cancel()
            while not self._reports.empty():
                yield self._reports.get_nowait()
            try:
                token = first.result()
            except StopAsyncIteration:
                return
        finally:
            if report is not None:
                report.cancel()
            if not first.done():  # the caller left while the prompt was going in
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await first
        yield token
        async for token in tokens:
            yield token
