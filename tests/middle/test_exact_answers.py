"""Whether an answer was exact (issue 22 §6), told in its ``done`` event, in the API's body and chunks, and
counted in the agent's status, on the toy ring in memory.

An answer is exact when no stage computed a step unlike another grouping of its positions would
(``agent.runtime.repeatable``): a stage that is not exact marks the steps that verify drafts, every stage
after it passes the mark on, and the last returns it to the head. The toy stages compute the same in any
grouping; a test makes one of them claim otherwise, as a multi-thread int4 stage does.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.daemon import Daemon
from tests.middle.toy_ring import ring_and_chat, run
from tests.support.toy_model import FIRST_TEXT_ID, ToyTokenizer

QUESTION = "where is the toy"


async def _done(daemon: Daemon) -> ChatEvent:
    assert daemon.chats is not None
    request = ChatRequest(token=daemon.chats.token, messages=(("user", QUESTION),), max_tokens=24)
    events = [event async for event in daemon.chats.answer(request)]
    assert events[-1].event == "done", events[-1]
    return events[-1]


def test_an_answer_is_exact_on_exact_stages_and_not_once_a_stage_that_rounds_by_grouping_verifies_drafts(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path) as (ring, daemon):
            assert daemon.chats is not None
            done = await _done(daemon)
            assert done.stats["drafted"] > 0 and done.stats["exact"] is True, done.stats
            assert daemon.chats.status()["inexact"] == 0

            ring.stages[1].exact_speculation = False  # a middle stage that is not exact: the mark travels on
            done = await _done(daemon)
            assert done.stats["drafted"] > 0 and done.stats["exact"] is False, done.stats
            assert daemon.chats.status()["inexact"] == 1
            assert ring.servers[1].status()["exact_speculation"] is False

            ring.stages[1].exact_speculation = True
            ring.chat_stages[0].exact_speculation = None  # the head's own stage, on a device never measured
            done = await _done(daemon)
            assert done.stats["exact"] is False, done.stats
            assert daemon.chats.status()["inexact"] == 2

    run(main)


def test_without_drafts_an_answer_is_exact_even_on_a_stage_that_rounds_by_grouping(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path, drafter="none") as (ring, daemon):
            ring.stages[2].exact_speculation = False
            done = await _done(daemon)
            # a prompt step and one-position steps are computed the same every time
            assert done.stats["drafted"] == 0 and done.stats["exact"] is True, done.stats

    run(main)


def test_the_api_tells_whether_an_answer_was_exact_whole_and_streamed(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring_and_chat(tmp_path, http=("127.0.0.1", 0)) as (ring, daemon):
            assert daemon.addresses is not None and daemon.addresses.http is not None and daemon.chats is not None
            host, port = daemon.addresses.http
            client = openai.AsyncOpenAI(base_url=f"http://{host}:{port}/v1", api_key=daemon.chats.token)
            messages = [{"role": "user", "content": QUESTION}]
            try:
                whole = await client.chat.completions.create(model="toy/decoder", messages=messages, max_tokens=20)
                assert (whole.model_extra or {}).get("exact") is True, whole
                ring.stages[0].exact_speculation = False
                ring.chat_stages[0].exact_speculation = False
                stream = await client.chat.completions.create(
                    model="toy/decoder", messages=messages, max_tokens=20, stream=True
                )
                chunks = [chunk async for chunk in stream]
                last = chunks[-1]
                assert last.choices[0].finish_reason is not None
                assert (last.model_extra or {}).get("exact") is False, last
            finally:
                await client.close()

    run(main)


def test_the_same_question_fresh_on_a_kept_session_and_after_its_eviction_gets_the_same_tokens(
    tmp_path: Path,
) -> None:
    """Issue 40 §1: stages that round a prompt by how its positions are grouped into steps (as one-thread int4
    stages do) gave a kept session, which computed only the prompt's last position, other tokens than a fresh
    session, all marked exact. A kept session is now reused only up to a chunk boundary, and the rest is
    computed in the chunks a fresh prompt is: the same tokens, greedy and seeded, whenever exact."""

    async def main() -> None:
        async with ring_and_chat(tmp_path, prefill_chunk=4) as (ring, daemon):
            chats = daemon.chats
            assert chats is not None
            for stage in (*ring.stages, *ring.chat_stages):
                stage.rounds_prompts_by_step = True

            async def ask(messages: tuple[tuple[str, str], ...], **sampling: object) -> tuple[list[int], ChatEvent]:
                request = ChatRequest(token=chats.token, messages=messages, max_tokens=24, **sampling)  # type: ignore[arg-type]
                events = [event async for event in chats.answer(request)]
                assert events[-1].event == "done", events[-1]
                return [e.id for e in events if e.event == "token" and e.id is not None], events[-1]

            first = (("user", QUESTION),)
            for sampling in ({}, {"temperature": 0.9, "seed": 7}):
                fresh, fresh_done = await ask(first, **sampling)
                resumed = chats.kept.resumed
                kept, kept_done = await ask(first, **sampling)
                assert chats.kept.resumed == resumed + 1  # the kept session was taken over
                evicted = chats.kept.evict_oldest()
                assert evicted is not None
                await evicted
                again, again_done = await ask(first, **sampling)
                assert chats.kept.resumed == resumed + 1  # nothing kept: a fresh session
                for done in (fresh_done, kept_done, again_done):
                    assert done.stats is not None and done.stats["exact"] is True, done.stats
                assert kept == fresh and again == fresh, (sampling, fresh, kept, again)

            # a conversation's next turn: on the first turn's kept session, then again afresh
            text = ToyTokenizer().decode(fresh)
            second = (*first, ("assistant", text), ("user", "and then"))
            on_kept, on_kept_done = await ask(second, temperature=0.9, seed=7)
            assert on_kept_done.stats is not None and on_kept_done.stats["cached_tokens"] >= 4, on_kept_done.stats
            evicted = chats.kept.evict_oldest()
            assert evicted is not None
            await evicted
            afresh, afresh_done = await ask(second, temperature=0.9, seed=7)
            assert afresh_done.stats is not None and afresh_done.stats["cached_tokens"] == 0
            assert on_kept == afresh

    run(main)


@pytest.mark.parametrize("alike", ["all", "prompts", "none"])
def test_a_conversations_turns_fresh_on_a_kept_session_and_after_its_eviction_get_the_same_tokens(
    tmp_path: Path, alike: str
) -> None:
    """Issue 40 §1, its follow-up: a kept session is reused as far as the stages compute alike however positions
    are grouped into steps (``agent.runtime.repeatable``): all it holds where they compute everything alike (f32),
    the earlier prompts where they compute prompts alike (one thread below f32: decoding is shifted otherwise),
    the earlier prompts' whole chunks elsewhere. Turns 2 and 3 of a conversation, greedy and seeded, are the same
    fresh, on the kept session and after its eviction, whichever the stages."""

    async def main() -> None:
        async with ring_and_chat(tmp_path, prefill_chunk=4) as (ring, daemon):
            chats = daemon.chats
            assert chats is not None
            for stage in (*ring.stages, *ring.chat_stages):
                stage.rounds_prompts_by_step = alike == "none"
                stage.rounds_decoding = alike == "prompts"
                assert stage.alike == alike

            async def ask(messages: tuple[tuple[str, str], ...], **sampling: object) -> tuple[list[int], ChatEvent]:
                request = ChatRequest(token=chats.token, messages=messages, max_tokens=16, **sampling)  # type: ignore[arg-type]
                events = [event async for event in chats.answer(request)]
                assert events[-1].event == "done", events[-1]
                assert events[-1].stats is not None and events[-1].stats["exact"] is True, events[-1].stats
                return [e.id for e in events if e.event == "token" and e.id is not None], events[-1]

            async def evict() -> None:
                evicted = chats.kept.evict_oldest()
                assert evicted is not None
                await evicted

            tokenizer = ToyTokenizer()
            for sampling in ({}, {"temperature": 0.9, "seed": 7}):
                conversation: tuple[tuple[str, str], ...] = (("user", QUESTION),)
                answer, _ = await ask(conversation, **sampling)
                earlier_prompt = len(tokenizer.encode_chat([{"role": r, "content": c} for r, c in conversation]))
                for follow_up in ("and then", "where next"):
                    conversation = (*conversation, ("assistant", _spelled(answer)), ("user", follow_up))
                    on_kept, kept_done = await ask(conversation, **sampling)
                    await evict()
                    afresh, afresh_done = await ask(conversation, **sampling)
                    assert on_kept == afresh, (alike, sampling, on_kept, afresh)
                    assert afresh_done.stats is not None and afresh_done.stats["cached_tokens"] == 0
                    cached = kept_done.stats["cached_tokens"] if kept_done.stats is not None else None
                    prompt = len(tokenizer.encode_chat([{"role": r, "content": c} for r, c in conversation]))
                    if alike == "all":  # the answer too, up to its first special token, or its last, never fed
                        spelled = earlier_prompt + _leading_text(answer)
                        assert cached in (spelled, spelled - 1), (cached, spelled)
                    elif alike == "prompts":  # the earlier prompt, less one where its rest would start alone
                        assert cached in (earlier_prompt, earlier_prompt - 1), (cached, earlier_prompt)
                    else:
                        assert cached == earlier_prompt // 4 * 4, (cached, earlier_prompt)
                    assert cached < prompt
                    answer, earlier_prompt = afresh, prompt
                await evict()

    run(main)


def _leading_text(ids: list[int]) -> int:
    """How many of ``ids`` come before the first one that is not text."""
    return next((i for i, token in enumerate(ids) if token < FIRST_TEXT_ID), len(ids))


def _spelled(ids: list[int]) -> str:
    """The text the toy tokenizer encodes as ``ids``' leading text ids (as a chat client sends an answer back)."""
    return "".join(chr(token - FIRST_TEXT_ID) for token in ids[: _leading_text(ids)])
