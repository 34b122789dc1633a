"""Packed steps (issue 45): a stage computes the ready steps of several sessions together, a long prompt in chunks
between the others' decode rows, and every session's tokens are those it gets alone; a session evicted, parked,
cancelled or whose head vanished in the middle of others' packed steps leaves their tokens unchanged, and chats
whose stage is lost mid-decode are replayed with their answers unchanged.

Most tests hold a stage's worker thread for a moment (``held``) so that several sessions' steps queue behind it:
what the stage then computes is a pack, whatever the timing of the machine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest

from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.errors import FleetBusyError, SessionEvictedError, SessionFailedError
from agent.head.drafters import NGramDrafter
from agent.head.resumable import ResumableTarget
from agent.head.ring_client import RingSession
from agent.node.server import StageServer
from agent.wire import Frame, FrameType
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, ring_and_chat, run
from tests.support.toy_model import ToyTokenizer

PROMPTS = (
    [1, 3, 9, 14, 22, 9, 14, 31, 2, 4],
    [1, 3, 40, 41, 42, 43, 2, 4],
    [1, 3, *([7, 8, 9, 10] * 6), 2, 4],
    [1, 3, 60, 61, 62, 2, 4],
)
LONG = [1, 3, *range(20, 60), 2, 4]
"""44 positions: 11 chunks at a budget of 4 rows."""
BUDGET = 4


@contextlib.asynccontextmanager
async def held(server: StageServer) -> AsyncIterator[None]:
    """Keep ``server`` 's worker thread busy until the block ends: the steps that reach it meanwhile queue up."""
    gate = threading.Event()
    busy = asyncio.get_running_loop().run_in_executor(server.executor, gate.wait)
    try:
        yield
    finally:
        gate.set()
        await busy


def waiting(server: StageServer) -> list[Frame]:
    """The frames ``server`` has taken or queued and not handled yet, and the steps it is computing."""
    queue: collections.deque[Any] = server._queue._queue  # type: ignore[attr-defined]
    return [w.frame for w in (*server._pending, *queue, *(r.work for r in server._running.values()))]


async def queued(server: StageServer, frames: int = 0, steps_of: Iterable[int] = ()) -> None:
    """Until ``server`` has at least ``frames`` frames waiting (queued, or taken and not yet computed), a step of
    each session of ``steps_of`` among them."""
    sessions = set(steps_of)
    deadline = asyncio.get_running_loop().time() + 5.0
    while len(frames_now := waiting(server)) < frames or not sessions <= {
        f.session for f in frames_now if f.type is FrameType.STEP
    }:
        if asyncio.get_running_loop().time() > deadline:
            seen = [f"{f.type.name} {f.session:x}" for f in frames_now]
            raise AssertionError(f"{server.node} never had {frames} frames and steps of {sessions} waiting: {seen}")
        await asyncio.sleep(0.002)


def extra_chunks(server: StageServer) -> int:
    """The slices a stage computed beyond one per step: the chunks of prompts cut by its packer."""
    return server.packed_steps - server.steps_served


async def close_all(ring: ToyRing, sessions: Iterable[RingSession]) -> None:
    """Close ``sessions`` and wait until no stage holds any session."""
    for session in sessions:
        await session.close()
    await ring.until(lambda: ring.held() == [0] * len(ring.servers))


def test_sessions_of_two_heads_packed_together_get_their_answers_alone() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        heads = [ring.client("10.9.0.100"), ring.client("10.9.0.101")]
        for head in heads:
            await head.connect()
        try:
            expected = [await reference(ring, p) for p in (*PROMPTS, LONG)]
            sessions = [await heads[i % 2].open_session(GREEDY) for i in range(len(expected))]
            drafters = [NGramDrafter() if i == 2 else None for i in range(len(expected))]
            async with held(ring.servers[0]):
                answers = [
                    asyncio.ensure_future(answer(s, p, drafter=d))
                    for s, p, d in zip(sessions, (*PROMPTS, LONG), drafters, strict=True)
                ]
                await queued(ring.servers[0], len(answers))
            assert list(await asyncio.gather(*answers)) == expected
            first = ring.servers[0]
            assert first.packs < first.packed_steps, "stage 0 never computed two steps together"
            # beside the others' steps at stage 0, the prompts went in chunks of the budget (the long one in 11)
            assert extra_chunks(first) >= len(LONG) // BUDGET - 1
            await close_all(ring, sessions)
        finally:
            for head in heads:
                await head.close()
            await ring.stop()

    run(main)


