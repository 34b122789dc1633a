"""A test's stream server that takes its connections down with it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(handler: Handler, host: str = "127.0.0.1", **kwargs: Any) -> AsyncIterator[int]:
    """``asyncio.start_server(handler, host, 0, **kwargs)``, yielding its port; on the way out it stops
    listening, cancels the handlers still running and closes their connections.

    Python 3.11's ``Server.close`` and ``wait_closed`` do neither (3.12's ``wait_closed`` waits for the
    connections): a handler still waiting when the test's coroutine returned was cancelled by ``asyncio.run``
    and its socket left to the collector, which the suite's leak guard reports.
    """
    handlers: list[asyncio.Task[Any]] = []

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            handlers.append(task)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(tracked, host, 0, **kwargs)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()
