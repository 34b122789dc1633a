"""``Daemon``: the one place that assembles a running agent from its ``AgentConfig`` and owns its parts.

Parts, in start order (stopped in reverse):

- the stage server: this PC's stages on the ring (``agent.node.server``);
- the chat service, when the agent heads its PC's chats (``agent.chat.service``);
- the OpenAI-style API in front of those chats (``agent.chat.openai_http``);
- the agent's own metrics endpoint, chats or not (``agent.metrics.endpoint``);
- fleet membership (``discovery.service``): mDNS, seeds, gossip and the members' control links, which
  come in through the stage server's port;
- for an agent of a self-forming fleet (started without an export, the normal way): the fleet plan
  (``discovery.plan_service``) and the part that carries it out on this PC (``agent.node.ring_former``):
  fetching, compiling and serving its stage, and pointing its chats at the plan's ring;
- on a donor's PC (``config.donor``) of such a fleet, the donor watch (``agent.node.donor_watch``): it reads
  whether the PC's owner is there and announces whether the PC may serve, and the plan follows;
- any further ``DaemonPart`` handed in, each seeing the daemon's status through ``status_sections``.

The command line only parses arguments and calls :func:`serve`; tests build a ``Daemon`` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.metadata
import logging
import secrets
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.errors import ConfigError
from agent.fleet import NodeIdentity, read_certificate
from agent.node.config import LOOPBACK, AgentConfig, stage_runtime
from agent.node.donor_watch import DonorWatch
from agent.node.facts import HostFacts, matmul_gflops, measure_host, offerable_mb
from agent.node.heap_trim import HeapTrim
from agent.node.ring_former import RingFormer
from agent.node.running import RUNNING_FILE, write_running_record
from agent.node.server import StageServer
from agent.node.shard_source import ShardSource
from agent.runtime.protocol import Stage
from agent.runtime.stage import CompiledStage
from agent.transport.connection import FrameConnection
from agent.transport.listen import check_can_listen
from agent.transport.network import Network, TlsNetwork
from agent.transport.tls import server_context
from agent.wire.frames import PROTOCOL_VERSION
from agent.wire.messages import Hello
from discovery.announcement import Announcement, HeldStage
from discovery.fleet_document import ModelSource
from discovery.kept import fleet_document_keeper, revocation_keeper
from discovery.mdns import local_ipv4_addresses
from discovery.plan_service import FleetPlanService
from discovery.service import MembershipService, MembershipSettings
from shards.manifest import Manifest

if TYPE_CHECKING:
    from agent.donor.policy import Readings
    from agent.head.chat import ChatTokenizer

log = logging.getLogger(__name__)


Role = Callable[[FrameConnection, Hello], Awaitable[None]]
"""Serves a connection of one HELLO role after the stage server read its HELLO (``StageServer.roles``)."""


class DaemonPart(Protocol):
    """A part the daemon starts after its own and stops before them (discovery, plan, downloads, idle policy)."""

    name: str

    @property
    def roles(self) -> Mapping[str, Role]:
        """The connection roles this part serves on the agent's port (e.g. ``member``: control links)."""
        ...

    async def start(self, ring: tuple[str, int]) -> None:
        """Begin work, knowing where the agent listens; return once running."""
        ...

    async def stop(self) -> None:
        """End work and release what it holds; called once, also after a failed start."""
        ...

    def status(self) -> dict[str, Any]:
        """This part's section of the agent's status."""
        ...


@dataclass(frozen=True)
class FleetParts:
    """What a self-forming fleet's agent plans and fetches with (see :meth:`Daemon.build`)."""

    membership: MembershipService
    plan: FleetPlanService
    source: ShardSource


@dataclass(frozen=True)
class DaemonAddresses:
    """Where a started daemon can be reached."""

    ring: tuple[str, int]
    chat: tuple[str, int] | None = None
    http: tuple[str, int] | None = None
    metrics: tuple[str, int] | None = None


