"""The ring (issue 3): agents as separate processes on loopback, a head driving them over mTLS.

Acceptance 1 (ring == in-process pipeline == transformers), 2 (speculative decoding with each
drafter == plain greedy), 3 (concurrent sessions from two heads == alone), the "fleet busy"
limit, the prompt-length check, and 6 (a killed head frees its session on every stage).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.errors import PromptTooLongError
from agent.fleet import NodeIdentity
from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import ChatTokenizer
from agent.head.decode import DecodeStats, decode
from agent.head.drafting import DrafterFactory, make_drafter
from agent.head.ring_client import RingClient, RingSession
from agent.head.targets import LocalTarget
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from agent.sampling.params import SamplingParams
from agent.transport.network import TlsNetwork
from shards.manifest import Manifest
from tests.conftest import PROMPTS, REFERENCE_PROMPTS, REFERENCE_TOKENS, greedy
from tests.integration.ring_lab import AgentProcess, Fleet, status

pytestmark = pytest.mark.processes
GREEDY = SamplingParams()
N_TOKENS = REFERENCE_TOKENS
SPEC_TOKENS = 16
"""Speculative answers are short, one per prompt: each starts with a fresh K controller, whose first steps draft
the most, so four answers of 16 tokens judge about as many drafts as two of 32, and more drafts made ahead
(a draft model's, while the ring answers: measured 10 of them against 6)."""


def _client(folder: Path, ring: list[AgentProcess], identity: NodeIdentity) -> RingClient:
    return RingClient(Manifest.load(folder), ring[0].address, ring[-1].address, TlsNetwork.of(identity), identity.name)


def _decoding(
    session: RingSession,
    client: RingClient,
    prompt: list[int],
    params: SamplingParams = GREEDY,
    drafter: object = None,
    k: int | None = None,
    n: int = N_TOKENS,
    stats: DecodeStats | None = None,
    depth: int = 1,
    continue_above: float = 0.7,
    draft_ahead: bool = False,
) -> AsyncIterator[int]:
    return decode(
        session,
        prompt,
        max_tokens=n,
        stop_ids=frozenset(),
        params=params,
        context_tokens=client.manifest.context_tokens,
        drafter=drafter,  # type: ignore[arg-type]
        k_policy=AdaptiveK(fixed=k),
        stats=stats,
        depth=depth,
        continue_above=continue_above,
        turn=client.turn,
        draft_ahead=draft_ahead,
    )


async def _generate(client: RingClient, prompt: list[int], **kwargs: Any) -> list[int]:
    session = client.session(kwargs.get("params", GREEDY))
    try:
        return [t async for t in _decoding(session, client, prompt, **kwargs)]
    finally:
        await session.close()


def _ring_tokens(
    folder: Path, ring: list[AgentProcess], identity: NodeIdentity, prompts: list[list[int]], **kwargs: object
) -> list[list[int]]:
    async def run() -> list[list[int]]:
        client = _client(folder, ring, identity)
        await client.connect()
        try:
            return [await _generate(client, p, **kwargs) for p in prompts]  # type: ignore[arg-type]
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def pipeline_tokens(exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]) -> list[list[int]]:
    """Greedy tokens (N_TOKENS) of the in-process fp32 3-stage pipeline."""
    folder = exported(3, "fp32")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    return [greedy(pipeline.new_session(), ids, N_TOKENS)[0] for ids in chat_ids]


def test_ring_matches_pipeline_and_transformers(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    chat_ids: list[list[int]],
    pipeline_tokens: list[list[int]],
    hf_reference: list[tuple[list[int], np.ndarray]],
) -> None:
    tokens = _ring_tokens(exported(3, "fp32"), ring3, fleet.identity("head"), chat_ids[:REFERENCE_PROMPTS])
    checked = zip(PROMPTS[:REFERENCE_PROMPTS], tokens, pipeline_tokens[:REFERENCE_PROMPTS], hf_reference, strict=True)
    for prompt, ring, local, (hf, _) in checked:
        assert ring == local, f"ring differs from the in-process pipeline on {prompt!r}"
        assert ring == hf, f"ring differs from transformers on {prompt!r}"