def test_packing_off_computes_one_step_at_a_time_with_the_same_answers() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=0)
        client = ring.client()
        await client.connect()
        try:
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await client.open_session(GREEDY) for _ in PROMPTS]
            async with held(ring.servers[0]):
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(sessions, PROMPTS, strict=True)]
                await queued(ring.servers[0], len(answers))
            assert list(await asyncio.gather(*answers)) == expected
            assert all(server.packs == server.packed_steps == server.steps_served for server in ring.servers)
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_session_evicted_while_others_are_packed_leaves_their_tokens_unchanged() -> None:
    """Stage 0 holds two places: a parked session and a long prompt being chunked. A newcomer's OPEN, queued
    behind the prompt's first chunk, evicts the parked one between chunks; the prompt's answer and the
    newcomer's are the whole model's."""

    async def main() -> None:
        ring = await ToyRing.start(max_sessions=2, pack_budget=BUDGET)
        client = ring.client()
        await client.connect()
        try:
            expected_long, expected_new = await reference(ring, LONG), await reference(ring, PROMPTS[1])
            kept = await client.open_session(GREEDY)
            await kept.step(PROMPTS[0], 0, last_only=True)
            await kept.park()
            chunked = await client.open_session(GREEDY)
            first = ring.servers[0]
            async with held(first):
                long_answer = asyncio.ensure_future(answer(chunked, LONG))
                await queued(first, 1)
                newcomer = await client.open_session(GREEDY)
                new_answer = asyncio.ensure_future(answer(newcomer, PROMPTS[1]))
                await queued(first, 2)
            assert await long_answer == expected_long
            assert await new_answer == expected_new
            assert first.table.evicted == 1 and extra_chunks(first) > 0
            with pytest.raises(SessionEvictedError):
                await kept.step([5], 0, last_only=True)
            await close_all(ring, (kept, chunked, newcomer))
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_stage_short_of_kv_blocks_evicts_the_session_parked_longest_ago() -> None:
    """Each stage's pool holds 10 blocks of 4 positions. Two sessions parked (10 and 7 positions: 3 and 2 blocks)
    leave 5 free; two active sessions' answers, packed together, need 8 (15 positions each). The session parked
    first gives its blocks up (its head hears ``evicted``), the one parked later keeps its place, and the answers
    are the whole model's."""

    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET, kv_blocks=10)
        client = ring.client()
        await client.connect()
        try:
            prompts = ([1, 3, 40, 41, 2, 4], [1, 3, 60, 61, 2, 4])
            expected = [await reference(ring, p, 10) for p in prompts]
            older, newer = await client.open_session(GREEDY), await client.open_session(GREEDY)
            await older.step(PROMPTS[0], 0, last_only=True)
            await older.park()
            await newer.step(PROMPTS[3], 0, last_only=True)
            await newer.park()
            await ring.until(lambda: [server.table.parked() for server in ring.servers] == [2, 2, 2])
            active = [await client.open_session(GREEDY) for _ in prompts]
            first = ring.servers[0]
            async with held(first):
                answers = [asyncio.ensure_future(answer(s, p, 10)) for s, p in zip(active, prompts, strict=True)]
                await queued(first, steps_of=[s.id for s in active])
            assert list(await asyncio.gather(*answers)) == expected
            assert first.table.evicted == 1 and first.packs < first.packed_steps
            await ring.until(lambda: ring.held() == [3, 3, 3])
            with pytest.raises(SessionEvictedError, match="its KV blocks went to the steps of active sessions"):
                await older.step([5], len(PROMPTS[0]), last_only=True)
            assert first.status()["kv_blocks"] == [(10, 10)], "the newer one's 2 blocks and the two answers' 4 each"
            assert (await newer.step([5], len(PROMPTS[3]), last_only=True)) is not None, "the newer one was kept"
            await close_all(ring, (newer, *active))
            assert [s.status()["kv_blocks"] for s in ring.servers] == [[(0, 10)]] * 3
            assert first.status()["kv"] == ["paged"]
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_prompt_that_no_eviction_could_seat_is_busy_and_evicts_nobody() -> None:
    """A prompt of 44 positions needs 11 blocks of a pool of 8: it is answered "fleet busy" and the parked session
    keeps its blocks (evicting it would not have made room), and goes on afterwards. The stages cut every prompt
    at the budget (their numbers depend on the cuts), so the prompt runs out of room in the middle of its chunks."""

    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET, kv_blocks=8)
        for stage in ring.stages:
            stage.rounds_prompts_by_step = True
        client = ring.client()
        await client.connect()
        try:
            parked = await client.open_session(GREEDY)
            await parked.step(PROMPTS[0], 0, last_only=True)
            await parked.park()
            await ring.until(lambda: [server.table.parked() for server in ring.servers] == [1, 1, 1])
            greedy = await client.open_session(GREEDY)
            with pytest.raises(FleetBusyError, match="fleet busy"):
                await answer(greedy, LONG)
            assert [server.table.evicted for server in ring.servers] == [0, 0, 0]
            assert extra_chunks(ring.servers[0]) >= 4, "the prompt was not cut into chunks"
            assert (await parked.step([5], len(PROMPTS[0]), last_only=True)) is not None
            await close_all(ring, (parked,))
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_session_parked_while_others_are_packed_leaves_them_unchanged_and_resumes_where_it_stopped() -> None:
    """A conversation's first turn is computed in packs with four other sessions (a long prompt among them, in
    chunks). It parks while their steps wait at the held last stage, and its second turn is sent right behind its
    PARK: at the last stage both are handled between the others' packed steps. The others' answers are the whole
    model's; the second turn reuses the parked positions and its answer is that of the whole conversation sent
    afresh."""

    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        client = ring.client()
        await client.connect()
        try:
            others_prompts = (*PROMPTS[1:], LONG)
            expected = [await reference(ring, p) for p in others_prompts]
            first_turn = PROMPTS[0]
            expected_first = await reference(ring, first_turn, 6)
            second_turn = [*first_turn, *expected_first, 5, 6, 7, 8]
            expected_second = await reference(ring, second_turn)
            inner = await client.open_session(GREEDY)
            kept = ResumableTarget(inner, GREEDY, grid=0)
            others = [await client.open_session(GREEDY) for _ in others_prompts]
            first, last = ring.servers[0], ring.servers[-1]
            async with held(first):
                turn = asyncio.ensure_future(answer(kept, first_turn, 6))
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(others, others_prompts, strict=True)]
                await queued(first, 1 + len(answers))
            assert await turn == expected_first
            async with held(last):
                await kept.park()
                await ring.until(lambda: [server.table.parked() for server in ring.servers[:-1]] == [1, 1])
                assert not any(a.done() for a in answers), "the others were to be mid-answer as it parked"
                kept.resume()
                resumed = asyncio.ensure_future(answer(kept, second_turn))
                # every other session's step and the second turn's prompt wait at the last stage, the PARK handled
                # before them or in the same round
                await queued(last, steps_of=[inner.id, *(s.id for s in others)])
            assert list(await asyncio.gather(*answers)) == expected
            assert await resumed == expected_second
            assert kept.reused == len(first_turn) + len(expected_first) - 1, "the parked positions were computed again"
            assert all(server.table.parked() == 0 for server in ring.servers)
            assert first.packs < first.packed_steps and last.packs < last.packed_steps
            await close_all(ring, (inner, *others))
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_chats_whose_stage_is_lost_mid_packed_decode_are_replayed_with_their_answers_unchanged(tmp_path: Path) -> None:
    """Four chats of one agent decode at once, packed on the ring's stages; stage 1's PC vanishes once they are
    all mid-answer and a fresh agent (no sessions) is back there 0.3 s later. The agent replays every chat into a
    fresh session, the replays pack there too, and each answer is the whole model's (the real processes' case,
    kill -9 and a standby: tests/integration/test_packed_replay.py)."""
    questions = ("where is the toy", "what is the toy made of", "who found the toy", "x")

    async def main() -> None:
        # no drafts: every token is a step, so the chats go on at one pace (one drafted whole in a few steps)
        async with ring_and_chat(tmp_path, max_sessions=8, drafter="none") as (ring, daemon):
            chats = daemon.chats
            assert chats is not None
            prompts = [ToyTokenizer().encode_chat([{"role": "user", "content": q}]) for q in questions]
            expected = [await reference(ring, p, 40) for p in prompts]
            tokens: list[list[int]] = [[] for _ in questions]
            ends: list[ChatEvent | None] = [None for _ in questions]

            async def chat(index: int) -> None:
                request = ChatRequest(token=chats.token, messages=(("user", questions[index]),), max_tokens=40)
                async for event in chats.answer(request):
                    if event.event == "token" and event.id is not None:
                        tokens[index].append(event.id)
                    elif event.event in ("done", "error"):
                        ends[index] = event

            answering = asyncio.ensure_future(asyncio.gather(*(chat(i) for i in range(len(questions)))))
            await ring.until(lambda: min(map(len, tokens)) >= 6)
            await ring.vanish(1)
            lost_at = [len(t) for t in tokens]
            asyncio.get_running_loop().call_later(0.3, lambda: asyncio.ensure_future(ring.restart(1)))
            await answering
            assert all(n < len(e) for n, e in zip(lost_at, expected, strict=True)), (
                f"a chat had ended: {lost_at}, {expected}"
            )
            assert [e.event if e else None for e in ends] == ["done"] * len(questions), ends
            assert [e.stats["replays"] if e and e.stats else None for e in ends] == [1] * len(questions)
            assert tokens == expected
            fresh = ring.servers[1]
            assert fresh.packs < fresh.packed_steps, "the replayed sessions never packed on the fresh stage 1"

    run(main)