class Daemon:
    """One running agent: its stages on the ring, its chats and their HTTP API, and the parts plugged in."""

    def __init__(
        self,
        config: AgentConfig,
        node: str,
        manifest: Manifest | None,
        stages: Sequence[Stage],
        network: Network,
        parts: Sequence[DaemonPart] = (),
        *,
        load_tokenizer: Callable[[Path], ChatTokenizer] | None = None,
        fleet: FleetParts | None = None,
        donor_sense: Callable[[], Readings] | None = None,
        metrics_tls: ssl.SSLContext | None = None,
    ) -> None:
        """``network``: how the agent reaches and accepts peers (``TlsNetwork.of(identity)``: see
        :meth:`build`); ``load_tokenizer``: reads the export's tokenizer (default: ``ChatTokenizer``);
        ``fleet``: the plan this agent follows (then its stages and ring come from the plan, and a
        ``RingFormer`` joins the parts; their membership and plan must be among ``parts``); ``donor_sense``: a
        donor's readings of its PC (default: this PC's idle source, battery, load and memory); ``metrics_tls``: the
        server context of a metrics endpoint off loopback (the fleet's mutual TLS: see :meth:`build`)."""
        if manifest is not None:
            _check_ring_flags(config, manifest)
        self.config = config
        self.node = node
        self.server = StageServer(config, manifest, stages, node, network)
        self.chats = None
        self.http = None
        if config.chat is not None:
            from agent.chat.service import ChatService

            self.chats = ChatService(
                config, self.server, network, load_tokenizer, _route_of(fleet.plan) if fleet is not None else None
            )
            # a chat kept for its next turn gives its place up to a session that needs it on this agent
            self.server.table.reclaim = self.chats.kept.give_up_place
            self._section("chat", self.chats.status)
            if config.http is not None:
                from agent.chat.openai_http import OpenAIEndpoint
                from agent.metrics.exposition import CONTENT_TYPE, render_metrics

                self.http = OpenAIEndpoint(self.chats, config.http, render_metrics(self.server.status), CONTENT_TYPE)
                self._section("http", self.http.status)
        self.metrics = None
        if config.metrics is not None:
            from agent.metrics.endpoint import MetricsEndpoint
            from agent.metrics.exposition import CONTENT_TYPE, render_metrics

            if metrics_tls is None and not _loopback(config.metrics[0]):
                raise ConfigError(
                    f"a metrics endpoint on {config.metrics[0]} is for the fleet: it needs the fleet's TLS (this "
                    "agent's identity); listen on loopback for this PC alone"
                )
            render = render_metrics(self.server.status)
            revoked = network.revoked if isinstance(network, TlsNetwork) else None
            self.metrics = MetricsEndpoint(render, CONTENT_TYPE, config.metrics, node, metrics_tls, revoked)
            self._section("metrics", self.metrics.status)
        self.parts: list[DaemonPart] = list(parts)
        if fleet is not None:
            former = RingFormer(config, fleet.plan, fleet.membership, self.server, fleet.source, self.chats)
            self.parts.append(former)
            if config.donor is not None:
                sense, source = (donor_sense, lambda: None) if donor_sense is not None else _donor_sensors()
                watch = DonorWatch(config.donor, sense, fleet.membership, former.holds_stage, source=source)
                self.parts.append(watch)
        # what the C heap keeps while no stage computes goes back to the PC's owner
        self.parts.append(HeapTrim(node, lambda: self.server.packs + self.server.local_steps))
        for part in self.parts:
            self._section(part.name, part.status)
            for role, serve in part.roles.items():
                if role in self.server.roles or role in ("head", "stage", "status"):
                    raise ConfigError(f"two parts of the agent serve {role!r} connections")
                self.server.roles[role] = serve
        self.stopped = asyncio.Event()
        """Set when the agent must stop of its own accord (:meth:`fail`)."""
        self.failure: str | None = None
        self._started: list[Callable[[], Any]] = []
        self.addresses: DaemonAddresses | None = None
        """Where the started daemon can be reached (None until :meth:`start` returned)."""

    def _section(self, name: str, status: Callable[[], Any]) -> None:
        if name in self.server.status_sections:
            raise ConfigError(f"two parts of the agent report status as {name!r}")
        self.server.status_sections[name] = status

    def fail(self, message: str) -> None:
        """Stop the agent with ``message`` as its error (e.g. another agent runs with this PC's identity)."""
        if self.failure is None:
            self.failure = message
        self.stopped.set()

    @classmethod
    async def build(
        cls,
        config: AgentConfig,
        parts: Sequence[DaemonPart] = (),
        *,
        measure_speed: Callable[[], float] = matmul_gflops,
        donor_sense: Callable[[], Readings] | None = None,
    ) -> Daemon:
        """Load the identity and manifest, check and compile this agent's stages (off the event loop), and
        assemble its fleet membership. ``measure_speed``: this PC's speed figure, measured once running (tests
        of many agents on one PC give a fixed one: measured there, the figures are their contention's);
        ``donor_sense``: a donor's readings of its PC (tests give a PC whose owner they move)."""
        loop = asyncio.get_running_loop()
        identity = await loop.run_in_executor(None, NodeIdentity.load, config.identity_dir)
        # an address in use is said now, not after a minute of compiling stages to serve on it
        await loop.run_in_executor(None, _check_addresses, config)
        manifest, stages = await _load_stages(config) if config.export_dir is not None else (None, [])
        network = TlsNetwork.of(identity)
        facts = await loop.run_in_executor(None, lambda: measure_host(speed=False))
        if config.speed is not None:
            measure_speed = functools.partial(float, config.speed)  # the admin's figure, not a measurement
        membership = await loop.run_in_executor(
            None, lambda: _membership(config, identity, network, facts, measure_speed)
        )
        fleet = None
        own: list[DaemonPart] = [membership]
        if config.export_dir is None:
            source = ShardSource(config.shards_dir)

            async def load_manifest(model: ModelSource) -> Manifest:
                return await asyncio.get_running_loop().run_in_executor(None, source.manifest, model)

            fleet = FleetParts(membership, FleetPlanService(membership, load_manifest), source)
            own.append(fleet.plan)
        metrics_tls = None
        if config.metrics is not None and not _loopback(config.metrics[0]):
            metrics_tls = server_context(identity)  # only a fleet member's certificate scrapes it
        daemon = cls(
            config,
            identity.name,
            manifest,
            stages,
            network,
            [*own, *parts],
            fleet=fleet,
            donor_sense=donor_sense,
            metrics_tls=metrics_tls,
        )
        membership.on_duplicate = daemon.fail
        return daemon

    async def start(self) -> DaemonAddresses:
        """Start every part in order; a part that fails to start stops those already running."""
        try:
            ring = await self.server.start()
            self._started.append(self.server.stop)
            metrics = None
            if self.metrics is not None:
                metrics = await self.metrics.start()
                self._started.append(self.metrics.stop)
            chat = http = None
            if self.chats is not None:
                http_url = None
                if self.http is not None:
                    http = await self.http.start()
                    self._started.append(self.http.stop)
                    http_url = f"http://{http[0]}:{http[1]}/v1"
                chat = await self.chats.start(http_url)
                self._started.append(self.chats.stop)
            for part in self.parts:
                await part.start(ring)
                self._started.append(part.stop)
        except BaseException:
            await self.stop()
            raise
        self.addresses = DaemonAddresses(ring, chat, http, metrics)
        return self.addresses

    async def stop(self) -> None:
        """Stop the started parts, last started first (the chats end before the stages they run on)."""
        while self._started:
            stop = self._started.pop()
            try:
                await stop()
            except Exception:  # one part failing to stop must not keep the others running
                log.exception("node=%s a part of the agent failed to stop", self.node)

    def ready_line(self, addresses: DaemonAddresses) -> str:
        """The one line a started agent prints (scripts and the demo wait for it)."""
        graphs = [stage.graph for stage in self.server.stages]
        chat = f" chat={addresses.chat[0]}:{addresses.chat[1]}" if addresses.chat else ""
        if self.config.export_dir is None:
            return (
                f"shoal agent: ready node={self.node} listen={addresses.ring[0]}:{addresses.ring[1]} "
                f"stages=plan member{chat}"
            )
        held = (
            f"stages={','.join(map(str, self.config.stages))} layers={graphs[0].layer_start}-"
            f"{graphs[-1].layer_stop - 1} device={self.server.stages[0].device}"
            if graphs
            else "stages=none"
        )
        return f"shoal agent: ready node={self.node} listen={addresses.ring[0]}:{addresses.ring[1]} {held}{chat}"


