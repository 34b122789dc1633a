"""How the ring's code reaches its peers: a ``Network`` dials and listens, and hands over frame connections.

The stage server, its link to the next stage and the ring client never open a socket themselves; they are
given a ``Network``. :class:`TlsNetwork` is the real one: TCP with mutual TLS, every peer's certificate
checked against the fleet CA before a single frame is read. The middle test tier gives the same code an
in-memory network instead (``tests/support/memory_network.py``), so the session rules run in
milliseconds, with the real frame codec and without sockets.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import weakref
from collections.abc import Awaitable, Callable
from typing import Protocol

from agent.errors import PeerRefusedError
from agent.fleet import NodeIdentity
from agent.transport.connection import FrameConnection, dial
from agent.transport.listen import listen_tcp
from agent.transport.sockets import tune_socket
from agent.transport.tls import client_context, date_failure, server_context
from agent.wire.codec import DEFAULT_MAX_PAYLOAD

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0
"""A peer must finish its TLS handshake within this long after connecting."""
WARNED_MAX = 4096
"""Failed handshakes (address, reason) remembered as logged at warning; repeats go to debug."""

Accept = Callable[[FrameConnection], Awaitable[None]]
"""Serves one accepted connection until it ends (it runs as that connection's task)."""


class Listener(Protocol):
    """A listening endpoint of a :class:`Network`."""

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens (the bound port, when asked for port 0)."""
        ...

    def close(self) -> None:
        """Stop accepting (connections already accepted go on)."""
        ...


class Network(Protocol):
    """Dials peers and accepts them, as frame connections."""

    async def dial(
        self,
        address: tuple[str, int],
        *,
        label: str = "",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        timeout: float = 5.0,
        check_dates: bool = True,
    ) -> FrameConnection:
        """Connect to ``address``; raises ``PeerUnavailableError`` (``PeerRefusedError`` if refused,
        ``CertificateDatesError`` if on the peer certificate's dates). ``check_dates`` False: accept a peer
        certificate whatever its dates (the clock probe only: ``agent.transport.tls.client_context``)."""
        ...

    async def listen(
        self, address: tuple[str, int], accept: Accept, *, max_payload: int = DEFAULT_MAX_PAYLOAD
    ) -> Listener:
        """Accept peers at ``address``, each connection served by ``accept`` in a task of its own."""
        ...


class _TcpListener:
    def __init__(self, server: asyncio.Server) -> None:
        self._server = server
        bound = server.sockets[0].getsockname()
        self.address: tuple[str, int] = (bound[0], bound[1])

    def close(self) -> None:
        self._server.close()


class TlsNetwork:
    """TCP with mutual TLS: the fleet's real network. ``node`` names this agent in its log lines."""

    def __init__(
        self,
        client: ssl.SSLContext,
        server: ssl.SSLContext | None = None,
        *,
        node: str = "",
        client_any_dates: ssl.SSLContext | None = None,
    ) -> None:
        """``client_any_dates``: the client context for ``dial(check_dates=False)`` (None: such dials check the
        dates all the same)."""
        self._client = client
        self._client_any_dates = client_any_dates or client
        self._server = server
        self.node = node
        self._warned: set[tuple[str, str]] = set()
        self._refused: frozenset[str] = frozenset()
        self._open: weakref.WeakSet[FrameConnection] = weakref.WeakSet()

    def refuse(self, fingerprints: frozenset[str]) -> None:
        """Refuse the certificates with these fingerprints (the fleet's revocation list) at every handshake
        from now on, and drop the open connections whose peer presents one."""
        self._refused = frozenset(fingerprints)
        for connection in list(self._open):
            if not connection.closed and _fingerprint(connection.peer_certificate) in self._refused:
                log.warning("node=%s dropped %s: its certificate is revoked", self.node, connection.label)
                connection.abort()

    def revoked(self, certificate: bytes | None) -> bool:
        """Whether a peer presenting ``certificate`` (DER) is refused: the fleet revoked it (``refuse``). For the
        other listeners of an agent that take the fleet's certificates (its metrics endpoint)."""
        return _fingerprint(certificate) in self._refused

    def _handshake_failed(self, where: str, exc: BaseException) -> None:
        """Log a peer's failed handshake: at warning the first time for its host and reason, then at debug (a peer
        that cannot link dials again every few seconds)."""
        reason = _handshake_failure(exc)
        seen = (where.rpartition(":")[0], reason)
        if seen in self._warned:
            log.debug("node=%s refused peer %s: TLS handshake failed: %s", self.node, where, reason)
            return
        if len(self._warned) >= WARNED_MAX:
            self._warned.clear()
        self._warned.add(seen)
        log.warning(
            "node=%s refused peer %s: TLS handshake failed: %s (repeats are logged at debug)", self.node, where, reason
        )

    def _admit(self, connection: FrameConnection) -> bool:
        if _fingerprint(connection.peer_certificate) in self._refused:
            return False
        self._open.add(connection)
        return True

    @classmethod
    def of(cls, identity: NodeIdentity) -> TlsNetwork:
        """The network of an enrolled node: its certificate both ways."""
        any_dates = client_context(identity, check_dates=False)
        return cls(client_context(identity), server_context(identity), node=identity.name, client_any_dates=any_dates)

    async def dial(
        self,
        address: tuple[str, int],
        *,
        label: str = "",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        timeout: float = 5.0,
        check_dates: bool = True,
    ) -> FrameConnection:
        context = self._client if check_dates else self._client_any_dates
        connection = await dial(*address, context, timeout=timeout, max_payload=max_payload, label=label)
        if not self._admit(connection):
            connection.abort()
            raise PeerRefusedError(f"refused {connection.label}: its certificate is on the fleet's revocation list")
        return connection

    async def listen(
        self, address: tuple[str, int], accept: Accept, *, max_payload: int = DEFAULT_MAX_PAYLOAD
    ) -> Listener:
        if self._server is None:
            raise ValueError("this network only dials: it was given no server certificate")
        context = self._server

        async def handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            peer = writer.get_extra_info("peername")
            where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                tune_socket(sock)
            try:
                await writer.start_tls(context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
            except (ssl.SSLError, ConnectionError, OSError, TimeoutError) as exc:
                self._handshake_failed(where, exc)
                writer.transport.abort()
                return
            connection = FrameConnection(reader, writer, max_payload=max_payload, label=f"peer {where}")
            if not self._admit(connection):
                log.warning(
                    "node=%s refused peer %s: its certificate is on the fleet's revocation list", self.node, where
                )
                connection.abort()
                return
            await accept(connection)

        server = await listen_tcp(handshake, address, "the ring", limit=1 << 20)
        return _TcpListener(server)


def _handshake_failure(exc: BaseException) -> str:
    """Why a peer's TLS handshake failed, for the log: a failure on its certificate's dates says what it means."""
    dates = date_failure(exc)
    if dates == "is not yet valid":
        return (
            "its certificate is not yet valid by this PC's clock: this PC's clock is probably behind (set it: NTP; "
            "`shoal status` names the peers it cannot link with)"
        )
    if dates is not None:
        return (
            f"its certificate {dates} by this PC's clock: this PC's clock is ahead (set it: NTP), or the certificate "
            "is due for renewal"
        )
    return str(exc) or type(exc).__name__


def _fingerprint(der: bytes | None) -> str:
    """``sha256:<hex>`` of a DER certificate (as ``agent.fleet.cert_fingerprint``), "" for none."""
    return "sha256:" + hashlib.sha256(der).hexdigest() if der else ""