def test_a_session_cancelled_in_the_middle_of_its_chunks_leaves_the_others_unchanged() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        client = ring.client()
        await client.connect()
        try:
            expected = [await reference(ring, p) for p in PROMPTS]
            others = [await client.open_session(GREEDY) for _ in PROMPTS]
            doomed = await client.open_session(GREEDY)
            first = ring.servers[0]
            async with held(first):
                cancelled = asyncio.ensure_future(answer(doomed, LONG))
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(others, PROMPTS, strict=True)]
                await queued(first, 1 + len(answers))
            await asyncio.sleep(0)
            cancelled.cancel()
            await doomed.close()  # its CLOSE queues behind its chunked prompt, between the others' steps
            assert list(await asyncio.gather(*answers)) == expected
            with contextlib.suppress(asyncio.CancelledError):
                await cancelled
            await close_all(ring, others)
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_head_that_vanishes_while_its_prompt_is_chunked_leaves_the_others_unchanged() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        doomed_head, head = ring.client("10.9.0.66"), ring.client("10.9.0.77")
        await doomed_head.connect()
        await head.connect()
        try:
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await head.open_session(GREEDY) for _ in PROMPTS]
            doomed = await doomed_head.open_session(GREEDY)
            middle = ring.servers[1]
            async with held(middle):
                lost = asyncio.ensure_future(answer(doomed, LONG))
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(sessions, PROMPTS, strict=True)]
                await queued(middle, 1 + len(answers))
                ring.network.host("10.9.0.66").vanish()  # its upstream drops while its chunks wait at stage 1
            assert list(await asyncio.gather(*answers)) == expected
            with contextlib.suppress(Exception):
                await lost
            await ring.until(lambda: ring.held() == [len(PROMPTS)] * 3)
            await close_all(ring, sessions)
        finally:
            await doomed_head.close()
            await head.close()
            await ring.stop()

    run(main)


