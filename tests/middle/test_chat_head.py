"""The agent that heads its PC's chats (``ChatService`` inside the real ``Daemon``), on a toy ring in memory.

A chat's answer must be the whole model's; the conversation's next turn reuses its kept session up to the
first prompt's last whole chunk and computes the rest as a fresh prompt would; a ring lost mid-answer is
replayed into a fresh session and the answer goes on unchanged; a kept session that a full stage evicted
makes the next turn start afresh, still right; a chat beyond the agent's places is told "fleet busy" while
the others go on; a client that leaves mid-answer frees its session on every stage; a chat whose ring cannot
be reached fails with a clear error, and the agent goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.daemon import Daemon, DaemonAddresses
from agent.head.prefill import prefill_chunks
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, ring_and_chat, run, stage_address
from tests.support.toy_model import ToyTokenizer

QUESTION = "where is the toy"
FOLLOW_UP = "and why there"


def _request(daemon: Daemon, *turns: tuple[str, str], max_tokens: int = 24) -> ChatRequest:
    assert daemon.chats is not None
    return ChatRequest(token=daemon.chats.token, messages=turns, max_tokens=max_tokens)


def _ids(*turns: tuple[str, str]) -> list[int]:
    return ToyTokenizer().encode_chat([{"role": role, "content": content} for role, content in turns])


async def _events(daemon: Daemon, request: ChatRequest) -> list[ChatEvent]:
    assert daemon.chats is not None
    return [event async for event in daemon.chats.answer(request)]


def _tokens(events: list[ChatEvent]) -> list[int]:
    assert events[-1].event == "done", events[-1]
    return [event.id for event in events if event.event == "token" and event.id is not None]


async def _events_losing_stage_1(ring: ToyRing, daemon: Daemon, request: ChatRequest) -> list[ChatEvent]:
    """The answer's events, stage 1's PC vanishing after the 10th and its agent back 0.3 s later."""
    assert daemon.chats is not None
    events: list[ChatEvent] = []
    async for event in daemon.chats.answer(request):
        events.append(event)
        if len(events) == 10:
            await ring.vanish(1)
            asyncio.get_running_loop().call_later(0.3, lambda: asyncio.ensure_future(ring.restart(1)))
    return events


def test_a_chat_is_the_whole_models_answer_and_its_next_turn_reuses_the_first_prompts_chunks(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path, prefill_chunk=4) as (ring, daemon):
            first = (("user", QUESTION),)
            events = await _events(daemon, _request(daemon, *first))
            tokens = _tokens(events)
            assert tokens == await reference(ring, _ids(*first))
            text = "".join(event.text for event in events if event.event == "token")
            computed = ring.stages[1].positions_computed
            second = (*first, ("assistant", text), ("user", FOLLOW_UP))
            events = await _events(daemon, _request(daemon, *second))
            assert _tokens(events) == await reference(ring, _ids(*second))
            stats = events[-1].stats
            # the first prompt's whole chunks are reused; its last partial chunk, the answer and the new message
            # are computed as a fresh prompt computes them
            assert stats is not None and stats["cached_tokens"] == len(_ids(*first)) // 4 * 4, stats
            new_part = ring.stages[1].positions_computed - computed
            assert new_part <= len(_ids(*second)) - stats["cached_tokens"] + len(_tokens(events)) + 1
            assert daemon.chats is not None and daemon.chats.kept.resumed == 1

    run(main)


def test_a_ring_lost_mid_answer_is_replayed_and_the_answer_goes_on_unchanged(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, daemon):
            turns = (("user", QUESTION),)
            expected = await reference(ring, _ids(*turns), 40)
            assert daemon.chats is not None
            events = await _events_losing_stage_1(ring, daemon, _request(daemon, *turns, max_tokens=40))
            assert _tokens(events) == expected
            stats = events[-1].stats
            assert stats is not None and stats["replays"] == 1, stats
            assert daemon.chats.replayed == 1

    run(main)


def test_a_kept_session_evicted_by_a_full_stage_makes_the_next_turn_start_afresh(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, daemon):
            await ring.vanish(2)
            await ring.restart(2, max_sessions=1)
            first = (("user", QUESTION),)
            events = await _events(daemon, _request(daemon, *first))
            text = "".join(event.text for event in events if event.event == "token")
            # another head's new session takes the kept (parked) session's place on the full last stage
            other = ring.client()
            await other.connect()
            session = await other.open_session(GREEDY)
            assert await answer(session, _ids(("user", "x")), 4) == await reference(ring, _ids(("user", "x")), 4)
            assert ring.servers[2].table.evicted == 1
            await session.close()
            await other.close()
            second = (*first, ("assistant", text), ("user", FOLLOW_UP))
            events = await _events(daemon, _request(daemon, *second))
            assert _tokens(events) == await reference(ring, _ids(*second))
            stats = events[-1].stats
            assert stats is not None and stats["cached_tokens"] == 0, stats

    run(main)


def test_a_chat_beyond_the_agents_places_is_told_fleet_busy_and_the_others_go_on(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path, max_sessions=1, chat_keep=0.0) as (ring, daemon):
            assert daemon.chats is not None
            turns = (("user", QUESTION),)
            running = daemon.chats.answer(_request(daemon, *turns, max_tokens=30))
            first = await anext(running)
            assert first.event == "token"
            refused = await _events(daemon, _request(daemon, ("user", "me too")))
            assert [e.event for e in refused] == ["error"] and refused[0].code == "fleet_busy", refused
            rest = [event async for event in running]
            assert _tokens([first, *rest]) == await reference(ring, _ids(*turns), 30)
            await ring.until(lambda: ring.held() == [0, 0, 0] and daemon.server.table.local == 0)

    run(main)


def test_a_client_that_leaves_mid_answer_frees_its_session_on_every_stage(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, daemon):
            assert daemon.chats is not None
            answer_events = daemon.chats.answer(_request(daemon, ("user", QUESTION), max_tokens=60))
            for _ in range(3):
                await anext(answer_events)
            assert ring.held()[1:] == [1, 1]
            await answer_events.aclose()
            await ring.until(lambda: ring.held() == [0, 0, 0] and daemon.server.table.local == 0)
            assert len(daemon.chats.kept) == 0, "a half-finished answer's session must not be kept"

    run(main)


def test_the_chat_drafts_with_ngrams_and_stays_exact(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, daemon):
            turns = (("user", "abab abab abab abab abab abab"),)
            events = await _events(daemon, _request(daemon, *turns, max_tokens=40))
            assert _tokens(events) == await reference(ring, _ids(*turns), 40)
            stats = events[-1].stats
            assert stats is not None and stats["drafted"] > 0, stats

    run(main)


def test_a_head_holding_no_stage_answers_as_the_stage_0_head_does(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, with_stage):
            bare = await ring.chat_agent(
                tmp_path / "bare", host="10.9.0.60", stages=(), next=None, ring_first=stage_address(0)
            )
            try:
                turns = (("user", QUESTION),)
                from_stage_0 = _tokens(await _events(with_stage, _request(with_stage, *turns)))
                from_bare = _tokens(await _events(bare, _request(bare, *turns)))
                assert from_bare == from_stage_0 == await reference(ring, _ids(*turns))
                assert bare.server.status()["stages"] == [] and bare.server.status()["device"] is None
                assert "stages=none" in bare.ready_line(DaemonAddresses(bare.server.address))
            finally:
                await bare.stop()

    run(main)


def test_a_chat_whose_ring_cannot_be_reached_fails_with_a_clear_error_and_the_agent_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 0's successor never comes up: once the chat has waited for the ring (15 s in the product, half a
    second here), it ends in ``ring_unavailable`` naming the address; the agent frees the chat's place and
    answers the next chat alike."""
    from agent.chat import service

    monkeypatch.setattr(service, "RING_TIMEOUT", 0.5)
    nobody = ("10.9.0.99", 7000)

    async def main() -> None:
        ring = await ToyRing.start()
        daemon = await ring.chat_agent(tmp_path, next=nobody)
        try:
            for _ in range(2):
                events = await _events(daemon, _request(daemon, ("user", QUESTION)))
                assert [e.event for e in events] == ["error"] and events[0].code == "ring_unavailable", events
                assert f"{nobody[0]}:{nobody[1]}" in events[0].text
                assert daemon.server.status()["local_chats"] == 0  # its place is free again
        finally:
            await daemon.stop()
            await ring.stop()

    run(main)


