"""Pipelined prefill on real rings (issue 26): a long prompt sent down the ring in chunks leaves every stage's
KV state as one step would, so the answer is the one-step answer token for token. Checked on the f32 ring and on
a ring of one-thread int4 agents in their default precision (activations quantized on the fly), for pasted
documents of about 1,000 and 3,000 positions. Each chunk and the one step run on the stages' PagedAttention
compilations, whose blocks hold bit-identical KV either way (tests/integration/test_paged_prefill.py); before
them, the SDPA graph's rounding changed with a step's size in the int4 default precision, and a chunked answer's
second token differed from the one-step answer's on a 1,018-position prompt. All four run in the suite: on the
paged compilations a 3,000-position prompt costs the rings about 12 s on 2 cores (92 s for the four, 2026-12-05).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import ChatTokenizer
from agent.head.decode import decode
from agent.head.prefill import DEFAULT_PREFILL_CHUNK, prefill_chunks
from agent.head.ring_client import RingClient
from agent.sampling.params import SamplingParams
from agent.transport.network import TlsNetwork
from shards.manifest import Manifest
from tests.integration.ring_lab import AgentProcess, Fleet, start_ring

pytestmark = pytest.mark.processes
ANSWER_TOKENS = 8


@pytest.fixture(scope="module")
def ring3_int4_one_thread(exported: Callable[..., Path], fleet: Fleet, cache_dir: Path) -> Iterator[list[AgentProcess]]:
    """Three one-thread agents over the int4 3-stage export, in the default precision."""
    agents = start_ring(exported(3, "int4"), fleet, cache_dir, 3, prefix="int4-1t-node", extra=["--threads", "1"])
    yield agents
    for agent in agents:
        agent.stop()


def document_prompt(tokenizer: ChatTokenizer, positions: int) -> list[int]:
    """The chat prompt of a pasted log of at least ``positions`` positions, asking for its summary."""

    def prompt(lines: int) -> list[int]:
        log = "\n".join(
            f"{i:05d} worker-{i % 7} handled request {i * 37 % 1009} in {i % 13 + 2} ms" for i in range(lines)
        )
        return tokenizer.encode_chat([{"role": "user", "content": f"Summarise this log:\n{log}"}])

    per_line = (len(prompt(41)) - len(prompt(1))) / 40
    lines = max(1, int(positions / per_line))
    while len(prompt(lines)) < positions:
        lines += 1
    return prompt(lines)


def _answers(
    manifest: Manifest, ring: list[AgentProcess], fleet: Fleet, prompt: list[int]
) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """The greedy answer to ``prompt`` sent as one step, then in chunks, with the chunks' progress reports."""
    identity = fleet.identity("prefill-head")

    async def answer(chunk: int, reports: list[tuple[int, int]]) -> list[int]:
        client = RingClient(
            manifest, ring[0].address, ring[-1].address, TlsNetwork.of(identity), identity.name, prefill_chunk=chunk
        )
        await client.connect()
        session = client.session(SamplingParams())
        session.watch_prefill(lambda done, total: reports.append((done, total)))
        try:
            tokens = decode(
                session,
                prompt,
                max_tokens=ANSWER_TOKENS,
                stop_ids=frozenset(),
                params=SamplingParams(),
                context_tokens=manifest.context_tokens,
                k_policy=AdaptiveK(),
                turn=client.turn,
            )
            return [t async for t in tokens]
        finally:
            await session.close()
            await client.close()

    one_step: list[tuple[int, int]] = []
    reports: list[tuple[int, int]] = []
    whole = asyncio.run(answer(0, one_step))
    chunked = asyncio.run(answer(DEFAULT_PREFILL_CHUNK, reports))
    assert one_step == []
    return whole, chunked, reports


@pytest.mark.parametrize(
    ("ring_name", "positions"),
    [
        pytest.param("ring3", 1000, id="f32-1k"),
        pytest.param("ring3", 3000, id="f32-3k"),
        pytest.param("ring3_int4_one_thread", 1000, id="int4-one-thread-1k"),
        pytest.param("ring3_int4_one_thread", 3000, id="int4-one-thread-3k"),
    ],
)
def test_a_chunked_prompt_gives_the_one_step_answer(
    ring_name: str, positions: int, request: pytest.FixtureRequest, exported: Callable[..., Path], fleet: Fleet
) -> None:
    ring: list[AgentProcess] = request.getfixturevalue(ring_name)
    folder = exported(3, "fp32" if ring_name == "ring3" else "int4")
    prompt = document_prompt(ChatTokenizer(folder / "tokenizer"), positions)
    whole, chunked, reports = _answers(Manifest.load(folder), ring, fleet, prompt)
    sizes = prefill_chunks(0, len(prompt), DEFAULT_PREFILL_CHUNK)
    assert len(sizes) >= 2
    assert reports == [(sum(sizes[: i + 1]), len(prompt)) for i in range(len(sizes) - 1)]
    assert len(whole) == ANSWER_TOKENS
    assert chunked == whole, f"{len(prompt)} positions in chunks of {sizes}"
