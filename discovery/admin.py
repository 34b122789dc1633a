"""The admin's side of the fleet's signed documents: editing the fleet document in the fleet folder (where the
CA key is), and pushing a signed document to a running agent over its port (the role ``admin``), which then
gossips it to every member."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

from agent.errors import FleetError
from agent.fleet import NodeIdentity
from agent.fleet.authority import fleet_id_of, fleet_lock, load_ca, read_certificate, write_atomic
from agent.transport.connection import expect
from agent.transport.network import TlsNetwork
from agent.wire import FrameType
from agent.wire.messages import Hello
from discovery import control
from discovery.fleet_document import FleetDocument

TIMEOUT = 10.0
FLEET_DOCUMENT_FILE = "fleet-document.json"
"""The fleet document in the admin's fleet folder (beside ``ca.key``); agents keep their copy as ``fleet.json``."""


def current_fleet_document(fleet_dir: Path) -> FleetDocument:
    """The fleet folder's fleet document, checked against its CA (version 0 if none was written yet)."""
    ca = read_certificate(fleet_dir / "ca.pem")
    path = fleet_dir / FLEET_DOCUMENT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return FleetDocument.empty(fleet_id_of(ca), dt.datetime.now(dt.UTC))
    except OSError as exc:
        raise FleetError(f"cannot read the fleet document {path}: {exc}") from exc
    try:
        return FleetDocument.verify(data, ca)
    except FleetError as exc:
        raise FleetError(f"{path}: {exc}") from exc


def edit_fleet_document(
    fleet_dir: Path, change: Callable[[FleetDocument, dt.datetime], FleetDocument]
) -> tuple[FleetDocument, bytes]:
    """Write the next version of the fleet folder's document, ``change(current, now)``, signed with the CA key;
    returns it and its signed bytes (what is pushed). Needs the CA key (run where ``shoal fleet init`` was)."""
    ca_key, _ = load_ca(fleet_dir)
    with fleet_lock(fleet_dir):
        current = current_fleet_document(fleet_dir)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        result = change(current, now)
        signed = result.sign(ca_key)
        write_atomic(fleet_dir / FLEET_DOCUMENT_FILE, signed, private=False)  # public: every agent holds a copy
    return result, signed


async def push_document(
    address: tuple[str, int], identity: NodeIdentity, message: control.Revocations | control.FleetDocumentOffer
) -> str:
    """Hand a signed document to the agent at ``address``; returns what it made of it (``version N taken``,
    or why not). :class:`FleetError` if the agent refused it; ``PeerUnavailableError`` if it cannot be reached."""
    connection = await TlsNetwork.of(identity).dial(address, label=f"agent {address[0]}:{address[1]}", timeout=TIMEOUT)
    try:
        await connection.send(Hello(node=identity.name, role="admin").to_frame())
        await expect(connection, FrameType.HELLO, TIMEOUT)
        await connection.send(control.to_frame(message))
        reply = control.from_frame(await expect(connection, FrameType.MEMBERS, TIMEOUT))
    finally:
        await connection.close()
    what = "revocation list" if isinstance(message, control.Revocations) else "fleet document"
    if isinstance(reply, control.Refused):
        raise FleetError(f"{address[0]}:{address[1]} refused the {what}: {reply.reason}")
    if not isinstance(reply, control.Ack):
        raise FleetError(f"{address[0]}:{address[1]} answered {type(reply).__name__}, not an acknowledgement")
    return reply.detail


async def push_revocations(address: tuple[str, int], identity: NodeIdentity, document: bytes) -> str:
    """Hand the signed revocation list ``document`` to the agent at ``address`` (see :func:`push_document`)."""
    return await push_document(address, identity, control.Revocations(document))
