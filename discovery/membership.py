"""Fleet membership as a pure function: ``apply(event, state) -> state`` over immutable values.

The daemon (``discovery.service``) turns what happens on the network into events and feeds them here; this
module decides who is a member. Nothing in it does I/O or reads a clock: every event carries its time.

States of a known peer::

    unverified --Verified--> member --LinkBroken / unheard for lost_after--> lost --Verified/Heartbeat--> member
        |                      |
        |                      +--Left (a goodbye)--> gone --Seen/Verified of a new process--> unverified/member
        +--(another fleet or protocol)--> foreign                 any --Revoked--> revoked (for good)

- *unverified*: found (mDNS, gossip) but not yet proven by a mutual-TLS handshake: a claim only. When the
  handshake cannot succeed until people act (a clock set days wrong: ``Unlinkable``), ``why`` says so.
- *member*: its TLS control link is up and it was heard within ``lost_after``.
- *lost*: unheard for ``lost_after``, or its link broke without a goodbye (a crash, a cut cable).
- *gone*: it said goodbye (a clean stop).
- *foreign*: of another fleet or an incompatible protocol: listed, never used.
- *revoked*: its certificate is on the fleet's revocation list.

One identity folder copied to a second PC gives two processes with one node id. The two decide between them,
each alike, which keeps the identity (:func:`outranks`): the one a member accepted first, as the members saw it,
never the one whose wall clock says it started first. Every other member keeps its link to the process it
already holds and refuses the other, and a ``Left`` or ``LinkBroken`` of another process than the one held
changes nothing: a copy that lost can never mark the node gone.

Liveness comes from the TLS links only, never from mDNS: a killed process sends no goodbye, and its mDNS
record outlives it by 1,125 s (``../shared/tools/netlab/NOTES.md``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from discovery.announcement import SCHEMA, Announcement

LOST_AFTER = 10.0
"""Seconds a member may stay unheard before it counts as lost (``lost_after``)."""


class MemberState(enum.StrEnum):
    UNVERIFIED = "unverified"
    MEMBER = "member"
    LOST = "lost"
    GONE = "gone"
    FOREIGN = "foreign"
    REVOKED = "revoked"


class Source(enum.StrEnum):
    """How a peer was found."""

    MDNS = "mdns"
    SEED = "seed"
    GOSSIP = "gossip"
    INBOUND = "inbound"
    """It dialled us."""


@dataclass(frozen=True)
class Member:
    """What this agent knows of one peer."""

    announcement: Announcement
    state: MemberState
    host: str
    """The address it was last reached or announced at (its port is the announcement's)."""
    found: frozenset[Source]
    last_heard: float | None = None
    """When its TLS link last brought anything (None: never verified)."""
    why: str = ""
    """Why it is in its state, for people (``lost``: unheard for 10.2 s; ``foreign``: another fleet)."""

    @property
    def node(self) -> str:
        return self.announcement.node

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.announcement.port


# -- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    """A peer was announced (mDNS, or a member's gossip): a claim to check, not a proof of life."""

    announcement: Announcement
    host: str
    via: Source
    at: float


@dataclass(frozen=True)
class Verified:
    """A peer passed the mutual-TLS handshake and announced itself on its control link."""

    announcement: Announcement
    host: str
    via: Source
    at: float


@dataclass(frozen=True)
class Seniority:
    """How long one process has held its identity, as its control hello tells it (``discovery.control``).

    Of two processes with one node id, the senior keeps it (:func:`outranks`). Both durations come from the
    process's monotonic clock: a wall clock set minutes wrong moves neither."""

    instance: str
    """The process's random nonce (the announcement's ``instance``): what decides at the very same moment."""
    member_for: float | None
    """Seconds since a fleet member first accepted its control link (None: none has yet)."""
    up_for: float
    """Seconds since the process started."""


def outranks(mine: Seniority, theirs: Seniority) -> bool:
    """Whether the process of ``mine`` keeps the identity over the one of ``theirs``.

    The one a member accepted first wins; of two no member accepted yet, the one running longer (an agent
    alone in its fleet against a copy that just dialled it); at the very same moment, the lower nonce. Both
    processes call this with the two hellos of their link, swapped, and get opposite answers: exactly one
    yields, whatever their clocks say."""
    ours = (mine.member_for is not None, mine.member_for or 0.0, mine.up_for)
    others = (theirs.member_for is not None, theirs.member_for or 0.0, theirs.up_for)
    if ours != others:
        return ours > others
    return mine.instance < theirs.instance


@dataclass(frozen=True)
class Duplicate:
    """Another process with this agent's own node id passed the TLS handshake: its identity folder was copied.

    ``mine`` and ``theirs`` are what the two hellos of that link told (:class:`Seniority`)."""

    announcement: Announcement
    mine: Seniority
    theirs: Seniority
    at: float


@dataclass(frozen=True)
class Heartbeat:
    """Something arrived on a member's control link."""

    node: str
    at: float


@dataclass(frozen=True)
class LinkBroken:
    """A member's control link ended without a goodbye."""

    node: str
    at: float
    reason: str
    instance: str
    """The process the link was with: a link of another process than the one held says nothing of it."""


@dataclass(frozen=True)
class Left:
    """A member said goodbye: it stopped on purpose."""

    node: str
    at: float
    instance: str
    """The process that said it: only the process held can say goodbye for its node."""


@dataclass(frozen=True)
class Tick:
    """Time passed: members unheard for ``lost_after`` become lost."""

    now: float


@dataclass(frozen=True)
class Revoked:
    """The fleet's revocation list now names these node ids."""

    nodes: frozenset[str]
    at: float


@dataclass(frozen=True)
class Unlinkable:
    """A peer that is not a member now cannot become one until people act, and why (its clock, or this PC's, is
    set so wrong that a certificate is refused: ``discovery.clocks``). It stays what it is, with that reason."""

    node: str
    why: str
    at: float


Event = Seen | Verified | Duplicate | Heartbeat | LinkBroken | Left | Tick | Revoked | Unlinkable


# -- state ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Membership:
    """Everything this agent knows of its fleet's members, as of the last event applied."""

    me: Announcement
    lost_after: float = LOST_AFTER
    members: Mapping[str, Member] = field(default_factory=lambda: MappingProxyType({}))
    revoked: frozenset[str] = frozenset()
    duplicate: Announcement | None = None
    """Another running agent with this agent's own node id (its identity folder was copied)."""
    yields_to_duplicate: bool = False
    """Whether this agent lost the seniority check to a duplicate (:func:`outranks`), and so must stop."""

    def __post_init__(self) -> None:
        if self.lost_after <= 0:
            raise ValueError("lost_after must be positive")

    def get(self, node: str) -> Member | None:
        return self.members.get(node)

    def in_state(self, *states: MemberState) -> list[Member]:
        """The known peers in any of ``states``, by node id."""
        return [m for _, m in sorted(self.members.items()) if m.state in states]


def foreign_reason(me: Announcement, peer: Announcement) -> str | None:
    """Why ``peer`` can never be a member of ``me``'s fleet, or None if it can."""
    if peer.schema != SCHEMA:
        return f"announces schema {peer.schema}, this agent reads {SCHEMA}"
    if peer.fleet != me.fleet:
        return f"of fleet {peer.fleet}, not {me.fleet}"
    if peer.protocol != me.protocol:
        return f"speaks protocol {peer.protocol}, this agent {me.protocol}"
    return None


def apply(event: Event, state: Membership) -> Membership:
    """The membership after ``event``. Pure: the same event and state always give the same result."""
    if isinstance(event, Tick):
        return _tick(event.now, state)
    if isinstance(event, Revoked):
        return _revoke(event, state)
    if isinstance(event, Seen | Verified):
        return _announced(event, state)
    if isinstance(event, Duplicate):
        return _duplicate(event, state)
    member = state.members.get(event.node)
    if member is None or member.state in (MemberState.REVOKED, MemberState.FOREIGN):
        return state
    if isinstance(event, Unlinkable):
        if member.state not in (MemberState.UNVERIFIED, MemberState.LOST) or member.why == event.why:
            return state  # a member's link is up (its certificates were checked when it came up)
        return _put(state, replace(member, why=event.why))
    if isinstance(event, LinkBroken | Left) and event.instance != member.announcement.instance:
        return state  # another process with this node id (a copy that lost the duplicate check) speaks not for it
    if isinstance(event, Heartbeat):
        if member.state in (MemberState.UNVERIFIED, MemberState.GONE):
            return state  # only a verified link's traffic counts; a peer that said goodbye is done with it
        return _put(state, replace(member, state=MemberState.MEMBER, last_heard=event.at, why=""))
    if isinstance(event, LinkBroken):
        if member.state is not MemberState.MEMBER:
            return state
        return _put(state, replace(member, state=MemberState.LOST, why=event.reason))
    # Left
    if member.state is MemberState.UNVERIFIED:
        return state
    return _put(state, replace(member, state=MemberState.GONE, why="said goodbye"))


def _announced(event: Seen | Verified, state: Membership) -> Membership:
    peer = event.announcement
    if peer.node == state.me.node:
        return state  # ourselves (a seed or gossip naming this agent), or another process: a Duplicate event
    member = state.members.get(peer.node)
    verified = isinstance(event, Verified)
    if member is not None:
        if member.state is MemberState.REVOKED:
            return state
        if member.state is MemberState.GONE and peer.instance == member.announcement.instance:
            return state  # a process that said goodbye is done (a link it opened while stopping proves nothing)
        held = member.announcement
        if not verified and peer.instance == held.instance and peer.sequence < held.sequence:
            # an older announcement than the one held (mDNS lags the control link): only how it was found is news
            if event.via in member.found:
                return state
            return _put(state, replace(member, found=member.found | {event.via}))
        if not verified and peer.instance != held.instance and member.state is MemberState.MEMBER:
            return state  # a claim about another process than the one linked (a copy's) changes nothing
        if member.state is MemberState.GONE and peer.instance != held.instance and not verified:
            # a new process of a peer that said goodbye: a claim to check again
            found = frozenset({event.via}) | member.found
            return _put(state, Member(peer, MemberState.UNVERIFIED, event.host, found, None, "came back"))
    if peer.node in state.revoked:
        found = frozenset({event.via}) | (member.found if member else frozenset())
        return _put(state, Member(peer, MemberState.REVOKED, event.host, found, None, "revoked by the fleet"))
    foreign = foreign_reason(state.me, peer)
    found = frozenset({event.via}) | (member.found if member is not None else frozenset())
    if foreign is not None:
        return _put(state, Member(peer, MemberState.FOREIGN, event.host, found, None, foreign))
    if verified:
        return _put(state, Member(peer, MemberState.MEMBER, event.host, found, event.at))
    if member is None:
        return _put(state, Member(peer, MemberState.UNVERIFIED, event.host, found))
    # a claim about a known peer: take its newer announcement, keep its state and where it was reached
    host = member.host if member.state is MemberState.MEMBER else event.host
    newer = peer if peer.sequence >= member.announcement.sequence else member.announcement
    return _put(state, replace(member, announcement=newer, host=host, found=found))


def _duplicate(event: Duplicate, state: Membership) -> Membership:
    peer = event.announcement
    if peer.node != state.me.node or peer.instance == state.me.instance:
        return state
    yields = state.yields_to_duplicate or not outranks(event.mine, event.theirs)
    return replace(state, duplicate=peer, yields_to_duplicate=yields)


def _tick(now: float, state: Membership) -> Membership:
    stale = [
        m
        for m in state.members.values()
        if m.state is MemberState.MEMBER and m.last_heard is not None and now - m.last_heard > state.lost_after
    ]
    if not stale:
        return state
    members = dict(state.members)
    for m in stale:
        members[m.node] = replace(m, state=MemberState.LOST, why=f"unheard for {now - (m.last_heard or now):.1f} s")
    return replace(state, members=MappingProxyType(members))


def _revoke(event: Revoked, state: Membership) -> Membership:
    members = dict(state.members)
    for node in event.nodes & members.keys():
        members[node] = replace(members[node], state=MemberState.REVOKED, why="revoked by the fleet")
    return replace(state, members=MappingProxyType(members), revoked=state.revoked | event.nodes)


def _put(state: Membership, member: Member) -> Membership:
    members = dict(state.members)
    members[member.node] = member
    return replace(state, members=MappingProxyType(members))


@dataclass(frozen=True)
class Change:
    """One peer's move from one state to another (what the daemon logs, one line each)."""

    node: str
    name: str
    before: MemberState | None
    after: MemberState
    why: str


def changes(before: Membership, after: Membership) -> list[Change]:
    """The peers whose state differs between two memberships (new peers included), by node id."""
    if before.members is after.members:
        return []
    found = []
    for node, member in sorted(after.members.items()):
        old = before.members.get(node)
        if old is None or old.state is not member.state:
            found.append(Change(node, member.announcement.name, old.state if old else None, member.state, member.why))
    return found
