"""Stage servers that pack (issue 45) on real OpenVINO stages: a 3-stage SmolLM2 int4 ring in one process (real
``StageServer`` s and ring client, frames through memory), its stages keeping their sessions' KV in one paged pool
each. Several sessions whose steps the stages compute together get the tokens each gets alone, and a session is
told ``repeatable`` only where its stages pack alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.errors import SessionEvictedError
from agent.head.decode import decode
from agent.head.ring_client import RingClient, RingSession
from agent.node.server import StageServer
from agent.runtime.config import RuntimeConfig
from agent.runtime.packed import packs_alike
from agent.runtime.stage import CompiledStage
from agent.sampling.params import SamplingParams
from shards.manifest import Manifest
from tests.middle.toy_ring import ToyRing, stage_address
from tests.support.memory_network import MemoryNetwork

pytestmark = pytest.mark.openvino

GREEDY = SamplingParams()
TOKENS = 12
PROMPTS = [[int(t) for t in np.random.default_rng(seed).integers(100, 40000, size=10 + 7 * seed)] for seed in range(4)]
"""Four prompts of 10 to 31 positions."""


async def _answer(session: RingSession, prompt: list[int]) -> list[int]:
    return [
        token
        async for token in decode(session, prompt, max_tokens=TOKENS, stop_ids=(), params=GREEDY, context_tokens=512)
    ]


@pytest.mark.parametrize("precision", ["f32", "auto"])
def test_sessions_packed_on_real_stages_get_the_tokens_they_get_alone(
    exported: Callable[..., Path], cache_dir: Path, precision: str
) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    runtime = RuntimeConfig(device="CPU", threads=1, kv="paged", precision=precision, cache_dir=cache_dir / "ov")
    stages = [CompiledStage(folder, graph, manifest.weights, runtime) for graph in manifest.stages]

    async def main() -> None:
        network = MemoryNetwork()
        ring = ToyRing(manifest, None, network, max_sessions=8)  # type: ignore[arg-type]
        for index, stage in enumerate(stages):
            # the longest prompt goes in chunks; stage 0, idle, gathers the steps that come within 0.2 s of the first
            config = ring.config(index, pack_budget=16, pack_window=0.2 if index == 0 else 0.0)
            server = StageServer(config, manifest, [stage], f"pc{index}", network.host(stage_address(index)[0]))
            await server.start()
            ring.servers.append(server)
        client: RingClient = ring.client()
        await client.connect()
        try:
            alone = []
            for prompt in PROMPTS:
                session = await client.open_session(GREEDY)
                alone.append(await _answer(session, prompt))
                await session.close()
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]
            together = list(await asyncio.gather(*(_answer(s, p) for s, p in zip(sessions, PROMPTS, strict=True))))
            first = ring.servers[0]
            assert first.packs < first.packed_steps, "stage 0 never computed two sessions' steps together"
            alike = packs_alike(stages)
            assert [s.repeatable() for s in sessions] == [alike] * len(sessions)
            if alike:
                assert together == alone
            for session in sessions:
                await session.close()
        finally:
            await client.close()
            await ring.stop()

    asyncio.run(asyncio.wait_for(main(), 300))


def test_a_real_pool_short_of_blocks_evicts_the_parked_session_not_the_active_one(
    exported: Callable[..., Path], cache_dir: Path
) -> None:
    """Each stage's pool holds 3 blocks of 32 positions. A session parked at 40 positions holds 2; an active one
    whose prompt and answer reach 43 positions needs a second block as it decodes: the parked session gives its
    blocks up (its head hears ``evicted``) and the active answer is the tokens it gets with the pool to itself."""
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    runtime = RuntimeConfig(device="CPU", threads=1, kv="paged", kv_positions=96, cache_dir=cache_dir / "ov")
    stages = [CompiledStage(folder, graph, manifest.weights, runtime) for graph in manifest.stages]
    prompt = PROMPTS[3]  # 31 positions, and 12 tokens
    assert [s.paged_kv.block_size if s.paged_kv else None for s in stages] == [32] * 3, "the arithmetic below"

    async def main() -> None:
        network = MemoryNetwork()
        ring = ToyRing(manifest, None, network, max_sessions=8)  # type: ignore[arg-type]
        for index, stage in enumerate(stages):
            server = StageServer(
                ring.config(index), manifest, [stage], f"pc{index}", network.host(stage_address(index)[0])
            )
            await server.start()
            ring.servers.append(server)
        client: RingClient = ring.client()
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            alone = await _answer(session, prompt)
            await session.close()
            parked = await client.open_session(GREEDY)
            await parked.step(PROMPTS[0] * 4, 0, last_only=True)  # 40 positions: 2 blocks
            await parked.park()
            await ring.until(lambda: [server.table.parked() for server in ring.servers] == [1, 1, 1])
            active = await client.open_session(GREEDY)
            assert await _answer(active, prompt) == alone
            assert ring.servers[0].table.evicted == 1
            with pytest.raises(SessionEvictedError, match="its KV blocks went to the steps of active sessions"):
                await parked.step([5], 40, last_only=True)
            await active.close()
        finally:
            await client.close()
            await ring.stop()

    asyncio.run(asyncio.wait_for(main(), 300))
