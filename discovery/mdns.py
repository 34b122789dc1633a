"""mDNS with python-zeroconf's asyncio API: announce this agent, and report every agent announced near it.

What was measured on this machine (``../shared/tools/netlab/NOTES.md`` §2) shapes it:

- a browser sends only a few start-up queries, so a peer that comes back after a partition is not asked
  for again: the announcement is re-sent every ``reannounce`` seconds, and at once on every change;
- a killed process sends no goodbye and its record lives on for 1,125 s: nothing here decides liveness,
  which is the control links' job (``discovery.membership``);
- interfaces come and go (a laptop's Wi-Fi, a VPN): they are rescanned every ``rescan`` seconds.

What arrives is a claim (anyone on the LAN can send mDNS): it is handed on as ``on_seen(announcement,
host)`` for the membership to verify over mutual TLS, never trusted as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from zeroconf import DNSQuestionType, IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from agent.errors import RemoteProtocolError
from agent.transport.tasks import OwnedTasks
from discovery.announcement import SERVICE_TYPE, Announcement

log = logging.getLogger(__name__)

REANNOUNCE = 5.0
"""Seconds between two announcements (a browser does not ask again for a peer after a partition)."""
RESCAN = 10.0
"""Seconds between two scans for network interfaces that appeared or went."""
RESOLVE_TIMEOUT_MS = 3000
QM = DNSQuestionType.QM
PROBE_TYPE = "_shoal-probe._tcp.local."
"""``shoal doctor``'s own announcement: does this PC hear its own multicast?"""
HOST_TTL = 15
"""Seconds peers cache this agent's address record: short, so a PC that moved is found at its new address."""


def instance_name(announcement: Announcement) -> str:
    """This agent's mDNS service name: its node name and id, so that two PCs never collide."""
    return f"{announcement.name}-{announcement.node}.{SERVICE_TYPE}"


class MdnsDiscovery:
    """Announces one agent over mDNS and browses for the others (IPv4)."""

    def __init__(
        self,
        announcement: Announcement,
        addresses: list[str],
        on_seen: Callable[[Announcement, str], None],
        *,
        reannounce: float = REANNOUNCE,
        rescan: float = RESCAN,
        find_addresses: Callable[[], list[str]] | None = None,
    ) -> None:
        """``addresses``: the IPv4 addresses to announce (those the agent listens on); ``find_addresses``: for an
        agent listening on every interface, how to find them again when the PC's addresses change."""
        self._announcement = announcement
        self._addresses = addresses
        self._find_addresses = find_addresses
        self._on_seen = on_seen
        self._reannounce = reannounce
        self._rescan = rescan
        self._zeroconf: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._tasks = OwnedTasks()
        self.announcements_sent = 0
        self.seen = 0
        self.malformed = 0

    def _service_info(self) -> AsyncServiceInfo:
        name = self._info.name if self._info is not None else instance_name(self._announcement)
        return AsyncServiceInfo(
            SERVICE_TYPE,
            name,
            port=self._announcement.port,
            properties=self._announcement.to_properties(),
            parsed_addresses=self._addresses,
            host_ttl=HOST_TTL,
            # an update must name the host the registration named (zeroconf fills it in at registration only)
            server=self._info.server if self._info is not None else None,
        )

    async def start(self) -> None:
        """Start browsing, and register the service in the background: probing for a name conflict takes
        about 1.2 s (RFC 6762 §8.1), which the agent need not wait for."""
        self._zeroconf = AsyncZeroconf(ip_version=IPVersion.V4Only)
        self._browser = AsyncServiceBrowser(self._zeroconf.zeroconf, [SERVICE_TYPE], handlers=[self._on_change])
        self._tasks.spawn(self._register())

    async def _register(self) -> None:
        assert self._zeroconf is not None
        info = self._service_info()
        # a conflict means another responder claims our name: a copied identity, or a spoofer; take a new
        # instance name (the node id in TXT, not the name, is what peers go by) and say so
        try:
            await self._zeroconf.async_register_service(info, allow_name_change=True)
        except Exception as exc:  # no usable interface, a name taken past zeroconf's tries: say so, run on
            log.error("node=%s cannot announce over mDNS: %s", self._announcement.node, exc or type(exc).__name__)
            return
        if info.name != instance_name(self._announcement):
            log.warning(
                "node=%s mDNS name %s was taken on this network; announcing as %s (another agent may run "
                "with this PC's identity)",
                self._announcement.node,
                instance_name(self._announcement),
                info.name,
            )
        self._info = info
        self.announcements_sent += 1
        if info.properties != self._service_info().properties:
            await self._announce()  # it changed while the name was probed
        self._tasks.spawn(self._keep_announcing())
        log.info("node=%s announcing %s on %s", self._announcement.node, info.name, ", ".join(self._addresses))

    async def update(self, announcement: Announcement) -> None:
        """Announce a change at once (stage state, donor state)."""
        self._announcement = announcement
        await self._announce()

    async def _announce(self) -> None:
        if self._zeroconf is None or self._info is None:
            return
        self._info = self._service_info()
        await self._zeroconf.async_update_service(self._info)
        self.announcements_sent += 1

    async def _keep_announcing(self) -> None:
        since_rescan = 0.0
        while True:
            await asyncio.sleep(self._reannounce)
            try:
                await self._announce()
                since_rescan += self._reannounce
                if since_rescan >= self._rescan and self._zeroconf is not None:
                    since_rescan = 0.0
                    await self._zeroconf.zeroconf.async_update_interfaces()
                    if self._find_addresses is not None:
                        found = await asyncio.get_running_loop().run_in_executor(None, self._find_addresses)
                        if found and found != self._addresses:
                            log.info("node=%s now announcing on %s", self._announcement.node, ", ".join(found))
                            self._addresses = found
                            await self._announce()
            except Exception as exc:  # an interface went away mid-send: the next round tries again
                log.warning("node=%s mDNS announcement failed: %s", self._announcement.node, exc or type(exc).__name__)

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        # removals are ignored on purpose: liveness is the control links' (see the module docstring)
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated) and name != self._own_name:
            self._tasks.spawn(self._resolve(service_type, name))

    @property
    def _own_name(self) -> str:
        return self._info.name if self._info is not None else ""

    async def _resolve(self, service_type: str, name: str) -> None:
        if self._zeroconf is None:
            return
        info = AsyncServiceInfo(service_type, name)
        if not await info.async_request(self._zeroconf.zeroconf, RESOLVE_TIMEOUT_MS):
            log.debug("node=%s could not resolve %s", self._announcement.node, name)
            return
        addresses = info.parsed_addresses(IPVersion.V4Only)
        if not addresses or not info.properties:
            return
        try:
            announcement = Announcement.from_properties(info.properties)
        except RemoteProtocolError as exc:
            self.malformed += 1
            log.warning(
                "node=%s ignored the mDNS announcement %s from %s: %s", self._announcement.node, name, addresses[0], exc
            )
            return
        self.seen += 1
        self._on_seen(announcement, addresses[0])

    async def stop(self) -> None:
        """Send goodbyes and close (peers hear of a clean stop at once)."""
        await self._tasks.cancel_all()
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await self._browser.async_cancel()
        if self._zeroconf is not None:
            with contextlib.suppress(OSError):
                await self._zeroconf.async_unregister_all_services()
            await self._zeroconf.async_close()
            self._zeroconf = None

    def status(self) -> dict[str, object]:
        return {
            "name": self._own_name,
            "addresses": self._addresses,
            "announcements_sent": self.announcements_sent,
            "seen": self.seen,
            "malformed": self.malformed,
        }


