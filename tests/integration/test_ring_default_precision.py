"""The ring in the CPU's default precision: int4 stages on one thread each (one "PC" of the benchmark), where
masked drafts would move later logits, so every agent cuts rejected drafts out of its KV state
(``RuntimeConfig.rewind``) and speculative greedy decoding still equals plain greedy decoding, token for
token, also with steps pipelined."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import NGramDrafter
from agent.head.ring_client import RingClient
from agent.sampling.params import SamplingParams
from agent.transport.network import TlsNetwork
from shards.manifest import Manifest
from tests.conftest import REFERENCE_PROMPTS, REFERENCE_TOKENS
from tests.integration.ring_lab import AgentProcess, Fleet, status

pytestmark = pytest.mark.processes
GREEDY = SamplingParams()


def test_speculative_greedy_equals_plain_through_a_default_ring(
    ring3_int4: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    chat_ids: list[list[int]],
) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    identity = fleet.identity("int4-head")
    for agent in ring3_int4:
        reported = status(agent.address, identity)
        assert (reported["rewind"], reported["exact_speculation"]) == ("compact", True)
    stats = DecodeStats()

    async def run(speculative: bool, depth: int) -> list[list[int]]:
        client = RingClient(
            manifest, ring3_int4[0].address, ring3_int4[-1].address, TlsNetwork.of(identity), identity.name
        )
        await client.connect()
        try:
            results = []
            for ids in chat_ids[:REFERENCE_PROMPTS]:
                session = client.session(GREEDY)
                try:
                    results.append(
                        [
                            t
                            async for t in decode(
                                session,
                                ids,
                                max_tokens=REFERENCE_TOKENS,
                                stop_ids=frozenset(),
                                params=GREEDY,
                                context_tokens=manifest.context_tokens,
                                drafter=NGramDrafter() if speculative else None,
                                k_policy=AdaptiveK(),
                                stats=stats if speculative else None,
                                depth=depth,
                                continue_above=0.0,
                            )
                        ]
                    )
                    # every stage cuts its rewinds on one thread: each answer says it was exact
                    assert session.repeatable()
                finally:
                    await session.close()
            return results
        finally:
            await client.close()

    plain = asyncio.run(run(False, 1))
    cut_before = [float(status(a.address, identity)["kv_cut_seconds"]) for a in ring3_int4]  # type: ignore[arg-type]
    for depth in (1, 2):
        assert asyncio.run(run(True, depth)) == plain, f"speculative tokens differ from plain at depth {depth}"
    print(f"\n{stats.accepted} of {stats.drafted} drafts kept, {stats.voided} of {stats.continued} continuations void")
    assert stats.accepted < stats.drafted and stats.voided > 0, "nothing was rewound: compaction was not exercised"
    cut_after = [float(status(a.address, identity)["kv_cut_seconds"]) for a in ring3_int4]  # type: ignore[arg-type]
    assert all(after > before for before, after in zip(cut_before, cut_after, strict=True)), (
        "an agent did not time its KV cuts"
    )
