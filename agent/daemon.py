"""``Daemon``: the one place that assembles a running agent from its ``AgentConfig`` and owns its parts.

Parts, in start order (stopped in reverse):

- the stage server: this PC's stages on the ring (``agent.node.server``);
- the chat service, when the agent heads its PC's chats (``agent.chat.service``);
- the OpenAI-style API in front of those chats (``agent.chat.openai_http``);
- any further ``DaemonPart`` handed in: discovery, the fleet plan, shard downloads and the idle policy
  plug in here, each seeing the daemon's status through ``status_sections``.

The command line only parses arguments and calls :func:`serve`; tests build a ``Daemon`` directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agent.errors import ConfigError
from agent.fleet import NodeIdentity
from agent.node.config import AgentConfig
from agent.node.server import StageServer
from agent.runtime.protocol import Stage
from agent.runtime.stage import CompiledStage
from agent.transport.network import Network, TlsNetwork
from shards.manifest import Manifest

if TYPE_CHECKING:
    from agent.head.chat import ChatTokenizer

log = logging.getLogger(__name__)


class DaemonPart(Protocol):
    """A part the daemon starts after its own and stops before them (discovery, plan, downloads, idle policy)."""

    name: str

    async def start(self) -> None:
        """Begin work; return once running."""
        ...

    async def stop(self) -> None:
        """End work and release what it holds; called once, also after a failed start."""
        ...

    def status(self) -> dict[str, Any]:
        """This part's section of the agent's status."""
        ...


@dataclass(frozen=True)
class DaemonAddresses:
    """Where a started daemon can be reached."""

    ring: tuple[str, int]
    chat: tuple[str, int] | None = None
    http: tuple[str, int] | None = None


class Daemon:
    """One running agent: its stages on the ring, its chats and their HTTP API, and the parts plugged in."""

    def __init__(
        self,
        config: AgentConfig,
        node: str,
        manifest: Manifest,
        stages: Sequence[Stage],
        network: Network,
        parts: Sequence[DaemonPart] = (),
        *,
        load_tokenizer: Callable[[Path], ChatTokenizer] | None = None,
    ) -> None:
        """``network``: how the agent reaches and accepts peers (``TlsNetwork.of(identity)``: see
        :meth:`build`); ``load_tokenizer``: reads the export's tokenizer (default: ``ChatTokenizer``)."""
        _check_ring_flags(config, manifest)
        self.config = config
        self.node = node
        self.server = StageServer(config, manifest, stages, node, network)
        self.chats = None
        self.http = None
        if config.chat is not None:
            from agent.chat.service import ChatService

            self.chats = ChatService(config, self.server, network, load_tokenizer)
            # a chat kept for its next turn gives its place up to a session that needs it on this agent
            self.server.table.reclaim = self.chats.kept.give_up_place
            self._section("chat", self.chats.status)
            if config.http is not None:
                from agent.chat.openai_http import OpenAIEndpoint

                self.http = OpenAIEndpoint(self.chats, config.http)
        self.parts = list(parts)
        for part in self.parts:
            self._section(part.name, part.status)
        self._started: list[Callable[[], Any]] = []
        self.addresses: DaemonAddresses | None = None
        """Where the started daemon can be reached (None until :meth:`start` returned)."""

    def _section(self, name: str, status: Callable[[], Any]) -> None:
        if name in self.server.status_sections:
            raise ConfigError(f"two parts of the agent report status as {name!r}")
        self.server.status_sections[name] = status

    @classmethod
    async def build(cls, config: AgentConfig, parts: Sequence[DaemonPart] = ()) -> Daemon:
        """Load the identity and manifest, check and compile this agent's stages (off the event loop)."""
        loop = asyncio.get_running_loop()
        identity = await loop.run_in_executor(None, NodeIdentity.load, config.identity_dir)
        manifest = await loop.run_in_executor(None, Manifest.load, config.export_dir)
        _check_ring_flags(config, manifest)
        graphs = [manifest.stages[i] for i in config.stages]
        if config.verify:
            await loop.run_in_executor(None, lambda: manifest.verify(config.export_dir, graphs=graphs, progress=False))
        stages = await loop.run_in_executor(
            None, lambda: [CompiledStage(config.export_dir, g, manifest.weights, config.runtime) for g in graphs]
        )
        return cls(config, identity.name, manifest, stages, TlsNetwork.of(identity), parts)

    async def start(self) -> DaemonAddresses:
        """Start every part in order; a part that fails to start stops those already running."""
        try:
            ring = await self.server.start()
            self._started.append(self.server.stop)
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
                await part.start()
                self._started.append(part.stop)
        except BaseException:
            await self.stop()
            raise
        self.addresses = DaemonAddresses(ring, chat, http)
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
        held = (
            f"stages={','.join(map(str, self.config.stages))} layers={graphs[0].layer_start}-"
            f"{graphs[-1].layer_stop - 1} device={self.server.stages[0].device}"
            if graphs
            else "stages=none"
        )
        return f"shoal agent: ready node={self.node} listen={addresses.ring[0]}:{addresses.ring[1]} {held}{chat}"


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


async def serve(config: AgentConfig, parts: Sequence[DaemonPart] = ()) -> int:
    """Build and start the daemon, then run until SIGINT/SIGTERM; returns the exit status."""
    daemon = await Daemon.build(config, parts)
    addresses = await daemon.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: no signal handlers on the loop
            loop.add_signal_handler(signum, stop.set)
    print(daemon.ready_line(addresses), flush=True)
    try:
        await stop.wait()
    finally:
        await daemon.stop()
    return 0
