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

from agent.chat.protocol import ChatEvent, ChatRequest
from agent.daemon import Daemon
from tests.middle.toy_ring import ring_and_chat, run

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
