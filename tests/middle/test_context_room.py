"""A prompt near the end of the context (issue 40 §4), on the toy ring (256 positions): without ``max_tokens`` the
answer gets what room is left instead of a refusal; a refusal names the limit as the asker knows it (the API's
``max_tokens``, ``shoal ask``'s ``--max-tokens``) and the most that fits."""

from __future__ import annotations

import io
from pathlib import Path

import openai
import pytest

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.cli.ask_cmd import stream_chat
from agent.errors import ChatAnswerError
from tests.middle.test_openai_api import _api
from tests.middle.toy_ring import reference, run
from tests.support.toy_model import ToyTokenizer

CONTEXT = 256
LONG = "toy " * 50
"""200 bytes, one toy token each: under the chat template a 204-token prompt, which leaves 52 positions."""
ROOM = CONTEXT - len(ToyTokenizer().encode_chat([{"role": "user", "content": LONG}]))


def test_without_max_tokens_the_answer_gets_the_room_the_prompt_leaves(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            assert ring.manifest.context_tokens == CONTEXT and 0 < ROOM < 256  # 256: the default new tokens
            messages = [{"role": "user", "content": LONG}]
            done = await client.chat.completions.create(model="toy/decoder", messages=messages)
            tokenizer = ToyTokenizer()
            expected = await reference(ring, tokenizer.encode_chat(messages), ROOM)
            assert done.choices[0].message.content == tokenizer.decode(expected)
            assert done.usage is not None and done.usage.completion_tokens == len(expected) <= ROOM

    run(main)


def test_the_api_names_its_own_parameter(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, _daemon, client):
            messages = [{"role": "user", "content": LONG}]
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="toy/decoder", messages=messages, max_tokens=ROOM + 1)
            assert refused.value.code == "prompt_too_long" and refused.value.param == "max_tokens"
            assert f"lower max_tokens to {ROOM} or less" in refused.value.message
            assert "--max-tokens" not in refused.value.message
            whole = [{"role": "user", "content": "toy " * 70}]  # no room left at all: only a shorter prompt does
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="toy/decoder", messages=whole)
            assert refused.value.param == "messages" and "shorten the prompt" in refused.value.message
            assert "max_tokens" not in refused.value.message

    run(main)


def test_shoal_ask_names_its_option(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, _daemon, _client):
            endpoint = ChatEndpoint.load(tmp_path / "chat.json")
            request = ChatRequest(token=endpoint.token, messages=(("user", LONG),), max_tokens=ROOM + 1)
            with pytest.raises(ChatAnswerError, match=f"lower --max-tokens to {ROOM} or less"):
                await stream_chat(endpoint, request, io.StringIO())

    run(main)


def test_shoal_status_says_the_context(tmp_path: Path) -> None:
    from agent.cli.plan_cmd import plan_lines
    from agent.cli.status_cmd import status_lines

    async def main() -> None:
        async with _api(tmp_path) as (_ring, daemon, _client):
            assert daemon.chats is not None
            chat = daemon.chats.status()
            assert chat["context_tokens"] == CONTEXT
            lines = status_lines("127.0.0.1:7000", {"node": "pc1", "stages": [], "chat": chat})
            assert any(line.startswith("  chats at ") and line.endswith(", context 256 tokens") for line in lines)

    run(main)
    plan = {"hash": "ab" * 32, "model": "smollm2", "export": "0123abcd", "context_tokens": 8192, "stages": []}
    assert "  model smollm2, export 0123abcd: context 8,192 tokens" in plan_lines(plan)