@pytest.mark.parametrize("drafter", ["ngram", "self-draft", "draft-model"])
def test_speculative_decoding_is_token_exact(
    drafter: str,
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
    pipeline_tokens: list[list[int]],
    record_property: Callable[[str, object], None],
) -> None:
    folder = exported(3, "fp32")
    manifest = Manifest.load(folder)
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov")
    # self-draft: the int4 3-stage export carries 4 layers of SmolLM2 as a draft;
    # draft model: a whole int4 1-stage export of the same model (a quantized sibling)
    source = {"ngram": None, "self-draft": (3, "int4"), "draft-model": (1, "int4")}[drafter]
    draft_export = exported(*source) if source else None
    kind = "ngram" if drafter == "ngram" else "draft"
    ahead = drafter == "draft-model"  # opt-in drafting ahead, on one of the two model drafters
    stats = DecodeStats()

    async def run() -> list[list[int]]:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        try:
            # one factory for the answers, as an agent's chats share one: a draft model is compiled once, off the
            # event loop, and each answer gets a drafter of its own
            factory = DrafterFactory(kind, folder, manifest, config, draft_export)
            await asyncio.get_running_loop().run_in_executor(None, factory.prepare)
            results = []
            for ids in chat_ids:
                draft = factory.new(GREEDY)
                assert draft is not None
                results.append(
                    await _generate(client, ids, drafter=draft, n=SPEC_TOKENS, stats=stats, draft_ahead=ahead)
                )
            return results
        finally:
            await client.close()

    tokens = asyncio.run(run())
    print(
        f"\n{drafter}: acceptance {stats.acceptance:.1%} of {stats.drafted} drafted, "
        f"{stats.tokens / max(stats.steps + len(chat_ids), 1):.2f} tokens per ring step, median K {stats.median_k}, "
        f"drafts ahead used {stats.ahead_used} of {stats.drafted_ahead}"
    )
    record_property("acceptance", stats.acceptance)
    assert stats.drafted > 0, "the drafter never drafted: speculation was not exercised"
    if ahead:  # the model drafted while the ring answered, and some of those drafts went out as made
        assert stats.ahead_used > 0, "no draft made ahead was used: drafting ahead was not exercised"
    for prompt, spec, plain in zip(PROMPTS, tokens, pipeline_tokens, strict=True):
        assert spec == plain[:SPEC_TOKENS], f"{drafter}: speculative tokens differ from greedy decoding on {prompt!r}"


def test_pipelined_speculation_is_token_exact(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    chat_ids: list[list[int]],
    pipeline_tokens: list[list[int]],
) -> None:
    """Up to three steps of one session in flight through three agents, drafts continued past unjudged ones."""
    folder = exported(3, "fp32")
    manifest = Manifest.load(folder)
    stats = DecodeStats()

    async def run() -> list[list[int]]:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        try:
            # continue_above=0: every draft is continued, so continuations are judged as well as voided
            return [
                await _generate(
                    client,
                    ids,
                    stats=stats,
                    depth=3,
                    continue_above=0.0,
                    drafter=make_drafter("ngram", folder, manifest, GREEDY, RuntimeConfig()),
                )
                for ids in chat_ids
            ]
        finally:
            await client.close()

    tokens = asyncio.run(run())
    print(
        f"\npipelined: {stats.continued} steps sent behind unjudged ones, {stats.voided} of them void; "
        f"acceptance {stats.acceptance:.1%}"
    )
    assert stats.continued > stats.voided, "no continuation was ever judged: pipelining was not exercised"
    for prompt, spec, plain in zip(PROMPTS, tokens, pipeline_tokens, strict=True):
        assert spec == plain, f"pipelined speculative tokens differ from greedy decoding on {prompt!r}"


