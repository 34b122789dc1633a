"""``MembershipService``: the daemon part that keeps this agent's view of its fleet.

It turns what happens on the network into ``discovery.membership`` events and applies them; the decisions
(who is a member, lost, gone, foreign, revoked) are that pure function's. What it does itself:

- announces this agent over mDNS (``discovery.mdns``) and takes what it hears there as claims;
- dials every claimed or seeded peer over mutual TLS (a control link, ``discovery.control``), and keeps one
  link to each: the handshake and the certificate prove who a peer is; its heartbeats that it lives;
- accepts the control links that peers dial (through the stage server's listener: one port per agent);
- gossips the members it knows to every link, so that one seed is enough without multicast;
- passes on the fleet's signed documents (the revocation list, the fleet document) to every link, keeping the
  newest of each, and hands the plan messages of its links to the fleet plan (``discovery.plan_service``);
- notices a second agent running with this agent's own identity: the two decide which keeps it
  (``discovery.membership.outranks``: the one a member accepted first), and the other stops without a word
  for the node; a member that holds a link to one of the two refuses the other and tells it where the first is;
- when a peer's certificate fails on its dates by this PC's clock, probes the peer's clock: dials it again
  without checking the dates (role ``clock``), the two tell each other the time and close, and both record
  whose clock is wrong by how much (``discovery.clocks``): the peer stays unverified with that sentence as its
  ``why``, which the log (once, then at debug), ``shoal status``, the TUI and the plan's reasons show.

Its parts by role: ``discovery.links`` (the control links it holds), ``discovery.handshake`` (what a link's
handshake decides), ``discovery.clock_probe`` (what the clock probes learnt), ``discovery.mdns`` (python-zeroconf).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from cryptography import x509

from agent.errors import CertificateDatesError, FleetError, PeerUnavailableError, RemoteProtocolError
from agent.fleet.revocation import RevocationList
from agent.fleet.signed import Kept
from agent.transport.connection import FrameConnection, expect, send_quietly
from agent.transport.heartbeat import Heartbeat as LinkHeartbeat
from agent.transport.heartbeat import Liveness, pong
from agent.transport.network import Network
from agent.transport.tasks import OwnedTasks
from agent.wire import FrameType
from agent.wire.messages import Hello as WireHello
from discovery import control, handshake
from discovery.announcement import Announcement
from discovery.clock_probe import ClockProbes
from discovery.kept import FleetDocumentKeeper, RevocationKeeper
from discovery.links import Link, Links
from discovery.membership import (
    LOST_AFTER,
    Duplicate,
    Event,
    Heartbeat,
    Left,
    LinkBroken,
    Member,
    Membership,
    MemberState,
    Revoked,
    Seen,
    Source,
    Tick,
    Unlinkable,
    Verified,
    apply,
    changes,
    outranks,
)

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 5.0
DIAL_TIMEOUT = 3.0
TICK = 0.25
"""Seconds between two checks for members unheard for ``lost_after``."""
RETRY_FIRST, RETRY_MAX, RETRY_SEED = 0.5, 5.0, 1.0
"""Seconds before dialling an unreachable peer again: doubling from the first to the most (for a seed, to
``RETRY_SEED``)."""


@dataclass(frozen=True)
class MembershipSettings:
    """How an agent finds and watches its fleet's members."""

    seeds: tuple[tuple[str, int], ...] = ()
    """Peers to dial at start (``--peer``): on a network without multicast one is enough (gossip)."""
    mdns: bool = True
    lost_after: float = LOST_AFTER
    liveness: Liveness = field(default_factory=Liveness)
    """Heartbeats on each control link; a link silent for its timeout is dropped and redialled."""


class _Refusal(Exception):
    """A control handshake that ended on purpose: ``itself`` when the peer was this very agent."""

    def __init__(self, reason: str, itself: bool = False) -> None:
        super().__init__(reason)
        self.itself = itself


