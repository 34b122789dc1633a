"""What an admin's tools push to a running agent over its port (the role ``admin``): the fleet's signed
revocation list, which the agent then gossips to every member."""

from __future__ import annotations

from agent.errors import FleetError
from agent.fleet import NodeIdentity
from agent.transport.connection import expect
from agent.transport.network import TlsNetwork
from agent.wire import FrameType
from agent.wire.messages import Hello
from discovery import control

TIMEOUT = 10.0


async def push_revocations(address: tuple[str, int], identity: NodeIdentity, document: bytes) -> str:
    """Hand the signed revocation list ``document`` to the agent at ``address``; returns what it made of it
    (``version N taken``, or why not). :class:`FleetError` if the agent refused it; ``PeerUnavailableError``
    if it cannot be reached."""
    connection = await TlsNetwork.of(identity).dial(address, label=f"agent {address[0]}:{address[1]}", timeout=TIMEOUT)
    try:
        await connection.send(Hello(node=identity.name, role="admin").to_frame())
        await expect(connection, FrameType.HELLO, TIMEOUT)
        await connection.send(control.to_frame(control.Revocations(document)))
        reply = control.from_frame(await expect(connection, FrameType.MEMBERS, TIMEOUT))
    finally:
        await connection.close()
    if isinstance(reply, control.Refused):
        raise FleetError(f"{address[0]}:{address[1]} refused the revocation list: {reply.reason}")
    if not isinstance(reply, control.Ack):
        raise FleetError(f"{address[0]}:{address[1]} answered {type(reply).__name__}, not an acknowledgement")
    return reply.detail
