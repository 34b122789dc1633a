"""Listening on a TCP address, with one clear line when the address cannot be had (in use, not ours)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable

from agent.errors import ConfigError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def listen_tcp(
    handler: Handler, address: tuple[str, int], what: str, tls: ssl.SSLContext | None = None, **options: int
) -> asyncio.Server:
    """``asyncio.start_server`` on ``address`` (``tls``: TLS on every connection, handshake done before
    ``handler``); an address in use or not on this PC raises ``ConfigError`` naming ``what`` listens there (the
    ring, the chat endpoint, the HTTP API) instead of an ``OSError``."""
    host, port = address
    try:
        return await asyncio.start_server(handler, host, port, ssl=tls, **options)
    except OSError as exc:
        raise _cannot_listen(what, address, exc) from exc


def check_can_listen(address: tuple[str, int], what: str) -> None:
    """Raise the ``ConfigError`` :func:`listen_tcp` would for ``address`` (in use, not on this PC), before work
    that takes long (an agent compiles its stages before it listens): bind it as asyncio does, and let go. Port 0
    (any free port) is always to be had. Blocking (name resolution): call it off the event loop."""
    host, port = address
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _, where in found:
            with socket.socket(family, kind, proto) as sock:
                if os.name == "posix":  # as asyncio.start_server: an address in TIME_WAIT is free to take
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(where)
    except OSError as exc:
        raise _cannot_listen(what, address, exc) from exc


def _cannot_listen(what: str, address: tuple[str, int], exc: OSError) -> ConfigError:
    # asyncio's message repeats the address; the errno's own text is the reason
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return ConfigError(f"cannot listen for {what} on {address[0]}:{address[1]}: {reason.lower()}")