class MembershipService:
    """Keeps :attr:`state` (a ``Membership``) up to date; a ``DaemonPart`` named ``members``."""

    name = "members"

    def __init__(
        self,
        me: Announcement,
        network: Network,
        settings: MembershipSettings,
        *,
        mdns_addresses: list[str] | None = None,
        find_addresses: Callable[[], list[str]] | None = None,
        on_duplicate: Callable[[str], None] | None = None,
        revocations: RevocationKeeper | None = None,
        on_revoked: Callable[[frozenset[str]], None] | None = None,
        fleet: FleetDocumentKeeper | None = None,
        measure_speed: Callable[[], float] | None = None,
        certificates: tuple[x509.Certificate, x509.Certificate] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``mdns_addresses``: the IPv4 addresses to announce (needed with ``settings.mdns``);
        ``on_duplicate(message)``: called once if this agent must stop for an older one with its identity;
        ``revocations``: the fleet's revocation list as this agent keeps it; ``on_revoked(fingerprints)``: told
        every revoked certificate whenever the list grows (the network then refuses them, ring links too);
        ``fleet``: the fleet document as this agent keeps it;
        ``measure_speed``: this PC's speed figure, measured off the event loop once running, then announced;
        ``certificates``: this agent's certificate and the fleet CA's, whose dates the clock probe compares with a
        peer's clock (None: no probe); ``wall``: this PC's clock, as its TLS checks certificates by it."""
        self.state = Membership(me, settings.lost_after)
        self.settings = settings
        self._network = network
        self._clock = clock
        self._wall = wall
        self._began = clock()
        self._member_since: float | None = None
        """When a member first accepted this agent's control link (``Seniority.member_for``)."""
        self.on_duplicate = on_duplicate
        self._mdns_addresses = mdns_addresses or []
        self._find_addresses = find_addresses
        self._mdns: Any = None
        self._tasks = OwnedTasks()
        self._links = Links()
        self._dialling: set[tuple[str, int]] = set()
        self._retry: dict[tuple[str, int], tuple[float, float]] = {}
        """Address -> (earliest next dial, current back-off)."""
        self._seed_nodes: dict[tuple[str, int], str] = {}
        self._own_addresses: set[tuple[str, int]] = set()
        self._listening: tuple[str, int] | None = None
        self._claims: dict[tuple[str, int], Source] = {}
        """Addresses to dial once that announced our own node id (a copy of our identity, or a spoofer)."""
        self._announced: dict[str, Announcement] = {}
        """What each linked peer announced on its link (checked against its certificate), from its handshake until
        its last link ends: one process per node id (a second one is refused)."""
        self._wake = asyncio.Event()
        self._duplicates: dict[str, str] = {}
        """Instance of each process met with this agent's own node id -> where (``host:port``), for the log."""
        self._duplicate_reported = False
        self._stopping = False
        self.refused = 0
        self.revocations = revocations
        self._on_revoked = on_revoked
        self.fleet = fleet
        self.on_plan: Callable[[str, dict[str, Any], bool], None] | None = None
        """Told ``(sender node, plan message)`` for every plan a linked member sends (``discovery.plan_service``)."""
        self._measure_speed = measure_speed
        self._probes = ClockProbes(certificates)

    @property
    def me(self) -> Announcement:
        return self.state.me

    @property
    def roles(self) -> dict[str, Callable[[FrameConnection, WireHello], Awaitable[None]]]:
        """The agent's port hands this service the connections whose HELLO names the role ``member`` (control
        links) or ``admin`` (an admin's push)."""
        return {"member": self.accept, "admin": self.accept_admin, "clock": self.accept_clock}

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self, ring: tuple[str, int]) -> None:
        """Announce the agent's port ``ring`` over mDNS (unless turned off), then dial seeds and claims in the
        background."""
        self.state = replace(self.state, me=replace(self.me, port=ring[1]))
        self._own_addresses.add(ring)
        self._listening = ring
        if self.revocations is not None and self.revocations.current is not None:
            self._revoked(self.revocations.current)
        if self.settings.mdns:
            from discovery.mdns import MdnsDiscovery

            self._mdns = MdnsDiscovery(
                self.me, self._mdns_addresses, self._seen_over_mdns, find_addresses=self._find_addresses
            )
            await self._mdns.start()
        self._tasks.spawn(self._dial_loop())
        self._tasks.spawn(self._tick_loop())
        if self._measure_speed is not None:
            self._tasks.spawn(self._announce_speed(self._measure_speed))
        log.info(
            "node=%s membership started: fleet %s, seeds %s, mDNS %s",
            self.me.node,
            self.me.fleet,
            ", ".join(f"{h}:{p}" for h, p in self.settings.seeds) or "none",
            "on" if self._mdns is not None else "off",
        )

    async def stop(self) -> None:
        """Say ``leave`` on every link (peers mark this agent gone at once), then close them and mDNS. An agent
        that yields its identity to an older process says no ``leave``: that would speak for the other one."""
        self._stopping = True
        speak = not self.state.yields_to_duplicate
        await asyncio.gather(*(self._say_leave(link, speak) for link in self._links))
        await self._tasks.cancel_all()
        if self._mdns is not None:
            await self._mdns.stop()
            self._mdns = None

    async def _say_leave(self, link: Link, speak: bool) -> None:
        if speak:
            with contextlib.suppress(PeerUnavailableError):
                await link.connection.send(control.to_frame(control.Leave()))
        await link.connection.close(goodbye=True)

    async def announce(self, **changes: Any) -> None:
        """Change what this agent announces (stage states, donor state): every link and mDNS hear it."""
        self.state = replace(self.state, me=self.me.changed(**changes))
        frame = control.to_frame(control.Update(self.me))
        for link in self._links:
            await send_quietly(link.connection, frame)
        if self._mdns is not None:
            await self._mdns.update(self.me)

    async def _announce_speed(self, measure: Callable[[], float]) -> None:
        speed = await asyncio.get_running_loop().run_in_executor(None, measure)
        await self.announce(speed=round(speed, 1))

    def _revoked(self, revocations: RevocationList) -> None:
        """The fleet's revocation list is ``revocations``: mark its nodes, drop their links and certificates."""
        nodes = frozenset(r.node_id for r in revocations.revoked)
        self._feed(Revoked(nodes, self._clock()))
        if self._on_revoked is not None:
            self._on_revoked(frozenset(r.fingerprint for r in revocations.revoked))
        for link in self._links:
            if link.node in nodes:
                link.connection.abort()

    async def _offered(self, message: control.Revocations | control.FleetDocumentOffer, where: str) -> str:
        """Take a signed document a peer or admin sent, if it is validly signed and newer, and pass it on to
        every link; returns what became of it. :class:`FleetError` (logged, one line naming the peer) if it is
        not validly signed, or of another fleet."""
        revocations = isinstance(message, control.Revocations)
        keeper = cast(Kept[Any] | None, self.revocations if revocations else self.fleet)
        what = "revocation list" if revocations else "fleet document"
        if keeper is None:
            return f"this agent keeps no {what}"
        try:
            offered = keeper.verify(message.document)
        except FleetError as exc:
            log.warning("node=%s refused the %s from %s: %s", self.me.node, what, where, exc)
            raise
        if not offered.is_newer_than(keeper.current):
            if offered.version < keeper.version:  # the same version coming back is gossip's echo: no news
                log.warning(
                    "node=%s refused the %s version %d from %s: older than version %d held",
                    self.me.node,
                    what,
                    offered.version,
                    where,
                    keeper.version,
                )
            return f"not newer than version {keeper.version}"
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, keeper.keep, offered, message.document)
        if isinstance(offered, RevocationList):
            names = ", ".join(r.name for r in offered.revoked) or "none"
            log.info(
                "node=%s revocation list version %d from %s: revoked %s", self.me.node, offered.version, where, names
            )
            self._revoked(offered)
        else:
            log.info("node=%s fleet document version %d from %s: %s", self.me.node, offered.version, where, offered)
        self._links.send_all(control.to_frame(message), self._tasks)
        return f"version {offered.version} taken"

    def broadcast(self, message: control.ControlMessage) -> None:
        """Send ``message`` on every link (in the background: a slow peer holds up nobody)."""
        self._links.send_all(control.to_frame(message), self._tasks)

    def address_of(self, node: str) -> tuple[str, int] | None:
        """Where a member (or this agent: its own listening address) can be reached, as this agent knows it."""
        if node == self.me.node:
            return self._listening
        member = self.state.get(node)
        return member.address if member is not None else None

    # -- events --------------------------------------------------------------------------------
    def _feed(self, event: Event) -> None:
        before = self.state
        self.state = apply(event, before)
        for change in changes(before, self.state):
            log.info(
                "node=%s member %s (%s): %s -> %s%s",
                self.me.node,
                change.node,
                change.name,
                change.before or "new",
                change.after,
                f": {change.why}" if change.why else "",
            )
            if change.after is MemberState.MEMBER:
                self._gossip_about(change.node)
            if change.after in (MemberState.UNVERIFIED, MemberState.LOST):
                self._wake.set()
        duplicate = self.state.duplicate
        if duplicate is not None and (before.duplicate is None or before.duplicate.instance != duplicate.instance):
            self._duplicate_found(duplicate)

    def _seen_over_mdns(self, announcement: Announcement, host: str) -> None:
        self._seen(announcement, host, Source.MDNS)

    def _seen(self, announcement: Announcement, host: str, via: Source) -> None:
        if announcement.node == self.me.node and announcement.instance != self.me.instance:
            address = (host, announcement.port)
            if address not in self._own_addresses and address not in self._claims:
                self._claims[address] = via  # prove it (or not) with a handshake
                self._wake.set()
            return
        self._feed(Seen(announcement, host, via, self._clock()))

    def _duplicate_found(self, other: Announcement) -> None:
        where = self._duplicates.get(other.instance, "the LAN")
        if self.state.yields_to_duplicate:
            message = (
                f"another agent already runs with this PC's identity (node {other.node}, {other.name}) at {where}: "
                "this identity folder was copied from another PC. Give this PC its own identity: run `shoal fleet "
                "token` on the admin's PC, then `shoal join TOKEN@HOST:PORT` here (or `shoal fleet issue`)."
            )
            log.error("node=%s %s", self.me.node, message)
            if self.on_duplicate is not None and not self._duplicate_reported:
                self._duplicate_reported = True
                self.on_duplicate(message)
        else:
            log.warning(
                "node=%s refused a second agent with this node's identity at %s (a member later than this one): "
                "its identity folder is a copy of this PC's, and it stops",
                self.me.node,
                where,
            )

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self._feed(Tick(self._clock()))

    # -- dialling ------------------------------------------------------------------------------
    def _targets(self) -> dict[tuple[str, int], Source]:
        """The addresses to dial now: seeds, claims, and known peers without a link from here."""
        targets: dict[tuple[str, int], Source] = {}
        for seed in self.settings.seeds:
            node = self._seed_nodes.get(seed)
            if seed not in self._own_addresses and (node is None or node not in self._links.dialled):
                targets[seed] = Source.SEED
        targets.update(self._claims)
        for member in self.state.in_state(MemberState.UNVERIFIED, MemberState.MEMBER, MemberState.LOST):
            if member.node not in self._links.dialled:
                targets.setdefault(member.address, next(iter(sorted(member.found))))
        return targets

    async def _dial_loop(self) -> None:
        while True:
            now = self._clock()
            for address, via in self._targets().items():
                if address in self._dialling or self._retry.get(address, (0.0, 0.0))[0] > now:
                    continue
                self._dialling.add(address)
                self._tasks.spawn(self._dial(address, via))
            self._wake.clear()
            try:
                async with asyncio.timeout(RETRY_FIRST):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _dial(self, address: tuple[str, int], via: Source) -> None:
        connection: FrameConnection | None = None
        try:
            connection = await self._network.dial(
                address, label=f"member {address[0]}:{address[1]}", timeout=DIAL_TIMEOUT
            )
            await connection.send(WireHello(node=self.me.name, role="member").to_frame())
            await expect(connection, FrameType.HELLO, HANDSHAKE_TIMEOUT)
            ours = self._hello()
            await connection.send(control.to_frame(ours))
            link = await self._handshake(connection, address[0], via, ours, dialled=address)
        except _Refusal as refusal:
            self._dialling.discard(address)
            self._claims.pop(address, None)
            if refusal.itself:  # a seed or gossip naming this agent's own address
                self._own_addresses.add(address)
            else:
                self._retry[address] = (self._clock() + RETRY_MAX, RETRY_MAX)
            return
        except (PeerUnavailableError, RemoteProtocolError) as exc:
            self._dialling.discard(address)
            _, backoff = self._retry.get(address, (0.0, RETRY_FIRST / 2))
            # a seed the user named is likely just starting too: keep asking it often
            backoff = min(RETRY_SEED if via is Source.SEED else RETRY_MAX, backoff * 2)
            self._retry[address] = (self._clock() + backoff, backoff)
            log.debug("node=%s cannot reach member %s:%d: %s", self.me.node, *address, exc)
            if connection is not None:
                connection.abort()
            if isinstance(exc, CertificateDatesError) and self._probes.certificates is not None:
                self._tasks.spawn(self._probe_clock(address, via))
            return
        self._dialling.discard(address)
        self._retry.pop(address, None)
        self._claims.pop(address, None)
        if self._stopping:
            await connection.close(goodbye=True)
            return
        if via is Source.SEED:
            self._seed_nodes[address] = link.node
        if link.node in self._links.dialled:  # reached at a second address: one link is enough
            await connection.close(goodbye=True)
            return
        self._links.add(link)
        self._probes.readings.pop(link.node, None)
        self._feed(Verified(self._announced[link.node], link.host, via, self._clock()))
        await send_quietly(link.connection, control.to_frame(self._gossip()))
        self._tasks.spawn(self._run_link(link))

    # -- both directions -----------------------------------------------------------------------
    async def accept(self, connection: FrameConnection, hello: WireHello) -> None:
        """Serve a control link a peer dialled (the stage server hands over connections whose role is
        ``member``, after reading their HELLO)."""
        if self._stopping:  # the agent is leaving: its port still takes connections until the server stops
            await connection.close(goodbye=True)
            return
        try:
            await connection.send(WireHello(node=self.me.name, role="member").to_frame())
            ours = self._hello()
            await connection.send(control.to_frame(ours))
            host = connection.peer.rpartition(":")[0]
            link = await self._handshake(connection, host, Source.INBOUND, ours)
        except _Refusal:
            return
        except (PeerUnavailableError, RemoteProtocolError) as exc:
            log.warning("node=%s control link from %s failed: %s", self.me.node, connection.peer, exc)
            connection.abort()
            return
        self._links.add(link)
        self._probes.readings.pop(link.node, None)
        self._feed(Verified(self._announced[link.node], link.host, Source.INBOUND, self._clock()))
        await send_quietly(link.connection, control.to_frame(self._gossip()))
        await self._run_link(link)

    # -- clocks --------------------------------------------------------------------------------
    async def _probe_clock(self, address: tuple[str, int], via: Source) -> None:
        """The peer at ``address`` failed this agent's TLS check on its certificate's dates: dial it once more
        without checking them, tell each other the time, and judge (both ends do); the probe link is closed then,
        whatever it found: it never carries anything else."""
        where = f"{address[0]}:{address[1]}"
        try:
            connection = await self._network.dial(
                address, label=f"clock probe {where}", timeout=DIAL_TIMEOUT, check_dates=False
            )
        except PeerUnavailableError as exc:
            log.debug("node=%s cannot probe the clock of %s: %s", self.me.node, where, exc)
            return
        try:
            await connection.send(WireHello(node=self.me.name, role="clock").to_frame())
            await expect(connection, FrameType.HELLO, HANDSHAKE_TIMEOUT)
            await connection.send(control.to_frame(self._hello()))
            if await self._judge_clock(connection, address[0], via):
                self._retry[address] = (self._clock() + RETRY_MAX, RETRY_MAX)  # people must act: no hurry
        except (PeerUnavailableError, RemoteProtocolError) as exc:
            log.debug("node=%s clock probe of %s failed: %s", self.me.node, where, exc)
        finally:
            await connection.close(goodbye=True)

    async def accept_clock(self, connection: FrameConnection, hello: WireHello) -> None:
        """Answer a peer's clock probe (a peer by whose clock this agent's certificate failed on its dates): tell
        it the time, read its own, judge, and close."""
        try:
            await connection.send(WireHello(node=self.me.name, role="clock").to_frame())
            await connection.send(control.to_frame(self._hello()))
            await self._judge_clock(connection, connection.peer.rpartition(":")[0], Source.INBOUND)
        except (PeerUnavailableError, RemoteProtocolError) as exc:
            log.debug("node=%s clock probe from %s failed: %s", self.me.node, connection.label, exc)
        finally:
            await connection.close(goodbye=True)

    async def _judge_clock(self, connection: FrameConnection, host: str, via: Source) -> bool:
        """Read the peer's control hello on a clock probe and record what its time and certificate mean
        (:func:`discovery.clocks.clock_problem`); returns whether the two cannot link."""
        message = control.from_frame(await expect(connection, FrameType.MEMBERS, HANDSHAKE_TIMEOUT))
        if not isinstance(message, control.Hello):
            raise RemoteProtocolError(f"{connection.label} sent {type(message).__name__} for its clock")
        peer = message.announcement
        problem = self._probes.judge(
            self.me, peer, connection.peer_certificate, message.time, self._wall(), self.state.revoked
        )
        if problem is None:
            return False
        log.log(
            logging.WARNING if self._probes.first_told(peer.node) else logging.DEBUG,
            "node=%s cannot link with %s (%s): %s",
            self.me.node,
            peer.node,
            peer.name,
            problem,
        )
        self._feed(Seen(peer, host, via, self._clock()))
        self._feed(Unlinkable(peer.node, problem, self._clock()))
        return True

    async def accept_admin(self, connection: FrameConnection, hello: WireHello) -> None:
        """Serve an admin's push (a signed revocation list) until it says goodbye."""
        try:
            await connection.send(WireHello(node=self.me.name, role="admin").to_frame())
            while True:
                async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                    frame = await connection.receive()
                if frame.type is FrameType.GOODBYE:
                    return
                message = control.from_frame(frame)
                if not isinstance(message, control.Revocations | control.FleetDocumentOffer):
                    raise RemoteProtocolError(f"an admin link carries signed documents, not {type(message).__name__}")
                try:
                    who = f"admin {hello.node} ({connection.label})"
                    reply: control.ControlMessage = control.Ack(await self._offered(message, who))
                except FleetError as exc:
                    reply = control.Refused(str(exc))
                await connection.send(control.to_frame(reply))
        except (PeerUnavailableError, RemoteProtocolError, TimeoutError) as exc:
            log.warning(
                "node=%s admin link %s ended: %s", self.me.node, connection.label, str(exc) or type(exc).__name__
            )
        finally:
            if not connection.closed:
                await connection.close(goodbye=True)

    async def _handshake(
        self,
        connection: FrameConnection,
        host: str,
        via: Source,
        sent: control.Hello,
        dialled: tuple[str, int] | None = None,
    ) -> Link:
        """Read the peer's control hello (``sent``: this agent's on the link) and check it against its certificate;
        :class:`_Refusal` if refused. ``dialled``: the address this agent dialled (an outbound link)."""
        message = control.from_frame(await expect(connection, FrameType.MEMBERS, HANDSHAKE_TIMEOUT))
        if not isinstance(message, control.Hello):
            raise RemoteProtocolError(f"{connection.label} sent {type(message).__name__} before its hello")
        peer = message.announcement
        refusal = handshake.refusal(connection.peer_certificate, peer, self.me, self.state.revoked, self._announced)
        duplicate = None
        if refusal == handshake.SAME_IDENTITY:
            # the two hellos of this link decide, alike at both ends, which process keeps the identity
            duplicate = Duplicate(peer, handshake.seniority(sent), handshake.seniority(message), self._clock())
            self._duplicates[peer.instance] = f"{host}:{peer.port}"
            refusal = handshake.duplicate_refusal(peer, outranks(duplicate.mine, duplicate.theirs))
        if refusal is None:
            self._announced[peer.node] = peer  # before any await: a second process of this node is refused now
            if (
                self.revocations is not None
                and self.revocations.document
                and message.revocations < self.revocations.version
            ):
                await send_quietly(connection, control.to_frame(control.Revocations(self.revocations.document)))
            if self.fleet is not None and self.fleet.document and message.fleet < self.fleet.version:
                await send_quietly(connection, control.to_frame(control.FleetDocumentOffer(self.fleet.document)))
            outbound = dialled is not None
            skew = message.time - self._wall()
            return Link(peer.node, peer.instance, host, connection, outbound, via, skew, dialled)
        itself = refusal == handshake.ITSELF
        if not itself:
            self.refused += 1
            log.warning("node=%s refused member link with %s: %s", self.me.node, connection.label, refusal)
            reply = control.Refused(refusal, self._holder_other_than(peer))
            await send_quietly(connection, control.to_frame(reply))
        await connection.close(goodbye=True)
        if duplicate is not None:
            self._feed(duplicate)
        raise _Refusal(refusal, itself)

    def _holder_other_than(self, peer: Announcement) -> control.GossipEntry | None:
        """Where the process of ``peer``'s node id that this agent holds a link to is, if it is not ``peer``'s."""
        held = self._announced.get(peer.node)
        if held is None or held.instance == peer.instance:
            return None
        host = next((link.host for link in self._links if link.node == peer.node), None)
        return None if host is None else control.GossipEntry(host, held)

    async def _run_link(self, link: Link) -> None:
        """Read one link until it ends; heartbeats from the dialling side."""
        connection = link.connection
        beat = LinkHeartbeat(connection, self.settings.liveness, self.me.node) if link.outbound else None
        pinger = self._tasks.spawn(beat.run()) if beat is not None else None
        reason = ""
        timeout = None if link.outbound else self.settings.liveness.timeout
        try:
            while True:
                async with asyncio.timeout(timeout):
                    frame = await connection.receive()
                if frame.type is FrameType.GOODBYE:
                    return
                if beat is not None:
                    beat.heard(frame)
                self._feed(Heartbeat(link.node, self._clock()))
                message = control.from_frame(frame) if frame.type is FrameType.MEMBERS else None
                if not link.accepted and not isinstance(message, control.Refused):
                    self._accepted(link)
                if frame.type is FrameType.PING:
                    await connection.send(pong(frame))
                elif message is not None:
                    await self._on_message(link, message)
        except TimeoutError:
            reason = f"{connection.label} sent nothing for {timeout} s, not even a heartbeat"
        except PeerUnavailableError as exc:
            reason = (beat.lost if beat is not None and beat.lost else None) or str(exc)
        except RemoteProtocolError as exc:
            reason = f"protocol error: {exc}"
            log.warning("node=%s dropped member link %s: %s", self.me.node, connection.label, exc)
        finally:
            if pinger is not None:
                pinger.cancel()
            self._links.forget(link)
            if not self._links.linked(link.node):
                self._announced.pop(link.node, None)  # another process of the node may link now
            if not connection.closed:
                await connection.close(goodbye=False)
        # the last link to a peer broke without a goodbye: a crash or a cut (its other link, if any, decides)
        if reason and not self._stopping and not self._links.linked(link.node):
            why = f"link broke without a goodbye: {reason}"
            self._feed(LinkBroken(link.node, self._clock(), why, link.instance))
            self._wake.set()

    def _accepted(self, link: Link) -> None:
        """The peer of ``link`` accepted this agent: from the first such link on, this agent is a member."""
        link.accepted = True
        if self._member_since is None:
            self._member_since = self._clock()

    async def _on_message(self, link: Link, message: control.ControlMessage) -> None:
        now = self._clock()
        match message:
            case control.Update(announcement=peer):
                if peer.node != link.node or peer.instance != link.instance:
                    raise RemoteProtocolError(f"an update about node {peer.node} on the link of {link.node}")
                self._announced[peer.node] = peer
                self._feed(Verified(peer, link.host, link.via, now))
            case control.Gossip(members=entries):
                for entry in entries:
                    self._seen(entry.announcement, entry.host, Source.GOSSIP)
            case control.Leave():
                self._feed(Left(link.node, now, link.instance))
            case control.Refused(reason=reason, holder=holder):
                log.warning("node=%s member %s refused this agent: %s", self.me.node, link.node, reason)
                self._feed(LinkBroken(link.node, now, f"refused this agent: {reason}", link.instance))
                if link.dialled is not None:  # not again at once: what refused it is not over in a second
                    self._retry[link.dialled] = (now + RETRY_MAX, RETRY_MAX)
                if holder is not None and holder.announcement.node == self.me.node:
                    # it holds another process with this agent's identity: meet it, and the two decide
                    self._seen(holder.announcement, holder.host, Source.GOSSIP)
            case control.Revocations() | control.FleetDocumentOffer():
                with contextlib.suppress(FleetError):  # logged; a bad document from a member does not cut its link
                    await self._offered(message, f"member {link.node} ({link.connection.label})")
            case control.PlanOffer(plan=plan, sent_back=sent_back):
                if self.on_plan is not None:
                    self.on_plan(link.node, plan, sent_back)
            case control.Ack():
                pass
            case control.Hello():
                raise RemoteProtocolError("a second hello on one link")

    # -- messages ------------------------------------------------------------------------------
    def _hello(self) -> control.Hello:
        now = self._clock()
        return control.Hello(
            self.me,
            self._wall(),
            self.revocations.version if self.revocations else 0,
            self.fleet.version if self.fleet else 0,
            None if self._member_since is None else round(now - self._member_since, 3),
            round(now - self._began, 3),
        )

    def _gossip(self) -> control.Gossip:
        members = self.state.in_state(MemberState.MEMBER)
        return control.Gossip(tuple(control.GossipEntry(m.host, m.announcement) for m in members))

    def _gossip_about(self, node: str) -> None:
        member = self.state.get(node)
        if member is None:
            return
        frame = control.to_frame(control.Gossip((control.GossipEntry(member.host, member.announcement),)))
        self._links.send_all(frame, self._tasks, but=node)

    # -- status --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The ``members`` section of the agent's status."""
        now = self._clock()
        skews = {node: reading.skew for node, reading in self._probes.readings.items()}
        skews.update({link.node: link.skew for link in self._links})
        problems = {node: reading.problem for node, reading in self._probes.readings.items() if reading.problem}
        return {
            "node": self.me.node,
            "name": self.me.name,
            "fleet": self.me.fleet,
            "lost_after": self.state.lost_after,
            "seeds": [f"{h}:{p}" for h, p in self.settings.seeds],
            "mdns": self._mdns.status() if self._mdns is not None else None,
            "refused": self.refused,
            "members": [
                _member_status(m, now, skews.get(m.node), problems.get(m.node)) for m in self.state.members.values()
            ],
        }


def _member_status(member: Member, now: float, skew: float | None, clock: str | None) -> dict[str, Any]:
    a = member.announcement
    return {
        "node": member.node,
        "name": a.name,
        "state": str(member.state),
        "address": f"{member.host}:{a.port}",
        "last_heard": None if member.last_heard is None else round(now - member.last_heard, 2),
        "found": sorted(str(s) for s in member.found),
        "why": member.why,
        "clock_skew": None if skew is None else round(skew, 3),
        "clock": clock if member.state is not MemberState.MEMBER else None,
        "announces": {
            "version": a.version,
            "protocol": a.protocol,
            "fleet": a.fleet,
            "devices": list(a.devices),
            "memory_mb": a.memory_mb,
            "speed": a.speed,
            "stages": [s.to_text() for s in a.stages],
            "donor": a.donor,
        },
    }
