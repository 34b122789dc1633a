"""A head holding stage 0 packs its own sessions' steps there (issue 45), on real OpenVINO stages: a 3-stage SmolLM2
int4 ring in one process (the head computes stage 0 with paged KV, real ``StageServer`` s the others, frames through
memory). Four sessions decoding at once, taking turns on the head's core, get the tokens each gets alone where the
stages pack alike, are told ``repeatable`` exactly then, and the head's packs held several steps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent.head.decode import decode
from agent.head.ring_client import RingClient, RingSession
from agent.node.server import StageServer
from agent.runtime.config import RuntimeConfig
from agent.runtime.packed import packs_alike
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest
from tests.integration.test_packed_ring import GREEDY, PROMPTS, TOKENS
from tests.middle.toy_ring import ToyRing, stage_address
from tests.support.memory_network import MemoryNetwork

pytestmark = pytest.mark.openvino


async def _answer(session: RingSession, client: RingClient, prompt: list[int]) -> list[int]:
    decoding = decode(
        session, prompt, max_tokens=TOKENS, stop_ids=(), params=GREEDY, context_tokens=512, turn=client.turn
    )
    return [token async for token in decoding]


def test_a_heads_sessions_packed_on_its_real_stage_0_get_the_tokens_they_get_alone(
    exported: Callable[..., Path], cache_dir: Path
) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    runtime = RuntimeConfig(device="CPU", threads=1, kv="paged", cache_dir=cache_dir / "ov")
    stages = [CompiledStage(folder, graph, manifest.weights, runtime) for graph in manifest.stages]
    executor = ThreadPoolExecutor(1, thread_name_prefix="head")

    async def main() -> None:
        network = MemoryNetwork()
        ring = ToyRing(manifest, None, network, max_sessions=8)  # type: ignore[arg-type]
        for index in (1, 2):
            config = ring.config(index)
            server = StageServer(config, manifest, [stages[index]], f"pc{index}", network.host(stage_address(index)[0]))
            await server.start()
            ring.servers.append(server)
        client = RingClient(
            manifest,
            ring.servers[0].address,
            ring.servers[-1].address,
            network.host("10.9.0.100"),
            "head",
            local_stages=[stages[0]],
            executor=executor,
        )
        await client.connect()
        try:
            alone = []
            for prompt in PROMPTS:
                session = await client.open_session(GREEDY)
                alone.append(await _answer(session, client, prompt))
                await session.close()
            before = client.local.packs, client.local.packed_steps
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]
            together = await asyncio.gather(*(_answer(s, client, p) for s, p in zip(sessions, PROMPTS, strict=True)))
            packs, steps = client.local.packs - before[0], client.local.packed_steps - before[1]
            assert packs < steps, "the head never computed two sessions' steps together on its stage 0"
            alike = packs_alike(stages)
            assert [s.repeatable() for s in sessions] == [alike] * len(sessions)
            if alike:
                assert list(together) == alone
            for session in sessions:
                await session.close()
        finally:
            await client.close()
            await ring.stop()

    try:
        asyncio.run(asyncio.wait_for(main(), 300))
    finally:
        executor.shutdown()
