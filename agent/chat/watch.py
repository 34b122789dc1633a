"""Ending an answer as soon as its client leaves, not at the next token it would have been sent."""

from __future__ import annotations

import asyncio
import contextlib


class ClientWatch:
    """Watches a client's connection while its answer is computed, and cancels the answer when it ends.

    A client sends nothing after its request, so an end of stream (or a reset) on the connection means it
    left; the answering task is then cancelled, which frees its session on every stage at once (a long
    prompt, or an answer sent whole at its end, would otherwise keep the ring busy for nobody). A client
    must therefore keep its side open until the answer ends: closing or half-closing it cancels the answer.
    """

    def __init__(self) -> None:
        self.left = False
        self.answered_once = False
        """Set by the caller once an event reached the client (for its log line)."""
        self._task: asyncio.Task[None] | None = None
        self.early = bytearray()
        """What the client sent while its answer was computed (read here, so that it is not lost)."""

    @classmethod
    def start(cls, reader: asyncio.StreamReader) -> ClientWatch:
        """Watch ``reader`` (its request already read) on behalf of the current task."""
        watch = cls()
        answering = asyncio.current_task()
        assert answering is not None

        async def run() -> None:
            with contextlib.suppress(ConnectionError):
                while data := await reader.read(4096):
                    watch.early += data  # a kept-alive client's next request, sent before this answer ended
            watch.left = True
            answering.cancel()

        watch._task = asyncio.get_running_loop().create_task(run())
        return watch

    def absorbed(self) -> bool:
        """In the answering task's ``except CancelledError``: True when this watch cancelled it (its client
        left), the cancellation then undone; False when someone else did (the agent stops), to re-raise."""
        if not self.left:
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return True

    def stop(self) -> None:
        """The answer is over (or failed by itself): stop watching."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def release(self) -> bytes:
        """Stop watching and wait until the watch no longer reads; return what the client sent meanwhile (a
        kept-alive connection's reader then belongs to the next request)."""
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return bytes(self.early)
