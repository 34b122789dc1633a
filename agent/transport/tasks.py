"""The tasks a server owns (its connection handlers and background loops), ended together when it stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class OwnedTasks:
    """A set of tasks that forget themselves when done; ``cancel_all`` ends and awaits the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a task owned here."""
        task = asyncio.get_running_loop().create_task(coro)
        self.adopt(task)
        return task

    def adopt(self, task: asyncio.Task[Any] | None = None) -> None:
        """Own ``task`` (default: the current one, e.g. a connection handler asyncio started)."""
        task = task or asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def cancel_all(self) -> None:
        """Cancel every task still running and wait for each to finish (their failures are theirs to log)."""
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
