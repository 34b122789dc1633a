"""The status connection of ``shoal status`` and of every command that reads an agent's status document:
``StatusLink`` holds one open, ``fetch_status`` asks once."""

from __future__ import annotations

import json
from typing import Any

from agent.errors import RingError
from agent.fleet import NodeIdentity
from agent.transport.connection import FrameConnection, dial, expect
from agent.transport.tls import client_context
from agent.wire import Frame, FrameType
from agent.wire.messages import Hello


class StatusLink:
    """A status connection held open to one agent, asked as often as wanted (``fetch_status`` asks once).

    Each ``get`` costs one round trip and no handshake: a monitor or a benchmark reads an agent's counters
    at the instant it asks."""

    def __init__(self, connection: FrameConnection, timeout: float) -> None:
        self._connection = connection
        self._timeout = timeout

    @classmethod
    async def open(cls, address: tuple[str, int], identity: NodeIdentity, timeout: float = 10.0) -> StatusLink:
        """Dial ``address`` with ``identity``'s certificate and introduce ourselves as a status reader."""
        connection = await dial(*address, client_context(identity), timeout=timeout)
        try:
            await connection.send(Hello(node=identity.name, role="status").to_frame())
            await expect(connection, FrameType.HELLO, timeout)
        except BaseException:
            await connection.close()
            raise
        return cls(connection, timeout)

    async def get(self) -> dict[str, Any]:
        """The agent's status document now."""
        await self._connection.send(Frame(FrameType.STATUS_REQUEST))
        frame = await expect(self._connection, FrameType.STATUS, self._timeout)
        data = json.loads(frame.body())
        if not isinstance(data, dict):
            raise RingError("the agent's status is not a JSON object")
        return data

    async def close(self) -> None:
        await self._connection.close()


async def fetch_status(address: tuple[str, int], identity: NodeIdentity, timeout: float = 10.0) -> dict[str, object]:
    """One agent's status document."""
    link = await StatusLink.open(address, identity, timeout)
    try:
        return await link.get()
    finally:
        await link.close()
