"""The persistent connection from a stage to the next stage, re-dialled with backoff."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agent.errors import PeerRefusedError, PeerUnavailableError, ProtocolError
from agent.transport.connection import FrameConnection, expect
from agent.transport.heartbeat import Heartbeat, Liveness
from agent.transport.network import Network
from agent.wire import Frame, FrameType
from agent.wire.messages import Hello, parse

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 2.0


class SuccessorLink:
    """Keeps one connection to the successor open, whatever the bring-up order.

    Frames the successor sends back (errors for sessions) go to ``on_frame``; when the link dies,
    ``on_lost`` is told (the sessions that crossed it are gone on the other side).
    """

    def __init__(
        self,
        address: tuple[str, int],
        network: Network,
        hello: Hello,
        *,
        on_frame: Callable[[Frame], Awaitable[None]],
        on_lost: Callable[[str], Awaitable[None]],
        max_payload: int,
        liveness: Liveness,
    ) -> None:
        self.address = address
        self._network = network
        self._hello = hello
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._max_payload = max_payload
        self._liveness = liveness
        self._connection: FrameConnection | None = None
        self.ready = asyncio.Event()
        self.peer: Hello | None = None
        self._stopping = False
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def wait_ready(self, timeout: float) -> None:
        """Until the link is up; ``TimeoutError`` after ``timeout`` seconds, ``PeerUnavailableError`` at once if
        the link is closed meanwhile (the fleet plan gave this agent another next stage)."""
        ready, closed = asyncio.ensure_future(self.ready.wait()), asyncio.ensure_future(self._closed.wait())
        try:
            done, _ = await asyncio.wait((ready, closed), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            closed.cancel()
        if ready in done and not self._closed.is_set():
            return
        if closed in done or self._closed.is_set():
            raise PeerUnavailableError(f"the link to next stage {self.address[0]}:{self.address[1]} was closed")
        raise TimeoutError(f"next stage {self.address[0]}:{self.address[1]} not connected within {timeout:.0f} s")

    async def send(self, frame: Frame) -> None:
        if self._connection is None:
            raise PeerUnavailableError(f"next stage {self.address[0]}:{self.address[1]} is not connected")
        await self._connection.send(frame)

    async def run(self) -> None:
        """Dial, exchange HELLOs, relay incoming frames; re-dial after any failure."""
        backoff = BACKOFF_START
        where = f"{self.address[0]}:{self.address[1]}"
        refused = ""  # the last refusal logged as a warning: repeats of it every backoff go to debug
        while not self._stopping:
            try:
                connection = await self._network.dial(
                    self.address, max_payload=self._max_payload, label=f"next stage {where}"
                )
            except PeerUnavailableError as exc:
                # a successor that is not up yet is routine; one that refuses us is news, once per streak
                news = isinstance(exc, PeerRefusedError) and str(exc) != refused
                refused = str(exc) if isinstance(exc, PeerRefusedError) else refused
                log.log(
                    logging.WARNING if news else logging.DEBUG,
                    "node=%s %s; retrying in %.1f s",
                    self._hello.node,
                    exc,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            try:
                await connection.send(self._hello.to_frame())
                peer = parse(await expect(connection, FrameType.HELLO, 10.0), Hello)
                self._check(peer)
            except (PeerUnavailableError, ProtocolError) as exc:
                log.warning("node=%s next stage %s refused or broke the handshake: %s", self._hello.node, where, exc)
                connection.abort()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            self.peer, self._connection, backoff, refused = peer, connection, BACKOFF_START, ""
            self.ready.set()
            log.info(
                "node=%s connected to next stage %s (%s, layers %d-%d)",
                self._hello.node,
                where,
                peer.node,
                peer.layer_start,
                peer.layer_stop - 1,
            )
            heartbeat = Heartbeat(connection, self._liveness, self._hello.node)
            beating = asyncio.get_running_loop().create_task(heartbeat.run())
            try:
                reason = await self._relay(connection, heartbeat)
            finally:
                beating.cancel()
            self.ready.clear()
            self._connection = None
            if not self._stopping:
                log.warning("node=%s lost next stage %s: %s", self._hello.node, where, reason)
                await self._on_lost(reason)

    def _check(self, peer: Hello) -> None:
        if peer.export_id != self._hello.export_id:
            raise ProtocolError(f"it serves export {peer.export_id}, this ring runs {self._hello.export_id}")
        if peer.layer_start != self._hello.layer_stop:
            raise ProtocolError(
                f"it serves layers from {peer.layer_start}, this stage ends at {self._hello.layer_stop}"
            )

    async def _relay(self, connection: FrameConnection, heartbeat: Heartbeat) -> str:
        while True:
            try:
                frame = await connection.receive()
            except PeerUnavailableError as exc:
                return heartbeat.lost or str(exc)
            except ProtocolError as exc:
                connection.abort()
                return f"protocol error: {exc}"
            heartbeat.heard(frame)
            if frame.type is FrameType.PONG:
                continue
            if frame.type is FrameType.GOODBYE:
                await connection.close(goodbye=False)
                return "it said goodbye"
            await self._on_frame(frame)

    async def close(self) -> None:
        self._stopping = True
        self._closed.set()
        if self._connection is not None:
            await self._connection.close()
