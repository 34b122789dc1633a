"""The admin screen of ``shoal chat``: the code of ``shoal pin``, ``unpin``, ``fleet list``, ``fleet token`` and
``fleet revoke``, behind the TUI's :class:`tui.admin.AdminSource`.

It lives with the commands because it needs what the TUI may not import (pushing a signed document to the agent
goes through the transport). Each change is written into the fleet folder, signed with the CA key there, and
handed to this PC's agent, as those commands do without ``--push``; that agent gossips it to every member. The
file work runs in threads: the TUI's event loop never waits on the fleet folder's lock.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

from agent.addresses import format_address, parse_address
from agent.cli.fleet_cmd import local_ipv4, node_rows, voided_pin_lines
from agent.errors import FleetError, ShoalError
from agent.fleet import NodeIdentity
from agent.fleet.authority import FleetPaths
from agent.fleet.enrollment import DEFAULT_PORT, DEFAULT_TTL, create_token
from agent.node.running import running_agent
from discovery import control
from discovery.admin import current_fleet_document, edit_fleet_document, pin_node, push_document, revoke
from discovery.fleet_document import Pin, without_pin
from tui.admin import AdminOutcome, AdminOverview, EnrolledEntry, JoinInvite, PinEntry, Severity


def holds_fleet_key(fleet_dir: Path) -> bool:
    """Whether ``fleet_dir`` holds the fleet's CA key (``shoal fleet init`` made it there): only then may this
    PC's user administer the fleet."""
    paths = FleetPaths(fleet_dir)
    return paths.ca_key.is_file() and paths.ca_cert.is_file()


class FleetAdmin:
    """Administers the fleet whose CA is in ``fleet_dir``; changes go to the agent running with ``identity``."""

    def __init__(
        self, fleet_dir: Path, identity: NodeIdentity | None, enrollment: tuple[str, int] | None = None
    ) -> None:
        """``identity``: this PC's node identity, to reach its agent (None: changes are only written);
        ``enrollment``: where ``shoal fleet serve-enrollment`` listens, for the join command (default: this PC's
        first network address, port 7300, as ``shoal fleet token`` says)."""
        self.fleet_dir = fleet_dir
        self.identity = identity
        self.enrollment = enrollment

    async def overview(self) -> AdminOverview:
        return await asyncio.to_thread(self._overview)

    def _overview(self) -> AdminOverview:
        document = current_fleet_document(self.fleet_dir)
        note = ""
        try:
            rows = node_rows(self.fleet_dir)
        except FleetError as exc:  # none enrolled yet: the message says how to enroll one
            rows, note = [], str(exc)
        return AdminOverview(
            fleet_dir=str(self.fleet_dir),
            version=document.version,
            model=str(document.model) if document.model is not None else None,
            pins=tuple(PinEntry(p.node, p.stage, p.required) for p in document.pins),
            nodes=tuple(
                EnrolledEntry(
                    r.name,
                    r.node_id,
                    r.fingerprint,
                    f"{r.enrolled_at:%Y-%m-%d %H:%M}",
                    "issued" if r.how == "issued" else f"token {r.how}",
                    r.revoked,
                )
                for r in rows
            ),
            note=note,
        )

    async def pin(self, node: str, stage: int, prefer: bool) -> AdminOutcome:
        pin = Pin(node, stage, required=not prefer)
        document, signed = await asyncio.to_thread(pin_node, self.fleet_dir, pin)
        done = f"pinned stage {stage} to {node} ({'preferred' if prefer else 'required'}): version {document.version}"
        return await self._push(done, control.FleetDocumentOffer(signed))

    async def unpin(self, node: str) -> AdminOutcome:
        document, signed = await asyncio.to_thread(
            edit_fleet_document, self.fleet_dir, lambda doc, now: without_pin(doc, node, now)
        )
        return await self._push(f"unpinned {node}: version {document.version}", control.FleetDocumentOffer(signed))

    async def token(self) -> JoinInvite:
        token = await asyncio.to_thread(create_token, self.fleet_dir, DEFAULT_TTL, 1)
        expires = dt.datetime.now(dt.UTC) + DEFAULT_TTL
        note = ""
        address = self.enrollment
        if address is None:
            host = await asyncio.to_thread(local_ipv4)
            address = (host or "127.0.0.1", DEFAULT_PORT)
            if host is None:
                note = "This PC has no network address but loopback: `shoal fleet token --address` names another."
        where = format_address(address)
        return JoinInvite(
            command=f"shoal join {token}@{where}",
            token_id=token.token_id,
            expires=f"{expires:%Y-%m-%d %H:%M}",
            uses=1,
            note=note or f"It is redeemed while `shoal fleet serve-enrollment --listen {where}` runs on this PC.",
        )

    async def revoke(self, node: str, drop_pins: bool = False) -> AdminOutcome:
        done = await asyncio.to_thread(revoke, self.fleet_dir, node, drop_pins)
        names = ", ".join(sorted({r.name for r in done.added})) or node
        lines = [f"revoked {names}: revocation list version {done.revocations.version}", *voided_pin_lines(done)]
        outcome = await self._push("; ".join(lines), *done.messages)
        if done.voided and done.document is None and outcome.severity == "ok":
            return AdminOutcome(outcome.text, "warning")  # a void pin stays in the document: worth a look
        return outcome

    async def _push(self, done: str, *messages: control.FleetDocumentOffer | control.Revocations) -> AdminOutcome:
        """``done``, and whether this PC's agent took ``messages`` (a warning when they were not handed over)."""
        severity: Severity = "warning"
        if self.identity is None:
            return AdminOutcome(f"{done}; not handed to any agent: this PC has no node identity", severity)
        address = await asyncio.to_thread(running_agent, self.identity.cert.parent)
        if address is None:
            return AdminOutcome(f"{done}; no agent runs on this PC to hand it to (`--push HOST:PORT` does)", severity)
        details = []
        try:
            for message in messages:
                details.append(await push_document(parse_address(address), self.identity, message))
        except (ShoalError, OSError) as exc:
            return AdminOutcome(f"{done}; not handed to the agent at {address}: {exc}", severity)
        return AdminOutcome(f"{done}; the agent at {address}: {', '.join(details)}")