def test_a_chunked_prompt_its_next_turn_and_its_replay_give_the_whole_models_answers(tmp_path: Path) -> None:
    """Prompts cut into chunks of 3 positions (pipelined prefill) on the first turn, the kept next turn and
    the replay of a ring lost mid-answer: the answers stay the whole model's."""

    async def main() -> None:
        async with ring_and_chat(tmp_path, prefill_chunk=3) as (ring, daemon):
            first = (("user", QUESTION),)
            events = await _events(daemon, _request(daemon, *first))
            assert _tokens(events) == await reference(ring, _ids(*first))
            assert ring.stages[1].steps[0] <= 3, ring.stages[1].steps
            # before the first token, one progress event per chunk but the last, in order, then none
            kinds = [event.event for event in events]
            reports = [(event.stats["done"], event.stats["total"]) for event in events if event.event == "progress"]
            positions = len(_ids(*first))
            sizes = prefill_chunks(0, positions, 3)
            assert reports == [(sum(sizes[: i + 1]), positions) for i in range(len(sizes) - 1)], reports
            assert kinds[: len(reports)] == ["progress"] * len(reports) and "progress" not in kinds[len(reports) :]
            assert daemon.chats is not None and daemon.chats.status()["prompts_in"] == []
            text = "".join(event.text for event in events if event.event == "token")
            second = (*first, ("assistant", text), ("user", FOLLOW_UP))
            expected = await reference(ring, _ids(*second), 40)
            events = await _events_losing_stage_1(ring, daemon, _request(daemon, *second, max_tokens=40))
            assert _tokens(events) == expected
            assert events[-1].stats["replays"] == 1, events[-1].stats

    run(main)


