"""Listening on a TCP address, with one clear line when the address cannot be had (in use, not ours)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from agent.errors import ConfigError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def listen_tcp(handler: Handler, address: tuple[str, int], what: str, **options: int) -> asyncio.Server:
    """``asyncio.start_server`` on ``address``; an address in use or not on this PC raises ``ConfigError``
    naming ``what`` listens there (the ring, the chat endpoint, the HTTP API) instead of an ``OSError``."""
    host, port = address
    try:
        return await asyncio.start_server(handler, host, port, **options)
    except OSError as exc:
        # asyncio's message repeats the address; the errno's own text is the reason
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen for {what} on {host}:{port}: {reason.lower()}") from exc
