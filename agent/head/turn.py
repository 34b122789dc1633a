"""The head's core, shared by the sessions of one head: whole turns, and work that yields to them.

A step's local work (drafting, then the head's own stages) is one turn, so sessions do not interleave
their jobs on the head's executor. Drafting ahead (``agent.head.decode``) is work nobody waits for
yet: it takes a turn like any other, but watches :attr:`HeadTurn.wanted` and stops drafting as soon
as a session queues for the core, so a session whose answer has come is not held up by another's guess.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import TracebackType


class HeadTurn:
    """An asyncio lock (FIFO, not reentrant) that knows whether anyone is queued for it."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._queued = 0

    @property
    def wanted(self) -> bool:
        """True while a session waits for the turn; safe to read from the executor's thread."""
        return self._queued > 0

    def locked(self) -> bool:
        return self._lock.locked()

    async def __aenter__(self) -> HeadTurn:
        self._queued += 1
        try:
            await self._lock.acquire()
        finally:
            self._queued -= 1
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._lock.release()

    @contextlib.asynccontextmanager
    async def spare(self) -> AsyncIterator[None]:
        """The turn for work nobody waits for: queued like any other, but not counted in :attr:`wanted`."""
        async with self._lock:
            yield
