"""A chat client of the local agent: send one request, read its events, say what they mean (``shoal ask``, the TUI)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import MAX_LINE_BYTES, ChatEvent, ChatRequest


async def ask(endpoint: ChatEndpoint, request: ChatRequest) -> AsyncGenerator[ChatEvent, None]:
    """The events of one answer, ending with ``done`` or ``error``. Leaving the loop early (or
    cancelling) closes the connection, which cancels the answer on the agent."""
    try:
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, limit=MAX_LINE_BYTES + 1)
    except OSError as exc:
        yield ChatEvent.error("agent_unavailable", f"no agent answers at {endpoint.host}:{endpoint.port}: {exc}")
        return
    try:
        writer.write(request.to_line())
        await writer.drain()
        while True:
            line = await reader.readline()
            if not line:
                yield ChatEvent.error("agent_unavailable", "the agent closed the connection before the answer ended")
                return
            event = ChatEvent.from_line(line)
            yield event
            if event.event in ("done", "error"):
                return
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def progress_line(progress: ChatEvent) -> str:
    """What a ``progress`` event says, in a few words (``shoal ask``, the TUI)."""
    stats = progress.stats
    return f"prompt: {stats['done']:,} of {stats['total']:,} positions in, {stats['seconds']:.1f} s"
