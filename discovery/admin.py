"""The admin's side of the fleet's signed documents: editing the fleet document in the fleet folder (where the
CA key is), and pushing a signed document to a running agent over its port (the role ``admin``), which then
gossips it to every member.

The checks an admin's change passes are here, so that ``shoal pin``/``shoal fleet revoke`` and the TUI's admin
screen share them: a pin names one enrolled node that is not revoked (:func:`pin_node`), and a revocation says
which pins it voids and drops them if asked (:func:`revoke`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import FleetError
from agent.fleet import NodeIdentity
from agent.fleet.authority import EnrolledNode, FleetPaths, enrolled_nodes, fleet_id_of, read_certificate
from agent.fleet.revocation import RevocationList, RevokedNode, fleet_revokes, revoke_node
from agent.fleet.signed import edit_signed, read_signed
from agent.transport.connection import expect
from agent.transport.network import TlsNetwork
from agent.wire import FrameType
from agent.wire.messages import Hello
from discovery import control
from discovery.fleet_document import FleetDocument, Pin, with_pin, without_pins

TIMEOUT = 10.0
FLEET_DOCUMENT_FILE = "fleet-document.json"
"""The fleet document in the admin's fleet folder (beside ``ca.key``); agents keep their copy as ``fleet.json``."""


def current_fleet_document(fleet_dir: Path) -> FleetDocument:
    """The fleet folder's fleet document, checked against its CA (version 0 if none was written yet)."""
    ca = read_certificate(fleet_dir / "ca.pem")
    found = read_signed(fleet_dir / FLEET_DOCUMENT_FILE, ca, FleetDocument.verify, FleetDocument.WHAT)
    return found[0] if found is not None else FleetDocument.empty(fleet_id_of(ca), dt.datetime.now(dt.UTC))


def edit_fleet_document(
    fleet_dir: Path, change: Callable[[FleetDocument, dt.datetime], FleetDocument]
) -> tuple[FleetDocument, bytes]:
    """Write the next version of the fleet folder's document, ``change(current, now)``, signed with the CA key;
    returns it and its signed bytes (what is pushed). Needs the CA key (run where ``shoal fleet init`` was)."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    return edit_signed(fleet_dir, fleet_dir / FLEET_DOCUMENT_FILE, FleetDocument, lambda doc: change(doc, now), now)


# -- the checks of a change ---------------------------------------------------------------------------
def _meant(node: str, enrolled: Sequence[EnrolledNode], revoked: Callable[[str], bool]) -> tuple[bool, set[str]]:
    """Whether ``node`` (a node id, else a node name) names any certificate of ``enrolled``, and the node ids of
    those of them not revoked (``revoked(fingerprint)``): the PCs a pin of ``node`` could mean."""
    matches = [e for e in enrolled if e.node_id == node] or [e for e in enrolled if e.name == node]
    return bool(matches), {e.node_id for e in matches if not revoked(e.fingerprint)}


def pin_problem(node: str, enrolled: Sequence[EnrolledNode], revoked: Callable[[str], bool]) -> str | None:
    """Why a pin may not name ``node``, in one line, or None: it must name exactly one enrolled node that is not
    revoked (``revoked(fingerprint)``), by node id or by a name no other such node has."""
    known, live = _meant(node, enrolled, revoked)
    if not known:
        names = ", ".join(sorted({e.name for e in enrolled if not revoked(e.fingerprint)})) or "none"
        return f"no node {node!r} is enrolled in this fleet (enrolled: {names}): pin one by name or node id"
    if not live:
        return f"{node} is revoked: pin a node that is not (`shoal fleet list` shows them)"
    if len(live) > 1:
        return f"{len(live)} enrolled nodes are named {node!r} (node ids {', '.join(sorted(live))}): pin one by node id"
    return None


def pin_node(fleet_dir: Path, pin: Pin) -> tuple[FleetDocument, bytes]:
    """The next version of the fleet folder's document with ``pin`` (see :func:`edit_fleet_document`), once
    :func:`pin_problem` finds nothing wrong with its node; else :class:`FleetError` saying what is."""

    def change(doc: FleetDocument, now: dt.datetime) -> FleetDocument:
        why = pin_problem(pin.node, enrolled_nodes(fleet_dir), fleet_revokes(fleet_dir))
        if why is not None:
            raise FleetError(f"cannot pin stage {pin.stage} to {pin.node}: {why}")
        return with_pin(doc, pin, now)

    return edit_fleet_document(fleet_dir, change)


@dataclass(frozen=True)
class Revocation:
    """What :func:`revoke` did: the revocation list written (``signed``: its bytes, what is pushed), the pins
    that name only revoked nodes now (the plan ignores them: ``discovery.placement``), and the fleet document
    written without those pins (None: they were kept, or there were none)."""

    revocations: RevocationList
    signed: bytes
    added: tuple[RevokedNode, ...]
    """The certificates revoked just now."""
    voided: tuple[Pin, ...]
    document: tuple[FleetDocument, bytes] | None = None

    @property
    def messages(self) -> tuple[control.Revocations | control.FleetDocumentOffer, ...]:
        """What to hand the agents, in order: the revocation list, then the fleet document if one was written."""
        document = () if self.document is None else (control.FleetDocumentOffer(self.document[1]),)
        return (control.Revocations(self.signed), *document)


def revoke(fleet_dir: Path, node: str, drop_pins: bool = False) -> Revocation:
    """Revoke every certificate of ``node`` (a node name or id; ``agent.fleet.revocation.revoke_node``), and find
    the pins that named only those; ``drop_pins``: write the next fleet document without them."""
    before = fleet_revokes(fleet_dir)
    revocations = revoke_node(fleet_dir, node)
    signed = FleetPaths(fleet_dir).revocations.read_bytes()
    added = tuple(r for r in revocations.revoked if not before(r.fingerprint))
    touched = {r.name for r in added} | {r.node_id for r in added}
    enrolled = enrolled_nodes(fleet_dir)

    def voided(doc: FleetDocument) -> tuple[Pin, ...]:
        return tuple(p for p in doc.pins if p.node in touched and not _meant(p.node, enrolled, revocations.revokes)[1])

    pins = voided(current_fleet_document(fleet_dir))
    document = None
    if drop_pins and pins:
        document = edit_fleet_document(fleet_dir, lambda doc, now: without_pins(doc, voided(doc), now))
    return Revocation(revocations, signed, added, pins, document)


# -- handing documents to agents -----------------------------------------------------------------------
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
