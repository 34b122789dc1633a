"""The OpenAI-style API as the real ``openai`` client uses it (issue 22 §2), on the toy ring in memory:
stop sequences cut as OpenAI cuts them, ``finish_reason``, an unknown model, the message forms clients send,
``/v1/completions``, ``stream_options.include_usage`` and a kept-alive connection's second request."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from agent.daemon import Daemon
from tests.middle.toy_ring import ToyRing, reference, run
from tests.support.toy_model import ToyTokenizer

QUESTION = "where is the toy"
MAX_TOKENS = 30


@contextlib.asynccontextmanager
async def _api(tmp_path: Path) -> AsyncIterator[tuple[ToyRing, Daemon, openai.AsyncOpenAI]]:
    ring = await ToyRing.start()
    daemon = await ring.chat_agent(tmp_path, http=("127.0.0.1", 0))
    assert daemon.addresses is not None and daemon.addresses.http is not None and daemon.chats is not None
    host, port = daemon.addresses.http
    client = openai.AsyncOpenAI(base_url=f"http://{host}:{port}/v1", api_key=daemon.chats.token, max_retries=0)
    try:
        yield ring, daemon, client
    finally:
        await client.close()
        await daemon.stop()
        await ring.stop()


async def _expected_text(ring: ToyRing, messages: list[dict[str, str]], max_tokens: int = MAX_TOKENS) -> str:
    tokenizer = ToyTokenizer()
    return tokenizer.decode(await reference(ring, tokenizer.encode_chat(messages), max_tokens))


def test_a_stop_sequence_ends_the_answer_before_it_whole_and_streamed(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            messages = [{"role": "user", "content": QUESTION}]
            full = await _expected_text(ring, messages)
            assert len(full) > 12
            stop = full[7:9]  # two characters, of two tokens: the stop spans tokens
            cut = full[: full.find(stop)]
            whole = await client.chat.completions.create(
                model="toy/decoder", messages=messages, max_tokens=MAX_TOKENS, stop=[stop, "never-there"]
            )
            assert whole.choices[0].message.content == cut
            assert whole.choices[0].finish_reason == "stop"
            stream = await client.chat.completions.create(
                model="toy/decoder", messages=messages, max_tokens=MAX_TOKENS, stop=stop, stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
            assert chunks[-1].choices[0].finish_reason == "stop"
            plain = await client.chat.completions.create(model="toy/decoder", messages=messages, max_tokens=MAX_TOKENS)
            assert plain.choices[0].message.content == full
            assert plain.choices[0].finish_reason == "length"

    run(main)


def test_an_unknown_model_is_404_and_the_served_one_is_listed(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_, _daemon, client):
            assert [m.id for m in (await client.models.list()).data] == ["toy/decoder"]
            with pytest.raises(openai.NotFoundError) as refused:
                await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
            assert refused.value.code == "model_not_found"

    run(main)


def test_the_message_forms_clients_send_are_accepted_and_what_shoal_cannot_honour_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            expected = await _expected_text(
                ring, [{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}]
            )
            answer = await client.chat.completions.create(
                model="toy/decoder",
                max_tokens=MAX_TOKENS,
                user="someone",
                messages=[
                    {"role": "developer", "content": "be brief"},
                    {
                        "role": "user",
                        "name": "ann",
                        "content": [{"type": "text", "text": "where is "}, {"type": "text", "text": "the toy"}],
                    },
                ],
            )
            assert answer.choices[0].message.content == expected
            picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
            with pytest.raises(openai.BadRequestError, match="content parts of type 'image_url' are not supported"):
                await client.chat.completions.create(
                    model="toy/decoder", messages=[{"role": "user", "content": [picture]}]
                )
            with pytest.raises(openai.BadRequestError, match="n=2 is not supported") as refused:
                await client.chat.completions.create(
                    model="toy/decoder", messages=[{"role": "user", "content": "hi"}], n=2
                )
            assert refused.value.param == "n"

    run(main)


def test_errors_name_the_field_at_fault_and_a_tools_refusal_does_not_repeat_the_tools(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_ring, _daemon, client):
            tool = {
                "type": "function",
                "function": {"name": "weather", "description": "x" * 500, "parameters": {"type": "object"}},
            }
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model="toy/decoder", messages=[{"role": "user", "content": "hi"}], tools=[tool, tool]
                )
            assert refused.value.param == "tools" and refused.value.code == "bad_request"
            assert "'tools' (a list of 2) is not supported" in refused.value.message
            assert "weather" not in refused.value.message and len(refused.value.message) < 200
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model="toy/decoder", messages=[{"role": "user", "content": "hi"}], max_tokens=0
                )
            assert refused.value.param == "max_tokens"
            with pytest.raises(openai.NotFoundError) as missing:
                await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
            assert missing.value.param == "model"
            assert isinstance(missing.value.body, dict) and "param" in missing.value.body

    run(main)


def test_completions_continue_the_raw_prompt(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (ring, _daemon, client):
            tokenizer = ToyTokenizer()
            prompt = "once upon a time"
            expected = tokenizer.decode(await reference(ring, tokenizer.encode(prompt, True), 12))
            done = await client.completions.create(model="toy/decoder", prompt=prompt, max_tokens=12)
            assert done.object == "text_completion"
            assert done.choices[0].text == expected and done.choices[0].finish_reason == "length"
            assert done.usage is not None and done.usage.prompt_tokens == len(tokenizer.encode(prompt, True))

    run(main)


def test_usage_comes_last_in_a_stream_and_a_kept_alive_connection_serves_the_next_request(tmp_path: Path) -> None:
    async def main() -> None:
        async with _api(tmp_path) as (_, daemon, client):
            messages = [{"role": "user", "content": QUESTION}]
            stream = await client.chat.completions.create(
                model="toy/decoder",
                messages=messages,
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 8
            # the README: exact rides on a stream's last chunk (and on the finish chunk before it)
            assert chunks[-1].model_extra is not None and chunks[-1].model_extra["exact"] is True
            assert chunks[-2].choices[0].finish_reason == "length"
            assert chunks[-2].model_extra is not None and chunks[-2].model_extra["exact"] is True
            again = await client.chat.completions.create(model="toy/decoder", messages=messages, max_tokens=8)
            assert again.usage is not None and again.usage.completion_tokens == 8
            assert daemon.http is not None
            assert (daemon.http.requests, daemon.http.connections) == (2, 1)

    run(main)
