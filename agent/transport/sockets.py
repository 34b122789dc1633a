"""Socket options for ring connections, so that a silently vanished peer is noticed in seconds.

Measured in netlab (NOTES.md section 5): when a peer's cable is pulled or its network goes down, a
blocked ``recv`` with default options waits forever, and a sender only gives up after about 15
minutes of retransmissions. With keepalive 1/1/3 an idle reader gets ``ETIMEDOUT`` after about
3-4 s; keepalive does not run while sent data is unacknowledged, so ``TCP_USER_TIMEOUT`` (3000 ms)
covers the sender, which fails after about 4.5 s. Both are needed.
"""

from __future__ import annotations

import logging
import socket
from asyncio.trsock import TransportSocket

log = logging.getLogger(__name__)


def tune_socket(
    sock: socket.socket | TransportSocket,
    user_timeout_ms: int = 3000,
    keepalive_idle: int = 1,
    keepalive_interval: int = 1,
    keepalive_count: int = 3,
) -> None:
    """Set ``TCP_NODELAY``, keepalive and ``TCP_USER_TIMEOUT`` on a TCP socket.

    Works on a plain socket and on asyncio's ``writer.get_extra_info("socket")``. Options a
    platform lacks (``TCP_USER_TIMEOUT`` outside Linux, for instance) are skipped, so the code runs
    on Windows and macOS too, only with slower detection of a vanished peer there. A socket that is
    not TCP (a Unix socket in a test, say) is left alone.
    """
    if keepalive_idle < 1 or keepalive_interval < 1 or keepalive_count < 1:
        raise ValueError("keepalive idle, interval and count must be at least 1")  # Linux refuses 0
    if user_timeout_ms < 0:
        raise ValueError("user_timeout_ms must not be negative")
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return
    # Ring frames are small and latency-bound (one token per round trip): never let Nagle hold them.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Platform-specific knobs. Each is looked up by name because the constant may be absent, and a
    # present constant can still be refused by an older kernel (OSError): the connection then works
    # with the OS default, which only delays noticing a dead peer.
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux, Windows 10+
        _try_set(sock, "TCP_KEEPIDLE", keepalive_idle)
    elif hasattr(socket, "TCP_KEEPALIVE"):  # macOS's name for the idle time
        _try_set(sock, "TCP_KEEPALIVE", keepalive_idle)
    if hasattr(socket, "TCP_KEEPINTVL"):
        _try_set(sock, "TCP_KEEPINTVL", keepalive_interval)
    if hasattr(socket, "TCP_KEEPCNT"):
        _try_set(sock, "TCP_KEEPCNT", keepalive_count)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux only
        _try_set(sock, "TCP_USER_TIMEOUT", user_timeout_ms)


def _try_set(sock: socket.socket | TransportSocket, option: str, value: int) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError as exc:
        log.debug("socket option %s=%s refused: %s", option, value, exc)
