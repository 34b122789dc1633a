"""A ring of real ``StageServer`` s on toy stages over a ``MemoryNetwork``: the middle tier's lab.

Everything above OpenVINO and below the socket is the product's own code: the stage servers, their
successor links, the session table, the ring client, the frame codec. Only the stages compute in numpy
(``tests.support.toy_model``) and the bytes go through memory (``tests.support.memory_network``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from agent.daemon import Daemon
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import Drafter
from agent.head.ring_client import RingClient
from agent.head.targets import LocalTarget, Target
from agent.node.config import AgentConfig
from agent.node.server import StageServer
from agent.runtime.pipeline import PipelineSession
from agent.sampling.params import SamplingParams
from agent.transport.heartbeat import Liveness
from shards.manifest import Manifest
from tests.support.memory_network import MemoryHost, MemoryNetwork
from tests.support.toy_model import ToyPool, ToyStage, ToyTokenizer, ToyWeights, toy_manifest, whole_model

GREEDY = SamplingParams()
NOWHERE = Path("/nonexistent/toy-export")
T = TypeVar("T")


def stage_address(index: int) -> tuple[str, int]:
    return (f"10.9.0.{index + 1}", 7000)


@dataclass
class ToyRing:
    """``len(manifest.stages)`` agents, one stage each, at ``stage_address(i)``."""

    manifest: Manifest
    weights: ToyWeights
    network: MemoryNetwork = field(default_factory=MemoryNetwork)
    max_sessions: int = 4
    liveness: Liveness = field(default_factory=Liveness)
    """Heartbeats of every link (tests of a frozen agent make them fast)."""
    kv_blocks: int | None = None
    """Each stage's sessions take KV blocks of 4 positions from a pool of this many (``ToyPool``; None: no limit)."""
    servers: list[StageServer] = field(default_factory=list)
    stages: list[ToyStage] = field(default_factory=list)
    chat_stages: list[ToyStage] = field(default_factory=list)
    """The stage 0 of each chat agent started (``chat_agent``)."""

    @classmethod
    async def start(
        cls,
        stages: int = 3,
        max_sessions: int = 4,
        liveness: Liveness | None = None,
        kv_blocks: int | None = None,
        **changes: object,
    ) -> ToyRing:
        """``changes``: to every agent's configuration (``pack_budget=4``, say)."""
        manifest = toy_manifest(stages)
        weights = ToyWeights.make(manifest.arch.num_layers)
        ring = cls(manifest, weights, max_sessions=max_sessions, liveness=liveness or Liveness(), kv_blocks=kv_blocks)
        for index in range(stages):
            ring.servers.append(await ring._serve(index, **changes))
        return ring

    def config(self, index: int, **changes: object) -> AgentConfig:
        """The configuration of the agent serving stage ``index``."""
        last = index == len(self.manifest.stages) - 1
        config = AgentConfig(
            export_dir=NOWHERE,
            stages=(index,),
            identity_dir=NOWHERE,
            listen=stage_address(index),
            next=None if last else stage_address(index + 1),
            max_sessions=self.max_sessions,
            verify=False,
            heartbeat_interval=self.liveness.interval,
            link_timeout=self.liveness.timeout,
        )
        return replace(config, **changes)  # type: ignore[arg-type]

    async def _serve(self, index: int, **changes: object) -> StageServer:
        pool = ToyPool(self.kv_blocks) if self.kv_blocks is not None else None
        stage = ToyStage(self.manifest.stages[index], self.weights, pool=pool)
        network = self.network.host(stage_address(index)[0])
        server = StageServer(self.config(index, **changes), self.manifest, [stage], f"toy{index}", network)
        await server.start()
        if index < len(self.stages):
            self.stages[index] = stage
        else:
            self.stages.append(stage)
        return server

    def client(self, host: str = "10.9.0.100") -> RingClient:
        """A head on PC ``host`` with no stage of its own, sending token ids to stage 0."""
        first, last = self.servers[0].address, self.servers[-1].address
        network = self.network.host(host)
        return RingClient(self.manifest, first, last, network, f"head-{host}", liveness=self.liveness)

    async def vanish(self, index: int) -> None:
        """Stage ``index`` 's PC goes away at once: no goodbye to anyone, and its agent ends."""
        self.network.host(stage_address(index)[0]).vanish()
        await self.servers[index].stop()

    async def restart(self, index: int, **changes: object) -> None:
        """A fresh agent (no sessions) takes stage ``index`` at the same address (``changes``: to its
        configuration)."""
        self.servers[index] = await self._serve(index, **changes)

    def host(self, index: int) -> MemoryHost:
        """The PC of stage ``index`` (to freeze it, or make it vanish)."""
        return self.network.host(stage_address(index)[0])

    def held(self) -> list[int]:
        """Sessions each stage holds."""
        return [len(server.table.sessions) for server in self.servers]

    async def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait (on the loop: the ring runs meanwhile) until ``condition`` holds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"still not so after {timeout} s; sessions held: {self.held()}")
            await asyncio.sleep(0.005)

    async def chat_agent(
        self, folder: Path, host: str = "10.9.0.50", tokenizer: type[ToyTokenizer] = ToyTokenizer, **changes: object
    ) -> Daemon:
        """A started agent on ``host`` that heads chats: it serves a second stage 0 (computed in-process for
        its chats) in front of this ring's stage 1, and the ring's last stage answers it (``changes``: to its
        configuration, ``stages=(), next=None, ring_first=...`` for a head holding no stage; its endpoint file
        goes in ``folder``; ``tokenizer``: the class it reads its export's tokenizer with)."""
        config = self.config(
            0,
            listen=(host, 7000),
            chat=("127.0.0.1", 0),
            chat_file=folder / "chat.json",
            ring_last=stage_address(len(self.manifest.stages) - 1),
            **changes,
        )
        pool = ToyPool(self.kv_blocks) if self.kv_blocks is not None else None
        stages = [ToyStage(self.manifest.stages[0], self.weights, pool=pool)] if config.stages else []
        network = self.network.host(host)
        daemon = Daemon(config, f"chat-{host}", self.manifest, stages, network, load_tokenizer=tokenizer)
        await daemon.start()
        self.chat_stages.extend(stages)
        return daemon

    async def stop(self) -> None:
        for server in self.servers:
            await server.stop()