def test_concurrent_sessions_from_two_heads_match_alone(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
    pipeline_tokens: list[list[int]],
) -> None:
    """Head A runs two sessions at once (one speculative) while head B, another process, runs a third.

    A's sessions start, then wait holding their state on every stage until B's session has joined them
    there, so all three are held at once and A's steps interleave with B's through the ring. Each answer is
    the one it gets alone: the in-process pipeline's."""
    folder = exported(3, "fp32")
    head_b = fleet.identity("head-b")
    observer = fleet.identity("observer")
    prompt_b = PROMPTS[3]
    command = [
        sys.executable,
        "-m",
        "agent.cli.main",
        "--cache-dir",
        str(cache_dir),
        "generate",
        str(folder),
        prompt_b,
        "--max-tokens",
        str(N_TOKENS),
        "--drafter",
        "none",
        "--no-verify",
        "--identity",
        str(head_b.cert.parent),
        "--ring",
        f"{ring3[0].address[0]}:{ring3[0].address[1]},{ring3[-1].address[0]}:{ring3[-1].address[1]}",
    ]
    # B alone would print the pipeline's greedy answer, up to its first stop token, as `shoal generate` does
    tokenizer = ChatTokenizer(folder / "tokenizer")
    plain_b = pipeline_tokens[3]
    stop_at = next((i for i, token in enumerate(plain_b) if token in tokenizer.stop_ids), len(plain_b))
    alone_b = tokenizer.decode(plain_b[:stop_at]) + "\n"

    async def held_everywhere(count: int) -> None:
        while True:
            reports = [await asyncio.to_thread(status, a.address, observer) for a in ring3]
            counts = [len(report["sessions"]) for report in reports]  # type: ignore[arg-type]
            if min(counts) >= count:
                return
            await asyncio.sleep(0.02)

    async def together() -> tuple[list[list[int]], str]:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        sessions = [client.session(GREEDY), client.session(GREEDY)]
        drafter = make_drafter("ngram", folder, client.manifest, GREEDY, RuntimeConfig())
        answers = [
            _decoding(sessions[0], client, chat_ids[0]),
            _decoding(sessions[1], client, chat_ids[1], drafter=drafter),
        ]
        try:
            firsts = [await anext(answer) for answer in answers]  # both prompts are on every stage now
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            await asyncio.wait_for(held_everywhere(3), 120)
            assert process.returncode is None, "head B finished before head A went on: nothing overlapped"

            async def rest(answer: AsyncIterator[int]) -> list[int]:
                return [t async for t in answer]

            rests = await asyncio.gather(*(rest(answer) for answer in answers))
            out, err = await asyncio.wait_for(process.communicate(), 300)
            assert process.returncode == 0, err.decode()
            return [[first, *more] for first, more in zip(firsts, rests, strict=True)], out.decode()
        finally:
            for session in sessions:
                await session.close()
            await client.close()

    (a1, a2), text_b = asyncio.run(together())
    assert a1 == pipeline_tokens[0]
    assert a2 == pipeline_tokens[1]
    assert text_b == alone_b


def test_prompt_too_long_fails_before_anything_is_sent(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
) -> None:
    folder = exported(3, "fp32")
    before = status(ring3[0].address, fleet.identity("head"))["steps_served"]

    async def run() -> None:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        try:
            with pytest.raises(PromptTooLongError, match="context"):
                await _generate(client, [1] * client.manifest.context_tokens, n=16)
        finally:
            await client.close()

    asyncio.run(run())
    assert status(ring3[0].address, fleet.identity("head"))["steps_served"] == before


def test_in_process_target_and_ring_sample_identically(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
) -> None:
    """Sampling (temperature, top-p, seed) with n-gram speculation: the ring draws what the pipeline draws."""
    folder = exported(3, "fp32")
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)
    manifest = Manifest.load(folder)
    pipeline = LocalPipeline(folder, manifest, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))

    async def local() -> list[int]:
        target = LocalTarget(pipeline.new_session(), params, ThreadPoolExecutor(1))
        return [
            t
            async for t in decode(
                target,
                chat_ids[1],
                max_tokens=N_TOKENS,
                stop_ids=frozenset(),
                params=params,
                context_tokens=manifest.context_tokens,
                drafter=make_drafter("ngram", folder, manifest, params, RuntimeConfig()),
                k_policy=AdaptiveK(fixed=3),
            )
        ]

    async def ring() -> list[int]:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        try:
            return await _generate(
                client,
                chat_ids[1],
                params=params,
                n=N_TOKENS,
                k=3,
                drafter=make_drafter("ngram", folder, manifest, params, RuntimeConfig()),
            )
        finally:
            await client.close()

    assert asyncio.run(ring()) == asyncio.run(local())


@pytest.mark.parametrize("depth", [1, 2])
def test_head_holding_stage_zero_runs_it_in_process(
    depth: int,
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
    pipeline_tokens: list[list[int]],
) -> None:
    """The head computes stage 0 itself and sends hidden states to the agent of stage 1 (one step at a
    time, or pipelined: the next step's stage 0 runs while the agents work on the one before)."""
    from agent.runtime.stage import CompiledStage

    folder = exported(3, "fp32")
    manifest = Manifest.load(folder)
    identity = fleet.identity("head")
    stage0 = CompiledStage(folder, manifest.stages[0], manifest.weights, RuntimeConfig(device="CPU"))

    async def run() -> list[int]:
        client = RingClient(
            manifest,
            ring3[1].address,
            ring3[2].address,
            TlsNetwork.of(identity),
            identity.name,
            local_stages=[stage0],
            executor=ThreadPoolExecutor(1),
        )
        await client.connect()
        try:
            return await _generate(
                client,
                chat_ids[3],
                depth=depth,
                drafter=make_drafter("ngram", folder, manifest, GREEDY, RuntimeConfig()),
            )
        finally:
            await client.close()

    assert asyncio.run(run()) == pipeline_tokens[3]
