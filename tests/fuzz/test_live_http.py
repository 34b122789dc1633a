"""The OpenAI-style HTTP API under a hypothesis state machine (smaller than the ring's: ``test_live_agent.py``).

A real ``OpenAIEndpoint`` on loopback in front of a scripted answerer, driven by sync rules on one persistent event
loop. A pooled client keeps one connection alive across every rule and asks a proper question now and then; other
connections send malformed HTTP, headers that never end (slowloris), bodies over the cap, bodies that are not JSON
or not UTF-8. Invariants: the pooled client's answers are right and its connection lives; every other connection
gets its 4xx (or is closed, for headers that never end) and is gone; nothing is left running on the endpoint.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Iterator
from typing import TypeVar

import h11
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from agent.chat import openai_http
from agent.chat.openai_http import OpenAIEndpoint
from agent.chat_client.protocol import MAX_LINE_BYTES, ChatEvent, ChatRequest

TOKEN = "secret"
SLOW = 0.3
"""The endpoint's read timeout here: a request that has begun must arrive whole within it."""
WAIT = 5.0
T = TypeVar("T")

pytestmark = pytest.mark.timeout(120)


class Echo:
    """Answers with the last message's words, reversed, one token each."""

    node = "http-fuzz"
    token = TOKEN
    model_id = "echo"

    async def answer(self, request: ChatRequest) -> AsyncGenerator[ChatEvent, None]:
        words = request.messages[-1][1].split()[::-1]
        for n, word in enumerate(words):
            yield ChatEvent("token", id=n, text=word + " ")
        stats = {"finish_reason": "stop", "prompt_tokens": 1, "tokens": len(words), "cached_tokens": 0}
        yield ChatEvent("done", stats=stats)


def request_bytes(body: bytes, *, path: str = "/v1/chat/completions", close: bool = False) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n"
    return (head + ("Connection: close\r\n" if close else "") + "\r\n").encode() + body