def local_ipv4_addresses() -> list[str]:
    """This PC's IPv4 addresses other than loopback (what to announce when listening on 0.0.0.0)."""
    import ifaddr

    found = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if ip.is_IPv4 and isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                found.append(ip.ip)
    return sorted(set(found), key=socket.inet_aton)


@dataclass(frozen=True)
class MulticastProbe:
    """What one interface's mDNS round showed (``probe_multicast``)."""

    address: str
    own_heard: bool
    """Our own probe announcement came back: this PC can send and receive multicast on the interface."""
    peers: frozenset[str]
    """Node ids of this fleet's agents heard announcing on it."""
    error: str = ""


async def probe_multicast(address: str, fleet: str, seconds: float = 3.0) -> MulticastProbe:
    """Announce a probe service on the interface with ``address`` and browse for ``seconds``: is our own
    announcement heard, and which agents of ``fleet`` announce there?"""
    # of a type of its own: the agents around browse _shoal._tcp only, and never see it
    probe = f"doctor-{secrets.token_hex(4)}.{PROBE_TYPE}"
    heard: set[str] = set()
    peers: set[str] = set()
    pending: set[asyncio.Task[None]] = set()
    try:
        zeroconf = AsyncZeroconf(interfaces=[address], ip_version=IPVersion.V4Only)
    except OSError as exc:
        return MulticastProbe(address, False, frozenset(), f"cannot open mDNS sockets on {address}: {exc}")

    async def resolve(service_type: str, name: str) -> None:
        info = AsyncServiceInfo(service_type, name)
        if await info.async_request(zeroconf.zeroconf, RESOLVE_TIMEOUT_MS, question_type=QM) and info.properties:
            try:
                announcement = Announcement.from_properties(info.properties)
            except RemoteProtocolError:
                return
            if announcement.fleet == fleet:
                peers.add(announcement.node)

    def changed(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is not ServiceStateChange.Added:
            return
        if name == probe:
            heard.add(name)
        elif service_type == SERVICE_TYPE:
            task = asyncio.get_running_loop().create_task(resolve(service_type, name))
            pending.add(task)
            task.add_done_callback(pending.discard)

    browser: AsyncServiceBrowser | None = None
    try:
        info = AsyncServiceInfo(PROBE_TYPE, probe, port=9, parsed_addresses=[address])
        await zeroconf.async_register_service(info)
        # multicast answers only (QM): a unicast answer (QU, zeroconf's first question) would reach a PC that
        # the network's multicast does not, and hide the very fault this probe looks for
        browser = AsyncServiceBrowser(
            zeroconf.zeroconf, [SERVICE_TYPE, PROBE_TYPE], handlers=[changed], question_type=QM
        )
        await asyncio.sleep(seconds)
        for task in list(pending):
            with contextlib.suppress(Exception):
                await task
    except OSError as exc:
        return MulticastProbe(address, bool(heard), frozenset(peers), f"mDNS on {address} failed: {exc}")
    finally:
        if browser is not None:
            await browser.async_cancel()
        with contextlib.suppress(OSError):
            await zeroconf.async_unregister_all_services()
        await zeroconf.async_close()
    return MulticastProbe(address, bool(heard), frozenset(peers))
