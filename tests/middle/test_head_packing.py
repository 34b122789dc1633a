"""A head that holds stage 0 packs its own sessions' steps there (issue 45): what its sessions queue while its
stages are busy goes through them in one ``run_packed`` call, each session's answer still the one it gets alone;
a step that fails fails only its session.

Each test holds the head's compute thread for a moment so that several sessions' steps queue behind it: what the
head then computes is a pack, whatever the timing of the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from agent.chat_client.protocol import ChatRequest
from agent.errors import RuntimeStageError, SessionEvictedError, SessionFailedError
from agent.head.decode import decode
from agent.head.drafters import NGramDrafter
from agent.head.ring_client import RingClient, RingSession
from agent.runtime.packer import PackPolicy
from tests.middle.test_packed_sessions import BUDGET, LONG, PROMPTS
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, ring_and_chat, run
from tests.support.toy_model import ToySession, ToyStage, ToyTokenizer


@contextlib.asynccontextmanager
async def head_ring(
    packing: PackPolicy | None, kv: str = "paged"
) -> AsyncIterator[tuple[ToyRing, RingClient, ThreadPoolExecutor]]:
    """A toy ring of three stages whose stage 0 a head holds itself (its agent at stage 0 stays unused; ``kv``:
    where the head's stage says it keeps KV), and the head's compute thread."""
    ring = await ToyRing.start(max_sessions=8)
    executor = ThreadPoolExecutor(1, thread_name_prefix="head")
    stage = ToyStage(ring.manifest.stages[0], ring.weights, kv=kv)
    client = RingClient(
        ring.manifest,
        ring.servers[1].address,
        ring.servers[-1].address,
        ring.network.host("10.9.0.100"),
        "head",
        local_stages=[stage],
        executor=executor,
        liveness=ring.liveness,
        packing=packing,
    )
    await client.connect()
    try:
        yield ring, client, executor
    finally:
        await client.close()
        await ring.stop()
        executor.shutdown()


@contextlib.asynccontextmanager
async def held(executor: ThreadPoolExecutor) -> AsyncIterator[None]:
    """Keep the head's compute thread busy until the block ends: the sessions' steps queue up meanwhile."""
    gate = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(executor, gate.wait)
    try:
        yield
    finally:
        gate.set()
        await busy


async def queued(client: RingClient, sessions: int) -> None:
    """Until at least ``sessions`` sessions have a step queued for the head's stages."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while len(client.local._queues) < sessions:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"only {len(client.local._queues)} sessions ever queued at the head")
        await asyncio.sleep(0.002)


def test_a_heads_sessions_are_packed_on_its_own_stages_and_answer_as_alone() -> None:
    async def main() -> None:
        async with head_ring(PackPolicy(budget=BUDGET)) as (ring, client, executor):
            prompts = (*PROMPTS, LONG)
            expected = [await reference(ring, p) for p in prompts]
            sessions = [await client.open_session(GREEDY) for _ in prompts]
            drafters = [NGramDrafter() if i == 2 else None for i in range(len(prompts))]
            async with held(executor):
                answers = [
                    asyncio.ensure_future(answer(s, p, drafter=d))
                    for s, p, d in zip(sessions, prompts, drafters, strict=True)
                ]
                await queued(client, len(answers))
            assert list(await asyncio.gather(*answers)) == expected
            packer = client.local
            assert packer.packs < packer.packed_steps, "the head never computed two sessions' steps together"
            # the first pack held one step of every session: their prompts (the long one cut to the budget)
            assert packer.packed_steps - packer.packs >= len(prompts) - 1
            assert all(s.repeatable() for s in sessions)
            for session in sessions:
                await session.close()

    run(main)


@pytest.mark.parametrize(("packing", "kv"), [(None, "paged"), (PackPolicy(budget=BUDGET), "state")])
def test_packing_off_at_the_head_computes_one_step_at_a_time_with_the_same_answers(
    packing: PackPolicy | None, kv: str
) -> None:
    """Off, or on stages whose sessions keep their own KV state (a pack would run its steps one after another and
    hold the first back until the last is computed, as on a stage server)."""

    async def main() -> None:
        async with head_ring(packing, kv) as (ring, client, executor):
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]
            async with held(executor):
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(sessions, PROMPTS, strict=True)]
                await queued(client, len(answers))
            assert list(await asyncio.gather(*answers)) == expected
            assert client.local.packs == client.local.packed_steps > 0

    run(main)