async def answer(
    target: Target,
    prompt: list[int],
    max_tokens: int = 24,
    *,
    params: SamplingParams = GREEDY,
    drafter: Drafter | None = None,
    stats: DecodeStats | None = None,
    depth: int = 1,
) -> list[int]:
    """The tokens ``decode`` gives on ``target`` (no stop token ends it early unless it is generated)."""
    return [
        token
        async for token in decode(
            target,
            prompt,
            max_tokens=max_tokens,
            stop_ids=ToyTokenizer.stop_ids,
            params=params,
            context_tokens=256,
            drafter=drafter,
            stats=stats,
            depth=depth,
        )
    ]


async def reference(
    ring: ToyRing, prompt: list[int], max_tokens: int = 24, params: SamplingParams = GREEDY
) -> list[int]:
    """The answer of one toy stage holding every layer, in process: what the ring must give."""
    whole = ToyStage(whole_model(ring.manifest), ring.weights)
    target = LocalTarget(PipelineSession([whole.new_session()]), params)
    try:
        return await answer(target, prompt, max_tokens, params=params)
    finally:
        await target.close()


def run(main: Callable[[], Awaitable[T]], timeout: float = 20.0) -> T:
    """Run one test's coroutine on a fresh loop, failing it (rather than hanging) after ``timeout``."""

    async def bounded() -> T:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def ring_and_client() -> AsyncIterator[tuple[ToyRing, RingClient]]:
    """A started toy ring of three stages and a connected head holding no stage; both stopped at the end."""
    ring = await ToyRing.start()
    client = ring.client()
    await client.connect()
    try:
        yield ring, client
    finally:
        await client.close()
        await ring.stop()


@contextlib.asynccontextmanager
async def ring_and_chat(
    folder: Path, max_sessions: int = 4, kv_blocks: int | None = None, **chat: object
) -> AsyncIterator[tuple[ToyRing, Daemon]]:
    """A started toy ring of three stages and a chat agent in front of it (``ToyRing.chat_agent``: ``chat``
    changes its configuration, its endpoint file goes in ``folder``; ``kv_blocks``: every stage's pool, the chat
    agent's too); both stopped at the end."""
    ring = await ToyRing.start(max_sessions=max_sessions, kv_blocks=kv_blocks)
    daemon = await ring.chat_agent(folder, **chat)
    try:
        yield ring, daemon
    finally:
        await daemon.stop()
        await ring.stop()
