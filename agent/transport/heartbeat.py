"""Heartbeats on a ring link: a frozen peer is noticed in seconds, and a busy one is never taken for it.

TCP keepalive cannot see a frozen process: its kernel still acknowledges every segment (``kill -STOP`` of
a stage mid-answer paused the answer exactly as long, with no error and no log line). So the dialling end
of every ring link sends a PING each ``interval``, and the other end's event loop answers PONG at once.
Stages compute on a worker thread, so a long prefill never delays the answer. A link on which nothing
arrives for ``timeout`` is lost: the dialler drops the connection, and what follows any lost peer follows
(the sessions on it fail, a chat replays its answer into a fresh session). The accepting end watches
the same way: an upstream that sent nothing for ``timeout`` (not even its pings) is gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.errors import ConfigError, PeerUnavailableError
from agent.transport.connection import FrameConnection
from agent.wire import Frame, FrameType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Liveness:
    """How often a ring link is checked, and how long a silent peer is waited for."""

    interval: float = 1.0
    """Seconds between two PINGs of the dialling end."""
    timeout: float = 5.0
    """A peer from which nothing (not even a PONG) arrived for this long is lost."""
    late: float = 1.0
    """A PONG slower than this is logged: the peer's event loop was held up, or its network is slow."""

    def __post_init__(self) -> None:
        if not 0 < self.interval < self.timeout:
            raise ConfigError(
                f"the heartbeat interval ({self.interval} s) must be positive and below the link timeout "
                f"({self.timeout} s)"
            )


class Heartbeat:
    """The dialling end's watch over one link: :meth:`heard` for every frame received, :meth:`run` alongside."""

    def __init__(
        self,
        connection: FrameConnection,
        liveness: Liveness,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connection = connection
        self._liveness = liveness
        self._node = node
        self._clock = clock
        self._last_heard = clock()
        self._sent: dict[int, float] = {}
        self.lost: str | None = None
        """Why the link was dropped for silence (None while it lives)."""

    def heard(self, frame: Frame) -> None:
        """A frame arrived: the peer lives. A PONG also tells how long the peer took to answer."""
        now = self._clock()
        self._last_heard = now
        if frame.type is FrameType.PONG:
            sent = self._sent.pop(frame.step, None)
            if sent is not None and now - sent > self._liveness.late:
                log.warning(
                    "node=%s %s answered a heartbeat late, after %.1f s", self._node, self._connection.label, now - sent
                )

    async def run(self) -> str:
        """PING every interval until the link is silent for the timeout; then drop it and return why."""
        sequence = 0
        while True:
            await asyncio.sleep(self._liveness.interval)
            silent = self._clock() - self._last_heard
            if silent > self._liveness.timeout:
                self.lost = (
                    f"{self._connection.label} sent nothing for {silent:.1f} s, not even an answer to heartbeats "
                    "(its agent froze, or its network is gone)"
                )
                log.warning("node=%s dropping the link: %s", self._node, self.lost)
                self._connection.abort()
                return self.lost
            sequence = sequence + 1 & 0xFFFFFFFF
            self._sent[sequence] = self._clock()
            if len(self._sent) > 64:  # unanswered pings of a silent peer: keep the newest
                del self._sent[min(self._sent)]
            try:
                await self._connection.send(Frame(FrameType.PING, step=sequence))
            except PeerUnavailableError as exc:
                return str(exc)


def pong(ping: Frame) -> Frame:
    """The answer to ``ping``, sent by the accepting end's event loop as soon as it reads it."""
    return Frame(FrameType.PONG, step=ping.step)
