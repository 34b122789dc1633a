"""``MetricsEndpoint``: ``GET /metrics`` on an address of its own, for any agent, a stage-only one included.

A fleet's admin scrapes every PC; an agent that serves a stage and heads no chat has no HTTP API, so this
endpoint stands alone (``--metrics HOST:PORT``). On loopback it is plain HTTP, open to this PC's users as the
agent's status port is to its fleet (the figures hold no secret: counts, times, node ids). On any other address
it is HTTPS that requires a client certificate of the fleet (the ring's mutual TLS, ``agent.transport.tls``):
Prometheus scrapes it with a node certificate (``tls_config``: ``ca_file``, ``cert_file``, ``key_file``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Any

import h11

from agent.errors import HTTPError
from agent.transport.http import read_request, request_begins, send_body
from agent.transport.listen import listen_tcp
from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
"""A request must arrive whole within this long once it has begun."""
IDLE_TIMEOUT = 60.0
"""A kept-alive connection with no new request for this long is closed (Prometheus keeps one per target)."""
MAX_BODY = 4096
"""A scrape has no body; anything longer is refused."""


class MetricsEndpoint:
    """Serves one agent's Prometheus exposition at ``/metrics`` (``tls``: HTTPS with the fleet's mutual TLS)."""

    def __init__(
        self,
        render: Callable[[], bytes],
        content_type: str,
        listen: tuple[str, int],
        node: str,
        tls: ssl.SSLContext | None = None,
        revoked: Callable[[bytes | None], bool] | None = None,
    ) -> None:
        """``revoked``: whether a scraper presenting this certificate (DER) is refused, asked of every TLS client
        once its handshake is done (the fleet's revocation list, ``TlsNetwork.revoked``)."""
        self._render = render
        self._content_type = content_type
        self._listen = listen
        self.node = node
        self._tls = tls
        self._revoked = revoked
        self._server: asyncio.Server | None = None
        self._tasks = OwnedTasks()
        self.scrapes = 0
        self.refused: Counter[str] = Counter()
        """Requests answered with an error, by code (another path, a body, a malformed request)."""

    async def start(self) -> tuple[str, int]:
        self._server = await listen_tcp(self._handle, self._listen, "the metrics endpoint", tls=self._tls)
        host, port = self._server.sockets[0].getsockname()[:2]
        scheme = "https" if self._tls is not None else "http"
        log.info("node=%s metrics on %s://%s:%d/metrics", self.node, scheme, host, port)
        return host, port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._tasks.cancel_all()

    def status(self) -> dict[str, Any]:
        """The ``metrics`` section of the agent's status."""
        return {"scrapes": self.scrapes, "refused": dict(self.refused)}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.adopt()
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        try:
            if self._is_revoked(writer):
                return
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT):
                        await request_begins(connection, reader)
                except (TimeoutError, EOFError):
                    return
                try:
                    async with asyncio.timeout(READ_TIMEOUT):
                        request, body = await read_request(connection, reader, MAX_BODY)
                    await self._answer(connection, writer, request, body)
                except HTTPError as exc:
                    self.refused[exc.code] += 1
                    await _refuse(connection, writer, 413 if exc.code == "too_large" else 404, str(exc))
                except (h11.RemoteProtocolError, TimeoutError) as exc:
                    self.refused["bad_request"] += 1
                    if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await send_body(
                            connection, writer, 400, "text/plain; charset=utf-8", f"bad request: {exc}\n".encode()
                        )
                    return
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            log.info("node=%s a metrics client left mid-request", self.node)
        except Exception:  # a bug must not take the agent down
            log.exception("node=%s metrics request failed unexpectedly", self.node)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError, asyncio.CancelledError):
                await writer.wait_closed()

    def _is_revoked(self, writer: asyncio.StreamWriter) -> bool:
        """Whether this TLS client's certificate is one the fleet revoked (then it is counted, logged, and dropped:
        its certificate still chains to the fleet's CA)."""
        tls = writer.get_extra_info("ssl_object")
        if self._revoked is None or tls is None:
            return False
        if not self._revoked(tls.getpeercert(binary_form=True)):
            return False
        self.refused["revoked"] += 1
        log.warning(
            "node=%s refused a metrics scraper at %s: its certificate is revoked",
            self.node,
            writer.get_extra_info("peername"),
        )
        return True

    async def _answer(
        self, connection: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        path = request.target.decode("latin-1").split("?", 1)[0]
        if request.method != b"GET" or path != "/metrics" or body:
            raise HTTPError("not_found", f"no {request.method.decode()} {path} here: scrape GET /metrics")
        exposition = await asyncio.get_running_loop().run_in_executor(None, self._render)
        self.scrapes += 1
        await send_body(connection, writer, 200, self._content_type, exposition)


async def _refuse(connection: h11.Connection, writer: asyncio.StreamWriter, status: int, why: str) -> None:
    await send_body(connection, writer, status, "text/plain; charset=utf-8", f"{why}\n".encode())
