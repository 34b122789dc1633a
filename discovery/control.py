"""The control channel's messages: what fleet members tell each other over their mutual-TLS links.

A control link is a ring connection whose HELLO names the role ``member``. After the HELLOs, each side sends
one ``hello`` message, then any of the others, as MEMBERS frames (JSON)::

    hello        {"kind": "hello", "announcement": {TXT properties}, "time": unix seconds, "revocations": version,
                  "fleet": version, "member_for": seconds or null, "up": seconds}
                                      versions of the signed documents held; how long the sender has been a member
                                      and running, by its monotonic clock (which of two copies keeps an identity)
    update       {"kind": "update", "announcement": {...}}           the sender's state changed
    gossip       {"kind": "gossip", "members": [{"host": ..., "announcement": {...}}, ...]}
    revocations  {"kind": "revocations", "document": "<the signed revocation list, base64>"}
    fleet        {"kind": "fleet", "document": "<the signed fleet document, base64>"}
    plan         {"kind": "plan", "plan": {...}, "back": true?}       the coordinator's plan (``discovery.plan_codec``);
                                      ``back``: a follower's plan, newer than its coordinator's, sent back to it
    refused      {"kind": "refused", "reason": "...", "holder": {"host": ..., "announcement": {...}}}
                                      the link is about to close, and why; ``holder``, if the sender already
                                      holds a link to another process with the refused one's node id: where
    leave        {"kind": "leave"}                                    the sender stops on purpose
    ack          {"kind": "ack", "detail": "..."}                     an admin's push was taken

An admin's tool (``shoal fleet revoke --push``, ``shoal fleet serve``, ``shoal pin``) opens a link of the role
``admin`` instead: it sends ``revocations`` or ``fleet`` and gets ``ack`` or ``refused``. What it pushes is
signed by the fleet CA, so the link
needs no more trust than any member's.

A clock probe is a link of the role ``clock``: an agent by whose clock a peer's certificate is not yet valid (or
has expired) dials it again without checking the dates, each side sends one ``hello`` (its time), both judge
the two clocks (``discovery.clocks``) and the link closes. It never carries anything else.

Gossip is how one seed is enough on a network without multicast: every member tells its links whom it
knows, and each dials those it has not verified itself. A gossiped peer is a claim like an mDNS one; only
its own TLS handshake makes it a member.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from agent.errors import RemoteProtocolError
from agent.wire import Frame, FrameType
from agent.wire.jsonbody import loads_json
from discovery.announcement import Announcement

MAX_GOSSIP = 1024
"""Members one gossip message may name (a fleet is an office: this is far above any)."""


@dataclass(frozen=True)
class Hello:
    announcement: Announcement
    time: float
    """The sender's wall clock, Unix seconds: a receiver can tell the skew between their clocks."""
    revocations: int = 0
    """Version of the revocation list the sender holds (0: none)."""
    fleet: int = 0
    """Version of the fleet document the sender holds (0: none)."""
    member_for: float | None = None
    """Seconds since a member first accepted the sender's control link (None: none has yet)."""
    up_for: float = 0.0
    """Seconds since the sender's process started (its monotonic clock, not its wall clock)."""


@dataclass(frozen=True)
class Update:
    announcement: Announcement


@dataclass(frozen=True)
class GossipEntry:
    host: str
    announcement: Announcement


@dataclass(frozen=True)
class Gossip:
    members: tuple[GossipEntry, ...]


@dataclass(frozen=True)
class Revocations:
    document: bytes


@dataclass(frozen=True)
class FleetDocumentOffer:
    document: bytes


@dataclass(frozen=True)
class PlanOffer:
    """The plan the sender follows, as ``discovery.plan_codec`` writes it (checked by its reader)."""

    plan: dict[str, Any]
    sent_back: bool = False
    """A follower's plan, newer than the one its coordinator offers, sent back for the coordinator to adopt
    (``discovery.plan_service.supersedes``); else the sender's own plan, as the coordinator."""


@dataclass(frozen=True)
class Refused:
    reason: str
    holder: GossipEntry | None = None
    """The other process with the refused one's node id that the sender holds a link to (a copied identity)."""


@dataclass(frozen=True)
class Leave:
    pass


@dataclass(frozen=True)
class Ack:
    detail: str


ControlMessage = Hello | Update | Gossip | Revocations | FleetDocumentOffer | PlanOffer | Refused | Leave | Ack


