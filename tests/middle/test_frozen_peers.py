"""Heartbeats (``agent.transport.heartbeat``): a frozen agent is noticed within the link timeout, a busy one
never is, a late answer is logged, and a chat whose stage froze replays and ends with its uninterrupted
tokens, saying which link went silent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from agent.chat_client.protocol import ChatRequest
from agent.errors import PeerUnavailableError
from agent.transport.heartbeat import Liveness
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, run
from tests.support.toy_model import ToyTokenizer

FAST = Liveness(interval=0.05, timeout=0.4, late=0.15)
PROMPT = [1, 3, 9, 14, 22, 9, 14, 31, 2, 4]


def test_a_frozen_middle_stage_fails_the_session_within_the_link_timeout_and_frees_it_downstream() -> None:
    async def main() -> None:
        ring = await ToyRing.start(liveness=FAST)
        client = ring.client()
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            await session.step(PROMPT, 0, last_only=True)
            loop = asyncio.get_running_loop()
            ring.host(1).freeze()
            frozen_at = loop.time()
            with pytest.raises(PeerUnavailableError, match=r"sent nothing for .* not even an answer to heartbeats"):
                for _ in range(100):
                    await session.step([9], 0, last_only=True)
            noticed = loop.time() - frozen_at
            assert noticed < FAST.timeout + 4 * FAST.interval + 0.3, f"noticed after {noticed:.2f} s"
            await ring.until(lambda: ring.held()[0] == 0 and ring.held()[2] == 0)
            ring.host(1).thaw()
            again = await client.open_session(GREEDY)
            assert await answer(again, PROMPT, 6) == await reference(ring, PROMPT, 6)
            await again.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_long_prefill_is_not_taken_for_a_freeze() -> None:
    async def main() -> None:
        ring = await ToyRing.start(liveness=FAST)
        for stage in ring.stages:
            stage.prefill_seconds = 3 * FAST.timeout  # each stage's prompt step outlasts the link timeout
        client = ring.client()
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            assert await answer(session, PROMPT, 4) == await reference(ring, PROMPT, 4)
            await session.close()
            assert client.failure is None
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_heartbeat_answered_late_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        patient = Liveness(interval=0.05, timeout=1.5, late=0.15)
        ring = await ToyRing.start(liveness=patient)
        client = ring.client()
        await client.connect()
        try:
            ring.host(0).freeze()
            await asyncio.sleep(0.5)  # well over late, well under the timeout
            ring.host(0).thaw()
            await asyncio.sleep(3 * FAST.interval)
            assert client.failure is None
        finally:
            await client.close()
            await ring.stop()

    with caplog.at_level(logging.WARNING, logger="agent.transport.heartbeat"):
        run(main)
    assert any("answered a heartbeat late" in r.getMessage() for r in caplog.records), caplog.text


def test_a_chat_whose_stage_froze_replays_and_ends_with_its_uninterrupted_tokens(tmp_path: Path) -> None:
    async def main() -> None:
        ring = await ToyRing.start(liveness=FAST)
        daemon = await ring.chat_agent(tmp_path)
        try:
            assert daemon.chats is not None
            messages = (("user", "where is the toy"),)
            request = ChatRequest(token=daemon.chats.token, messages=messages, max_tokens=40)
            expected = await reference(ring, ToyTokenizer().encode_chat(request.chat_messages()), 40)
            events = []
            async for event in daemon.chats.answer(request):
                events.append(event)
                if len(events) == 8:
                    ring.host(1).freeze()
                    asyncio.get_running_loop().call_later(3 * FAST.timeout, ring.host(1).thaw)
            assert events[-1].event == "done", events[-1]
            assert [e.id for e in events if e.event == "token"] == expected
            stats = events[-1].stats
            assert stats is not None and stats["replays"] >= 1, stats
            assert any("10.9.0.2:7000" in cause for cause in stats["interruptions"]), stats
        finally:
            await daemon.stop()
            await ring.stop()

    run(main)