def _loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


def _check_addresses(config: AgentConfig) -> None:
    """Refuse, as starting would, the addresses this agent listens on that it cannot have (in use, not ours)."""
    wanted = [
        (config.listen, "the ring"),
        (config.chat, "the chat endpoint"),
        (config.http, "the HTTP API"),
        (config.metrics, "the metrics endpoint"),
    ]
    for address, what in wanted:
        if address is not None:
            check_can_listen(address, what)


async def _load_stages(config: AgentConfig) -> tuple[Manifest, list[Stage]]:
    export_dir = config.export_dir
    assert export_dir is not None  # the caller checked: an agent without an export loads no stage
    loop = asyncio.get_running_loop()
    manifest = await loop.run_in_executor(None, Manifest.load, export_dir)
    _check_ring_flags(config, manifest)
    graphs = [manifest.stages[i] for i in config.stages]
    if config.verify:
        await loop.run_in_executor(None, lambda: manifest.verify(export_dir, graphs=graphs, progress=False))
    offer = config.offer_mb if config.offer_mb is not None else offerable_mb()
    runtime = stage_runtime(config, manifest, config.stages, offer)
    stages: list[Stage] = await loop.run_in_executor(
        None, lambda: [CompiledStage(export_dir, g, manifest.weights, runtime) for g in graphs]
    )
    return manifest, stages