def to_frame(message: ControlMessage) -> Frame:
    """The MEMBERS frame that carries ``message``."""
    body: dict[str, Any]
    match message:
        case Hello():
            body = {
                "kind": "hello",
                "announcement": message.announcement.to_properties(),
                "time": message.time,
                "revocations": message.revocations,
                "fleet": message.fleet,
                "member_for": message.member_for,
                "up": message.up_for,
            }
        case Update():
            body = {"kind": "update", "announcement": message.announcement.to_properties()}
        case Gossip():
            members = [{"host": e.host, "announcement": e.announcement.to_properties()} for e in message.members]
            body = {"kind": "gossip", "members": members}
        case Revocations():
            body = {"kind": "revocations", "document": base64.b64encode(message.document).decode()}
        case FleetDocumentOffer():
            body = {"kind": "fleet", "document": base64.b64encode(message.document).decode()}
        case PlanOffer():
            body = {"kind": "plan", "plan": message.plan}
            if message.sent_back:  # only then: a reader that predates it takes the message as before
                body["back"] = True
        case Refused():
            body = {"kind": "refused", "reason": message.reason}
            if message.holder is not None:
                body["holder"] = {
                    "host": message.holder.host,
                    "announcement": message.holder.announcement.to_properties(),
                }
        case Leave():
            body = {"kind": "leave"}
        case Ack():
            body = {"kind": "ack", "detail": message.detail}
    return Frame.message(FrameType.MEMBERS, json.dumps(body, separators=(",", ":")).encode())


def from_frame(frame: Frame) -> ControlMessage:
    """The message of a MEMBERS frame; :class:`RemoteProtocolError` for anything malformed."""
    if frame.type is not FrameType.MEMBERS:
        raise RemoteProtocolError(f"a control link carries MEMBERS frames, not {frame.type.name}")
    try:
        body = loads_json(frame.body())
    except ValueError as exc:  # UnicodeDecodeError and too deep a nesting too
        raise RemoteProtocolError("MEMBERS: body is not JSON") from exc
    if not isinstance(body, dict):
        raise RemoteProtocolError("MEMBERS: body is not a JSON object")
    kind = body.get("kind")
    if kind == "hello":
        fleet = int(_number(body, "fleet")) if "fleet" in body else 0
        member_for = _duration(body, "member_for") if body.get("member_for") is not None else None
        up_for = _duration(body, "up") if "up" in body else 0.0
        revocations = int(_number(body, "revocations"))
        return Hello(_announcement(body), _number(body, "time"), revocations, fleet, member_for, up_for)
    if kind == "update":
        return Update(_announcement(body))
    if kind == "gossip":
        entries = body.get("members")
        if not isinstance(entries, list) or len(entries) > MAX_GOSSIP:
            raise RemoteProtocolError(f"MEMBERS gossip: 'members' must be a list of at most {MAX_GOSSIP}")
        return Gossip(tuple(GossipEntry(_host(e), _announcement(e)) for e in entries))
    if kind == "revocations":
        return Revocations(_document(body, kind))
    if kind == "fleet":
        return FleetDocumentOffer(_document(body, kind))
    if kind == "plan":
        plan = body.get("plan")
        if not isinstance(plan, dict):
            raise RemoteProtocolError("MEMBERS plan: 'plan' must be an object")
        return PlanOffer(plan, body.get("back") is True)
    if kind == "refused":
        reason = body.get("reason")
        holder = body.get("holder")
        entry = GossipEntry(_host(holder), _announcement(holder)) if holder is not None else None
        return Refused(reason[:500] if isinstance(reason, str) else "no reason given", entry)
    if kind == "leave":
        return Leave()
    if kind == "ack":
        detail = body.get("detail")
        return Ack(detail[:500] if isinstance(detail, str) else "")
    raise RemoteProtocolError(f"MEMBERS: unknown kind {kind!r}")


def _document(body: dict[str, Any], kind: str) -> bytes:
    document = body.get("document")
    if not isinstance(document, str):
        raise RemoteProtocolError(f"MEMBERS {kind}: 'document' must be base64 text")
    try:
        return base64.b64decode(document, validate=True)
    except ValueError as exc:  # binascii.Error, or a character outside ASCII
        raise RemoteProtocolError(f"MEMBERS {kind}: 'document' is not base64") from exc


def _announcement(body: Any) -> Announcement:
    if not isinstance(body, dict) or not isinstance(body.get("announcement"), dict):
        raise RemoteProtocolError("MEMBERS: 'announcement' must be an object")
    return Announcement.from_properties(body["announcement"])


def _number(body: dict[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RemoteProtocolError(f"MEMBERS: {key!r} must be a number")
    try:
        number = float(value)
    except OverflowError as exc:  # an integer of hundreds of digits
        raise RemoteProtocolError(f"MEMBERS: {key!r} is out of range") from exc
    if not math.isfinite(number):  # json reads Infinity, NaN and 1e999: no count, time or duration
        raise RemoteProtocolError(f"MEMBERS: {key!r} must be a finite number")
    return number


def _duration(body: dict[str, Any], key: str) -> float:
    value = _number(body, key)
    if not 0 <= value < 1e10:
        raise RemoteProtocolError(f"MEMBERS: {key!r} must be a number of seconds")
    return value


def _host(entry: Any) -> str:
    host = entry.get("host") if isinstance(entry, dict) else None
    if not isinstance(host, str) or not 0 < len(host) <= 255:
        raise RemoteProtocolError("MEMBERS gossip: each member needs a 'host'")
    return host