def test_a_new_chat_in_a_planned_fleet_waits_while_the_plan_moves_its_first_stage(tmp_path: Path) -> None:
    """In a fleet that follows a plan, one attempt to join the plan's ring lasts 2 s. A chat that starts while the
    plan still names a first stage that is gone (its standby takes over 0.8 s later) joins the new ring and answers,
    rather than failing with ``ring_unavailable``: it looks the plan up again after the attempt fails."""
    from agent.chat.service import ChatService
    from agent.node.server import StageServer

    async def main() -> None:
        ring = await ToyRing.start()
        loop = asyncio.get_running_loop()
        moved_at = loop.time() + 0.8

        def route() -> tuple[tuple[str, int], tuple[str, int]]:
            first = ("10.9.0.99", 7000) if loop.time() < moved_at else ring.servers[0].address
            return first, ring.servers[-1].address

        config = ring.config(
            0,
            stages=(),
            next=None,
            listen=("10.9.0.60", 7000),
            chat=("127.0.0.1", 0),
            chat_file=tmp_path / "chat.json",
            ring_first=ring.servers[0].address,  # unused: the route says where the ring is
            ring_last=ring.servers[-1].address,
        )
        host = ring.network.host("10.9.0.60")
        server = StageServer(config, None, [], "planned-head", host)
        chats = ChatService(config, server, host, load_tokenizer=ToyTokenizer, route=route)
        await chats.use_export(tmp_path, ring.manifest)
        await chats.start()
        try:
            question = "where is the toy"
            ids = ToyTokenizer().encode_chat([{"role": "user", "content": question}])
            request = ChatRequest(token=chats.token, messages=(("user", question),), max_tokens=8)
            events = [event async for event in chats.answer(request)]
            assert events[-1].event == "done", events[-1]
            assert [e.id for e in events if e.event == "token"] == await reference(ring, ids, 8)
        finally:
            await chats.stop()
            await server.stop()
            await ring.stop()

    run(main)