def _membership(
    config: AgentConfig,
    identity: NodeIdentity,
    network: TlsNetwork,
    facts: HostFacts,
    measure_speed: Callable[[], float],
) -> MembershipService:
    """This agent's fleet membership: what it announces, and how it finds the others."""
    host = config.listen[0]
    loopback = _loopback(host)
    mdns = config.mdns and not loopback
    if config.mdns and loopback:
        log.info("node=%s listens on loopback only: no mDNS (peers come from --peer)", identity.name)
    me = Announcement(
        node=identity.node_id,
        name=identity.name,
        fleet=identity.fleet_id,
        fingerprint=identity.fingerprint,
        version=software_version(),
        protocol=PROTOCOL_VERSION,
        port=1,  # the bound port is known at start (MembershipService.start)
        instance=secrets.token_hex(8),
        started=int(time.time()),
        devices=facts.devices,
        memory_mb=facts.memory_mb if config.offer_mb is None else config.offer_mb,
        speed=facts.speed,
        stages=tuple(HeldStage(i, "ready") for i in config.stages),
    )
    every = host in ("0.0.0.0", "")
    addresses = (local_ipv4_addresses() if every else [host]) if mdns else []
    settings = MembershipSettings(config.peers, mdns, config.lost_after, config.liveness)
    ca = read_certificate(identity.ca)
    revocations = revocation_keeper(config.identity_dir, ca)
    return MembershipService(
        me,
        network,
        settings,
        mdns_addresses=addresses,
        find_addresses=local_ipv4_addresses if every else None,
        revocations=revocations,
        on_revoked=network.refuse,
        fleet=fleet_document_keeper(config.identity_dir, ca),
        measure_speed=measure_speed,
        certificates=(identity.certificate(), ca),
    )


def _route_of(plan: FleetPlanService) -> Callable[[], tuple[tuple[str, int], tuple[str, int]]]:
    """The chats' route through the plan's ring (``RingNotReadyError``, a ``PeerUnavailableError``, says why not)."""

    def route() -> tuple[tuple[str, int], tuple[str, int]]:
        found = plan.route()
        return found.first, found.last

    return route