def test_a_step_that_fails_on_the_heads_stages_fails_only_its_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack that raises fails the sessions it held (they may be half computed); at a budget of 4 rows a prompt's
    chunk is packed alone, so the doomed session's prompt fails in a pack of its own and the others go on."""

    async def main() -> None:
        async with head_ring(PackPolicy(budget=BUDGET)) as (ring, client, executor):
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]
            doomed = sessions[1]._local[0]
            step = ToySession.step

            def failing(self: ToySession, inputs: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
                if self is doomed:
                    raise RuntimeStageError("the toy stage fails this session's step")
                return step(self, inputs, *args, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(ToySession, "step", failing)
            async with held(executor):
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(sessions, PROMPTS, strict=True)]
                await queued(client, len(answers))
            results = await asyncio.gather(*answers, return_exceptions=True)
            assert isinstance(results[1], SessionFailedError) and "head's own stages" in str(results[1])
            assert [r for i, r in enumerate(results) if i != 1] == [e for i, e in enumerate(expected) if i != 1]
            # the head goes on packing: a new session after the failure answers as alone
            again = await client.open_session(GREEDY)
            assert await answer(again, PROMPTS[0]) == expected[0]

    run(main)


def test_sessions_taking_turns_on_the_heads_core_still_pack_their_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A head's sessions decode holding its turn (``HeadTurn``) for their local work; a step's turn ends once the
    step is queued, not computed, so the others queue theirs meanwhile: the head packs them with no thread held.
    Its stage takes 5 ms a step here, as a real one does (a toy step takes microseconds: nothing would queue)."""
    step = ToySession.step

    def slow(self: ToySession, inputs: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        time.sleep(0.005)
        return step(self, inputs, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ToySession, "step", slow)

    async def main() -> None:
        async with head_ring(PackPolicy(budget=BUDGET)) as (ring, client, _executor):
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]

            async def turns(session: RingSession, prompt: list[int]) -> list[int]:
                decoding = decode(
                    session,
                    prompt,
                    max_tokens=24,
                    stop_ids=ToyTokenizer.stop_ids,
                    params=GREEDY,
                    context_tokens=256,
                    turn=client.turn,
                )
                return [token async for token in decoding]

            answers = await asyncio.gather(*(turns(s, p) for s, p in zip(sessions, PROMPTS, strict=True)))
            assert list(answers) == expected
            assert client.local.packs < client.local.packed_steps, "the head's turns serialized its sessions' steps"

    run(main)


def test_an_agents_concurrent_chats_pack_on_its_stage_0_and_its_status_counts_the_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chat service's head (an agent holding stage 0) packs its chats' steps there: three chats at once get
    the whole model's answers, and the agent's status counts the packs of its own stages (``local_packs``)."""
    step = ToySession.step

    def slow(self: ToySession, inputs: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        time.sleep(0.005)
        return step(self, inputs, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ToySession, "step", slow)
    questions = ("where is the toy", "what is the toy", "who has the toy")

    async def main() -> None:
        async with ring_and_chat(tmp_path, chat_keep_max=3) as (ring, daemon):
            assert daemon.chats is not None
            chats = daemon.chats
            tokenizer = ToyTokenizer()

            async def chat(question: str) -> list[int]:
                request = ChatRequest(token=chats.token, messages=(("user", question),), max_tokens=16)
                events = [event async for event in chats.answer(request)]
                assert events[-1].event == "done", events[-1]
                return [e.id for e in events if e.event == "token" and e.id is not None]

            answers = await asyncio.gather(*(chat(q) for q in questions))
            for question, tokens in zip(questions, answers, strict=True):
                ids = tokenizer.encode_chat([{"role": "user", "content": question}])
                assert tokens == await reference(ring, ids, 16)
            status = chats.status()
            assert 0 < status["local_packs"] < status["local_packed_steps"], status

    run(main)


def test_an_agents_own_chat_short_of_kv_blocks_evicts_a_session_another_head_parked_there(tmp_path: Path) -> None:
    """The chat agent's stage 0 has a pool of 8 blocks of 4 positions, and serves another head too. That head's
    session parks there at 10 positions (3 blocks); the agent's own chat then needs all 8 as it answers: the
    parked session gives its blocks up (its head hears ``evicted``) and the chat's answer is the whole model's."""

    async def main() -> None:
        async with ring_and_chat(tmp_path, max_sessions=8, kv_blocks=8, drafter="none") as (ring, daemon):
            assert daemon.chats is not None
            chats = daemon.chats
            other = RingClient(
                ring.manifest,
                daemon.server.address,
                ring.servers[-1].address,
                ring.network.host("10.9.0.101"),
                "other-head",
                liveness=ring.liveness,
            )
            await other.connect()
            try:
                parked = await other.open_session(GREEDY)
                await parked.step(PROMPTS[0], 0, last_only=True)
                await parked.park()
                await ring.until(lambda: daemon.server.table.parked() == 1)
                question = "where is the toy"
                ids = ToyTokenizer().encode_chat([{"role": "user", "content": question}])
                assert len(ids) == 20, "the chat's 20 + 12 positions fill the 8 blocks"
                request = ChatRequest(token=chats.token, messages=(("user", question),), max_tokens=12)
                events = [event async for event in chats.answer(request)]
                assert events[-1].event == "done", events[-1]
                assert [e.id for e in events if e.event == "token"] == await reference(ring, ids, 12)
                assert daemon.server.table.evicted == 1
                with pytest.raises(SessionEvictedError, match="its KV blocks went to the steps of active sessions"):
                    await parked.step([5], len(PROMPTS[0]), last_only=True)
            finally:
                await other.close()

    run(main)