def test_a_bug_in_the_worker_fails_the_sessions_of_its_steps_and_the_worker_goes_on() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        client = ring.client()
        await client.connect()
        middle = ring.servers[1]
        real = middle._run_pack

        async def broken(pack: object) -> None:
            middle._run_pack = real  # type: ignore[method-assign]
            raise RuntimeError("a bug in the worker")

        try:
            unlucky = await client.open_session(GREEDY)
            middle._run_pack = broken  # type: ignore[method-assign]
            with pytest.raises(SessionFailedError, match="stage_failed: internal error"):
                await unlucky.step(PROMPTS[0], 0, last_only=True)
            fine = await client.open_session(GREEDY)
            assert await answer(fine, PROMPTS[1]) == await reference(ring, PROMPTS[1])
            await close_all(ring, (unlucky, fine))
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_stages_keeping_their_own_kv_state_never_hold_steps_back_to_pack_them() -> None:
    """A stage whose sessions keep their own KV state (``kv = state``, the default) would compute a pack one step
    after another, holding the first step's frame back: it computes and sends on each step as it comes."""

    async def main() -> None:
        ring = await ToyRing.start(max_sessions=8, pack_budget=BUDGET)
        first = ring.servers[0]
        first.stages[0].kv = "state"  # type: ignore[attr-defined]
        head = ring.client("10.9.0.100")
        await head.connect()
        try:
            expected = [await reference(ring, p) for p in PROMPTS]
            sessions = [await head.open_session(GREEDY) for _ in PROMPTS]
            async with held(first):
                answers = [asyncio.ensure_future(answer(s, p)) for s, p in zip(sessions, PROMPTS, strict=True)]
                await queued(first, len(answers))
            assert list(await asyncio.gather(*answers)) == expected
            assert first.packs == first.packed_steps, "a stage keeping its own KV state computed steps together"
            assert extra_chunks(first) == 0, "a stage keeping its own KV state cut a prompt into chunks"
        finally:
            await head.close()
            await ring.stop()

    run(main)