def software_version() -> str:
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _check_ring_flags(config: AgentConfig, manifest: Manifest) -> None:
    """Refuse ring addresses that contradict the stages this agent serves (they would send a chat's steps
    or wait for its answers where they never arrive)."""
    if not config.stages:
        return  # a head holding no stage: AgentConfig asked for ring_first and ring_last
    if config.stages[-1] >= len(manifest.stages):
        raise ConfigError(f"the export has {len(manifest.stages)} stages; there is no stage {config.stages[-1]}")
    last = len(manifest.stages) - 1
    if config.chat is not None and config.stages[-1] == last and config.ring_last is not None:
        raise ConfigError(
            f"this agent serves the last stage ({last}), so it answers its own chats: ring_last "
            f"({config.ring_last[0]}:{config.ring_last[1]}) names another last stage; drop --ring-last, or serve "
            "another stage"
        )
    if config.chat is not None and config.stages[0] == 0 and config.ring_first is not None:
        raise ConfigError(
            "this agent serves stage 0, so its chats start on it: ring_first names another stage 0; drop --ring-first"
        )
    if config.stages[-1] != last and config.next is None:
        raise ConfigError(
            f"stage(s) {', '.join(map(str, config.stages))} are not the last ({last}): the next stage's address is "
            "needed (--next)"
        )
    if config.stages[-1] == last and config.next is not None:
        raise ConfigError(
            f"this agent serves the last stage ({last}): it has no next stage, but next is "
            f"{config.next[0]}:{config.next[1]}; drop --next"
        )


def _run_in_background() -> None:
    """A donor's agent gives way to its owner's programs: the process at the lowest priority, the threads that run
    OpenVINO (this loop's executor's, and the plugin's workers they start) in SCHED_IDLE where there is one."""
    from concurrent.futures import ThreadPoolExecutor

    from agent.node.background import idle_thread, lower_priority

    done = lower_priority()
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(thread_name_prefix="shoal-work", initializer=idle_thread)
    )
    log.info(
        "a donor's agent: %s, inference threads in SCHED_IDLE where the system has it",
        ", ".join(done) or "no priority change allowed",
    )


def _donor_sensors() -> tuple[Callable[[], Readings], Callable[[], str | None]]:
    """This PC's donor readings, from the first idle source that works here (none: the policy's ``no_source``
    setting decides, and the status says why none works)."""
    import os

    from agent.donor.idle import IdleSource, describe_problems, pick_source
    from agent.donor.sensing import DonorSensors

    tried: list[IdleSource] = []
    source = pick_source(os.environ, tried=tried)
    if source is None:
        log.warning(
            "no idle source works on this PC (%s): the donor setting no_source decides", describe_problems(tried)
        )
    sensors = DonorSensors(source, None if source is not None else describe_problems(tried))
    return sensors.read, lambda: source.name if source is not None else None


async def serve(config: AgentConfig, parts: Sequence[DaemonPart] = ()) -> int:
    """Build and start the daemon, then run until SIGINT/SIGTERM; returns the exit status."""
    if config.donor is not None:
        _run_in_background()
    daemon = await Daemon.build(config, parts)
    addresses = await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: no signal handlers on the loop
            loop.add_signal_handler(signum, stop.set)
    print(daemon.ready_line(addresses), flush=True)
    running = config.identity_dir / RUNNING_FILE
    await loop.run_in_executor(None, write_running_record, running, daemon.node, addresses.ring)
    try:
        stopping = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(daemon.stopped.wait())
        await asyncio.wait({stopping, failed}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (stopping, failed):
            waiter.cancel()
    finally:
        await daemon.stop()
        with contextlib.suppress(OSError):
            running.unlink()
    if daemon.failure is not None:
        print(f"shoal agent: error: {daemon.failure}", file=sys.stderr, flush=True)
        return 1
    return 0