class Client:
    """One HTTP/1.1 connection, with h11 reading the responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)
        # the requests are written by hand: tell h11 one was sent, so that it reads the response
        self.h11.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        self.h11.send(h11.EndOfMessage())

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def response(self) -> tuple[int, bytes]:
        """The next response's status and body; (0, b"") if the connection ended first."""
        status, body = 0, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(65536)
                except ConnectionError:
                    data = b""
                if not data and status == 0:
                    return 0, b""
                self.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, body

    def next_cycle(self) -> None:
        self.h11.start_next_cycle()
        self.h11.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        self.h11.send(h11.EndOfMessage())

    async def ended(self) -> bool:
        """Whether the server closed the connection (after anything it still sends)."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        await asyncio.gather(self.writer.wait_closed(), return_exceptions=True)


class Api:
    def __init__(self, loop: asyncio.AbstractEventLoop, endpoint: OpenAIEndpoint, port: int, pooled: Client) -> None:
        self.loop, self.endpoint, self.port, self.pooled = loop, endpoint, port, pooled
        self.steps = 0
        self.refused: dict[int, int] = {}

    def run(self, coro: Awaitable[T], timeout: float = WAIT) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await coro

        return self.loop.run_until_complete(bounded())


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setattr(openai_http, "READ_TIMEOUT", SLOW)
    loop = asyncio.new_event_loop()
    endpoint = OpenAIEndpoint(Echo(), ("127.0.0.1", 0))
    _, port = loop.run_until_complete(endpoint.start())
    pooled = loop.run_until_complete(Client.open(port))
    try:
        yield Api(loop, endpoint, port, pooled)
    finally:
        loop.run_until_complete(pooled.close())
        loop.run_until_complete(endpoint.stop())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


WORDS = st.lists(st.sampled_from(["one", "two", "three", "éa", "漢字"]), min_size=1, max_size=6)


def machine(api: Api) -> type[RuleBasedStateMachine]:
    class LiveApi(RuleBasedStateMachine):
        async def _refused(self, raw: bytes, status: int | None) -> None:
            """Send ``raw`` on a connection of its own: it gets ``status`` (None: none, it is only closed), then
            the connection ends."""
            client = await Client.open(api.port)
            try:
                client.writer.write(raw)
                await client.writer.drain()
                got, body = await client.response()
                if status is not None:
                    assert got == status, f"{got} {body[:200]!r} instead of {status}"
                    assert json.loads(body)["error"]["code"]
                assert await client.ended()
                api.refused[got] = api.refused.get(got, 0) + 1
            finally:
                await client.close()

        @rule(words=WORDS, stream=st.booleans())
        def pooled_question(self, words: list[str], stream: bool) -> None:
            """The kept-alive connection asks; the answer is the words reversed."""
            api.steps += 1
            body = json.dumps({"messages": [{"role": "user", "content": " ".join(words)}], "stream": stream})
            api.pooled.writer.write(request_bytes(body.encode()))
            status, raw = api.run(api.pooled.response())
            api.pooled.next_cycle()
            assert status == 200
            if stream:
                chunks = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line[6:] not in ("", "[DONE]")]
                text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            else:
                text = json.loads(raw)["choices"][0]["message"]["content"]
            assert text == "".join(w + " " for w in words[::-1])

        @rule(garbage=st.binary(min_size=1, max_size=300))
        def malformed_http(self, garbage: bytes) -> None:
            api.steps += 1
            line = b"\x01" + garbage.replace(b"\r\n\r\n", b"") + b"\r\n\r\n"  # no method begins with \x01
            api.run(self._refused(line, 400))

        @rule(cut=st.integers(1, 60))
        def headers_that_never_end(self, cut: int) -> None:
            """Slowloris: a request begun and never finished is dropped after the read timeout, while the pooled
            client is served meanwhile."""
            api.steps += 1
            raw = request_bytes(b"{}")[:cut]

            async def slow() -> None:
                client = await Client.open(api.port)
                try:
                    client.writer.write(raw)
                    await client.writer.drain()
                    async with asyncio.timeout(SLOW * 10):
                        got, _ = await client.response()
                        assert got in (0, 400)
                        assert await client.ended()
                finally:
                    await client.close()

            api.run(slow())

        @rule(extra=st.integers(1, 4096))
        def body_over_the_cap(self, extra: int) -> None:
            api.steps += 1
            api.run(self._refused(request_bytes(b"x" * (MAX_LINE_BYTES + extra)), 413))

        @rule(text=st.binary(max_size=200))
        def body_not_json(self, text: bytes) -> None:
            api.steps += 1
            api.run(self._refused(request_bytes(b"\xff" + text, close=True), 400))  # \xff: not UTF-8, nor JSON

        @rule(content=st.text(max_size=40))
        def body_not_utf8(self, content: str) -> None:
            api.steps += 1
            body = json.dumps({"messages": [{"role": "user", "content": content}]}, ensure_ascii=False).encode()
            api.run(self._refused(request_bytes(body.replace(b'"user"', b'"us\xc3\x28r"'), close=True), 400))

        @invariant()
        def only_the_pooled_connection_is_open(self) -> None:
            async def settled() -> None:
                while len(api.endpoint._tasks) > 1:  # the pooled client's handler only
                    await asyncio.sleep(0.002)

            api.run(settled())
            assert not api.pooled.writer.is_closing()

    return LiveApi


def test_the_http_api_under_a_state_machine_of_good_and_hostile_clients(api: Api) -> None:
    options = settings(max_examples=8, stateful_step_count=15, deadline=None, database=None)
    options = settings(options, suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(machine(api), settings=options)
    print(f"\nHTTP API: {api.steps} rule steps, refusals by status {dict(sorted(api.refused.items()))}")
    assert {400, 413} <= set(api.refused), "a malformed request or a body over the cap was never sent"
