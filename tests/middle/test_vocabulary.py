"""Token ids past the model's vocabulary never reach an embedding (issue 40 §3), on a toy ring in memory.

A tokenizer may know more tokens than its model: SmolLM2's adds ``<FILL_ME>`` as 49156 to a 49152-token
model. The head refuses a prompt holding one before anything is sent, naming the token and the vocabulary;
stage 0 refuses such an id from any head with an error frame saying so, and computes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.chat_client.protocol import ChatRequest
from agent.errors import SessionFailedError
from tests.middle.toy_ring import GREEDY, answer, reference, ring_and_chat, ring_and_client, run
from tests.support.toy_model import VOCAB, ToyTokenizer

PROMPT = [1, 3, 9, 14, 22, 9, 14, 31, 2, 4]


class FillTokenizer(ToyTokenizer):
    """The toy tokenizer with one added token past the toy model's vocabulary, as SmolLM2's has."""

    FILL = "<FILL_ME>"

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        ids = super().encode_chat(messages)
        return [*ids[:-1], VOCAB, ids[-1]] if any(self.FILL in m["content"] for m in messages) else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.FILL if i == VOCAB else ToyTokenizer.decode(self, [i]) for i in ids)


def test_stage_0_refuses_an_id_past_the_vocabulary_with_an_error_frame_and_computes_nothing() -> None:
    async def main() -> None:
        async with ring_and_client() as (ring, client):
            session = await client.open_session(GREEDY)
            with pytest.raises(SessionFailedError) as failed:
                await answer(session, [*PROMPT, VOCAB])
            failure = str(failed.value)
            assert failure.startswith("bad_request"), failure
            assert f"token id {VOCAB} is outside the model's vocabulary of {VOCAB} tokens" in failure, failure
            assert [stage.positions_computed for stage in ring.stages] == [0, 0, 0]
            await ring.until(lambda: ring.held() == [0, 0, 0])
            # the stage and the head go on: the next session is answered as the whole model answers
            fresh = await client.open_session(GREEDY)
            assert await answer(fresh, PROMPT) == await reference(ring, PROMPT)
            await fresh.close()

    run(main)


def test_the_head_refuses_a_prompt_with_a_token_past_the_vocabulary_before_sending_anything(tmp_path: Path) -> None:
    """The chat agent computes stage 0 in-process: nothing but the head's check stands between the prompt and
    the embedding there."""

    async def main() -> None:
        async with ring_and_chat(tmp_path, tokenizer=FillTokenizer) as (ring, daemon):
            assert daemon.chats is not None
            asked = ChatRequest(token=daemon.chats.token, messages=(("user", "write <FILL_ME> here"),), max_tokens=8)
            events = [event async for event in daemon.chats.answer(asked)]
            assert [e.event for e in events] == ["error"] and events[0].code == "bad_request", events
            assert f"'<FILL_ME>' (id {VOCAB})" in events[0].text, events[0].text
            assert f"vocabulary is {VOCAB} tokens" in events[0].text, events[0].text
            assert [s.positions_computed for s in [*ring.chat_stages, *ring.stages]] == [0, 0, 0, 0]
            assert daemon.server.status()["local_chats"] == 0
            # the same agent answers a prompt within the vocabulary as the whole model does
            plain = ChatRequest(token=daemon.chats.token, messages=(("user", "write it here"),), max_tokens=8)
            events = [event async for event in daemon.chats.answer(plain)]
            assert events[-1].event == "done", events[-1]
            ids = FillTokenizer().encode_chat([{"role": "user", "content": "write it here"}])
            assert [e.id for e in events if e.event == "token"] == await reference(ring, ids, 8)

    run(main)
