"""The agent of the PC where the user chats heads the conversation (issue 3, ``agent.chat``), over its
JSON-lines chat endpoint and its OpenAI-style HTTP API.

A chat agent serves stage 0 of the fp32 3-stage export beside ``ring3``'s own stage-0 agent: it
computes stage 0 in-process and sends hidden states to ring3's stage 1, and ring3's last stage answers
it directly. Its answers must be exactly the in-process pipeline's greedy answers (with stop tokens, as
a chat ends), alone and with other chats at once; a chat beyond its ``max_sessions`` is refused with
"fleet busy"; bad requests and a wrong token are refused without disturbing anyone; a client that
leaves mid-answer frees the session on every stage. A finished answer's session is kept for
``KEEP_SECONDS``: the conversation's next turn takes it over (reusing the first prompt's whole chunks
of 512 positions, none in these short chats) and gives the pipeline's answer to the whole conversation. A
kept session is parked on the stages: it gives its place up to a new chat here, and a full stage evicts it
for another head's new session or this agent's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.head.chat import ChatTokenizer
from agent.head.decode import decode
from agent.head.prefill import DEFAULT_PREFILL_CHUNK, chunk_floor
from agent.head.targets import LocalTarget
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from agent.sampling.params import SamplingParams
from shards.manifest import Manifest
from tests.conftest import PROMPTS
from tests.integration.ring_lab import AgentProcess, Fleet, free_port, start_agent, status, wait_for

pytestmark = pytest.mark.processes
MAX_TOKENS = 32
CHAT_SESSIONS = 2
LONG_PROMPT = "Write a very long story about a dragon who learns to code."
KEEP_SECONDS = 4
FREEZE_SECONDS = 30.0
"""How long a stage is frozen (``kill -STOP``) mid-answer: issue 22's case, six times the link timeout."""


@pytest.fixture(scope="module")
def chat_agent(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[AgentProcess, ChatEndpoint]]:
    """A second stage-0 agent with a chat endpoint, in front of ring3's stages 1 and 2."""
    endpoint_file = tmp_path_factory.mktemp("chat") / "chat.json"
    last = ring3[2].address
    agent = start_agent(
        exported(3, "fp32"),
        0,
        fleet.identity("chat-node"),
        cache_dir,
        next_address=ring3[1].address,
        extra=[
            "--precision",
            "f32",
            "--max-sessions",
            str(CHAT_SESSIONS),
            "--chat-keep",
            str(KEEP_SECONDS),
            "--chat",
            "127.0.0.1:0",
            "--chat-file",
            str(endpoint_file),
            "--ring-last",
            f"{last[0]}:{last[1]}",
            "--http",
            "127.0.0.1:0",
        ],
    )
    yield agent, ChatEndpoint.load(endpoint_file)
    agent.stop()
    assert not endpoint_file.exists(), "a stopped agent leaves no endpoint file behind"


@pytest.fixture(scope="module")
def reference(exported: Callable[..., Path], cache_dir: Path) -> Callable[..., list[int]]:
    """Greedy answer of the in-process fp32 pipeline, ending at a stop token or after MAX_TOKENS (or the
    number given), to a prompt or to a conversation of (role, content) turns."""
    folder = exported(3, "fp32")
    tokenizer = ChatTokenizer(folder / "tokenizer")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    answers: dict[object, list[int]] = {}

    def answer(prompt: str | tuple[tuple[str, str], ...], max_tokens: int = MAX_TOKENS) -> list[int]:
        turns = (("user", prompt),) if isinstance(prompt, str) else prompt
        if (prompt, max_tokens) not in answers:

            async def run() -> list[int]:
                target = LocalTarget(pipeline.new_session(), SamplingParams())
                ids = tokenizer.encode_chat([{"role": role, "content": content} for role, content in turns])
                try:
                    return [
                        t
                        async for t in decode(
                            target,
                            ids,
                            max_tokens=max_tokens,
                            stop_ids=tokenizer.stop_ids,
                            params=SamplingParams(),
                            context_tokens=2048,
                        )
                    ]
                finally:
                    await target.close()

            answers[prompt, max_tokens] = asyncio.run(run())
        return answers[prompt, max_tokens]

    return answer


def _request(
    endpoint: ChatEndpoint, prompt: str, max_tokens: int = MAX_TOKENS, token: str | None = None
) -> ChatRequest:
    return ChatRequest(
        token=endpoint.token if token is None else token, messages=(("user", prompt),), max_tokens=max_tokens
    )


async def _events(endpoint: ChatEndpoint, request: ChatRequest) -> list[ChatEvent]:
    return [event async for event in ask(endpoint, request)]


def _tokens(events: list[ChatEvent]) -> list[int]:
    assert events[-1].event == "done", events[-1]
    return [e.id for e in events if e.event == "token"]  # type: ignore[misc]


def test_chat_agent_answers_exactly_as_the_pipeline(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[[str], list[int]],
    exported: Callable[..., Path],
    cache_dir: Path,
    fleet: Fleet,
) -> None:
    """Two prompts through the agent's own stage 0 and the ring: the pipeline's tokens, and their text."""
    agent, endpoint = chat_agent
    tokenizer = ChatTokenizer(exported(3, "fp32") / "tokenizer")
    drafted = 0
    prompts = PROMPTS[:2]
    for prompt in prompts:
        events = asyncio.run(_events(endpoint, _request(endpoint, prompt)))
        tokens = _tokens(events)
        assert tokens == reference(prompt), prompt
        assert "".join(e.text for e in events if e.event == "token") == tokenizer.decode(tokens)
        assert events[-1].stats["tokens"] == len(tokens)
        assert events[-1].stats["exact"] is True  # f32 stages: exact whatever was drafted
        drafted += events[-1].stats["drafted"]
    assert drafted > 0, "the chats decode speculatively (n-gram drafter by default)"
    # the command line: `shoal ask` prints the same text
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--cache-dir",
            str(cache_dir),
            "ask",
            PROMPTS[0],
            "--max-tokens",
            str(MAX_TOKENS),
            "--chat-file",
            str(_endpoint_file(agent)),
        ],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == tokenizer.decode(reference(PROMPTS[0])) + "\n"
    report = status(agent.address, fleet.identity("observer"))["chat"]
    assert report["answered"] == len(prompts) + 1  # type: ignore[index]
    assert report["local_steps"] > 0 and report["running"] == 0  # type: ignore[index]
    assert status(agent.address, fleet.identity("observer"))["steps_served"] == 0  # stage 0 ran in the chat, in-process


def _endpoint_file(agent: AgentProcess) -> Path:
    command = agent.process.args
    assert isinstance(command, list)
    return Path(command[command.index("--chat-file") + 1])


def test_concurrent_chats_match_alone_and_the_extra_one_is_busy(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[[str], list[int]],
) -> None:
    """Two chats at once each give their lone answer (the pipeline's); a third while both run gets "fleet busy"
    (and over the OpenAI-style API, status 429)."""
    _, endpoint = chat_agent

    async def together() -> tuple[list[list[ChatEvent]], list[ChatEvent]]:
        streams = [ask(endpoint, _request(endpoint, LONG_PROMPT, 64)), ask(endpoint, _request(endpoint, PROMPTS[2]))]
        firsts = [await anext(stream) for stream in streams]  # both hold their place on the agent now
        extra = await _events(endpoint, _request(endpoint, PROMPTS[1]))
        import httpx

        over_http = await asyncio.to_thread(
            httpx.post,
            f"{endpoint.http}/chat/completions",
            headers={"Authorization": f"Bearer {endpoint.token}"},
            json={"messages": [{"role": "user", "content": PROMPTS[1]}]},
            timeout=60,
        )
        assert over_http.status_code == 429 and over_http.json()["error"]["code"] == "fleet_busy", over_http.text

        async def rest(stream):  # type: ignore[no-untyped-def]
            return [event async for event in stream]

        rests = await asyncio.gather(*(rest(s) for s in streams))
        return [[first, *more] for first, more in zip(firsts, rests, strict=True)], extra

    (long_answer, short_answer), extra = asyncio.run(together())
    assert [e.event for e in extra] == ["error"] and extra[0].code == "fleet_busy", extra
    assert _tokens(short_answer) == reference(PROMPTS[2])
    assert _tokens(long_answer) == reference(LONG_PROMPT, 64)
    assert len(reference(LONG_PROMPT, 64)) == 64, "the long answer must outlast the extra request"


def test_bad_requests_are_refused_and_the_agent_goes_on(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[[str], list[int]],
) -> None:
    _, endpoint = chat_agent

    async def raw(line: bytes) -> list[ChatEvent]:
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(line)
        await writer.drain()
        events = [ChatEvent.from_line(line) async for line in reader]
        writer.close()
        return events

    wrong = asyncio.run(_events(endpoint, _request(endpoint, PROMPTS[0], token="0" * 64)))
    assert [(e.event, e.code) for e in wrong] == [("error", "unauthorized")]
    assert [e.code for e in asyncio.run(raw(b"not json\n"))] == ["bad_request"]
    assert [e.code for e in asyncio.run(raw(b'{"v":2}\n'))] == ["bad_version"]
    good = _request(endpoint, PROMPTS[0]).to_line()
    mistyped = good.replace(b'"max_tokens":%d' % MAX_TOKENS, b'"max_tokens":"%d"' % MAX_TOKENS)
    assert mistyped != good
    assert [e.code for e in asyncio.run(raw(mistyped))] == ["bad_request"]
    long_prompt = _request(endpoint, "word " * 9000)  # past the export's 8,192-token context
    assert [e.code for e in asyncio.run(_events(endpoint, long_prompt))] == ["prompt_too_long"]
    assert _tokens(asyncio.run(_events(endpoint, _request(endpoint, PROMPTS[0])))) == reference(PROMPTS[0])


def test_client_leaving_mid_answer_frees_the_session_everywhere(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    ring3: list[AgentProcess],
    fleet: Fleet,
) -> None:
    agent, endpoint = chat_agent
    observer = fleet.identity("observer")

    async def leave_early() -> int:
        stream = ask(endpoint, _request(endpoint, LONG_PROMPT, 200))
        got = [await anext(stream) for _ in range(5)]
        assert all(e.event == "token" for e in got)
        held = await asyncio.to_thread(status, agent.address, observer)
        await stream.aclose()  # the connection closes: the agent cancels the answer
        return int(held["local_chats"])  # type: ignore[arg-type]

    def kept() -> int:
        return int(status(agent.address, observer)["chat"]["kept"])  # type: ignore[index]

    assert asyncio.run(leave_early()) == 1 + kept()  # its place, and that of a session kept from before
    # A session kept from an earlier answer may remain (or expire meanwhile); the one left is freed.
    wait_for(lambda: status(agent.address, observer)["local_chats"] == kept(), 20, "the chat agent to free its place")
    for stage in ring3[1:]:
        wait_for(
            lambda stage=stage: len(status(stage.address, observer)["sessions"]) == kept(),
            20,
            f"stage {stage.stage} to free the chat's session",
        )
    assert "chat client left" in agent.log_text()


def test_a_client_that_leaves_before_its_first_token_ends_its_answer_at_once(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    ring3: list[AgentProcess],
    fleet: Fleet,
) -> None:
    """The agent watches the connection, not only the writes: a client gone during the prompt's step ends
    the answer before any token is computed for it, and its place is freed on every stage."""
    agent, endpoint = chat_agent
    observer = fleet.identity("observer")

    def kept() -> int:
        return int(status(agent.address, observer)["chat"]["kept"])  # type: ignore[index]

    async def ask_and_leave() -> None:
        _, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.write(_request(endpoint, LONG_PROMPT * 8, 200).to_line())
        await writer.drain()
        writer.close()  # at once: the long prompt is still being computed
        await writer.wait_closed()

    asyncio.run(ask_and_leave())
    wait_for(lambda: "chat client left before its first token" in agent.log_text(), 20, "the agent to notice")
    wait_for(lambda: status(agent.address, observer)["local_chats"] == kept(), 20, "the chat agent to free its place")
    for stage in ring3[1:]:
        wait_for(
            lambda stage=stage: len(status(stage.address, observer)["sessions"]) == kept(),
            20,
            f"stage {stage.stage} to free the chat's session",
        )


def test_an_http_client_that_gives_up_ends_its_answer_at_once(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    ring3: list[AgentProcess],
    fleet: Fleet,
) -> None:
    """A whole (not streamed) answer is written only at its end: the agent still ends it as soon as the
    client's connection closes, rather than computing it for nobody."""
    agent, endpoint = chat_agent
    observer = fleet.identity("observer")
    host, port = endpoint.http.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    body = json.dumps({"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 200}).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {endpoint.token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    answered = status(agent.address, observer)["chat"]["answered"]  # type: ignore[index]
    left = agent.log_text().count("HTTP client left")

    async def give_up() -> None:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    asyncio.run(give_up())
    wait_for(lambda: agent.log_text().count("HTTP client left") > left, 20, "the agent to notice")
    assert status(agent.address, observer)["chat"]["answered"] == answered  # type: ignore[index]  # cancelled
    kept = int(status(agent.address, observer)["chat"]["kept"])  # type: ignore[index]
    wait_for(lambda: status(agent.address, observer)["local_chats"] == kept, 20, "the chat agent to free its place")


def test_agent_off_stage_zero_heads_chats_through_token_ids(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    reference: Callable[[str], list[int]],
    tmp_path: Path,
) -> None:
    """An agent serving stage 1 heads a chat by sending token ids to ring3's stage 0 (``--ring-first``)."""
    first, last = ring3[0].address, ring3[2].address
    agent = start_agent(
        exported(3, "fp32"),
        1,
        fleet.identity("chat-node-1"),
        cache_dir,
        next_address=last,
        extra=[
            "--precision",
            "f32",
            "--chat",
            "127.0.0.1:0",
            "--chat-file",
            str(tmp_path / "c.json"),
            "--ring-first",
            f"{first[0]}:{first[1]}",
            "--ring-last",
            f"{last[0]}:{last[1]}",
        ],
    )
    try:
        endpoint = ChatEndpoint.load(tmp_path / "c.json")
        assert _tokens(asyncio.run(_events(endpoint, _request(endpoint, PROMPTS[1])))) == reference(PROMPTS[1])
        assert status(agent.address, fleet.identity("observer"))["chat"]["local_steps"] == 0  # type: ignore[index]
    finally:
        agent.stop()


def test_openai_style_api_answers_as_the_pipeline(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[[str], list[int]],
    exported: Callable[..., Path],
) -> None:
    """``/v1/chat/completions`` whole and streamed (server-sent events), ``/v1/models``, and its refusals."""
    import httpx

    _, endpoint = chat_agent
    assert endpoint.http.startswith("http://127.0.0.1:")
    tokenizer = ChatTokenizer(exported(3, "fp32") / "tokenizer")
    auth = {"Authorization": f"Bearer {endpoint.token}"}
    body = {"model": "smollm2", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": MAX_TOKENS}
    with httpx.Client(base_url=endpoint.http, headers=auth, timeout=120) as client:
        models = client.get("/models").json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        whole = client.post("/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        choice = whole.json()["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": tokenizer.decode(reference(PROMPTS[0]))}
        usage = whole.json()["usage"]
        assert choice["finish_reason"] == "stop" and usage["completion_tokens"] == len(reference(PROMPTS[0]))
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": PROMPTS[0]}])
        assert usage["prompt_tokens"] == len(prompt_ids)
        assert usage["total_tokens"] == len(prompt_ids) + len(reference(PROMPTS[0]))
        assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] < len(prompt_ids)
        deltas, finishes = [], []
        with client.stream("POST", "/chat/completions", json=body | {"stream": True, "max_tokens": 6}) as response:
            assert response.headers["content-type"] == "text/event-stream"
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        for line in lines[:-1]:
            chunk = json.loads(line.removeprefix("data: "))
            deltas.append(chunk["choices"][0]["delta"].get("content", ""))
            finishes.append(chunk["choices"][0]["finish_reason"])
        assert "".join(deltas) == tokenizer.decode(reference(PROMPTS[0])[:6])
        assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
        refused = [
            httpx.post(
                f"{endpoint.http}/chat/completions", json=body, headers={"Authorization": "Bearer x"}
            ).status_code,
            client.post("/chat/completions", content=b"nonsense").status_code,
            client.post("/chat/completions", json=body | {"messages": []}).status_code,
            client.post(
                "/chat/completions", json=body | {"messages": [{"role": "user", "content": "w " * 9000}]}
            ).status_code,
            client.get("/v2/elsewhere").status_code,
        ]
        assert refused == [401, 400, 400, 400, 404]
        assert client.post("/chat/completions", json=body).json()["choices"][0]["message"]["content"] == (
            tokenizer.decode(reference(PROMPTS[0]))
        )  # still serving after the refusals


def test_ask_holds_a_conversation_over_stdin(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[..., list[int]],
    exported: Callable[..., Path],
    cache_dir: Path,
) -> None:
    """``shoal ask`` without a prompt: each stdin line is a turn, sent with the turns and answers before it."""
    agent, _ = chat_agent
    tokenizer = ChatTokenizer(exported(3, "fp32") / "tokenizer")
    first = tokenizer.decode(reference(PROMPTS[0]))
    second = tokenizer.decode(reference((("user", PROMPTS[0]), ("assistant", first), ("user", "And of Italy?"))))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--cache-dir",
            str(cache_dir),
            "ask",
            "--max-tokens",
            str(MAX_TOKENS),
            "--chat-file",
            str(_endpoint_file(agent)),
        ],
        input=f"{PROMPTS[0]}\n\nAnd of Italy?\n",
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{first}\n{second}\n"
    assert second != tokenizer.decode(reference("And of Italy?")), "the second turn must depend on the first"
    assert done.stderr.count(" tokens in ") == 2


def test_next_turn_continues_the_kept_session_and_it_expires(
    chat_agent: tuple[AgentProcess, ChatEndpoint],
    reference: Callable[..., list[int]],
    exported: Callable[..., Path],
    ring3: list[AgentProcess],
    fleet: Fleet,
) -> None:
    """A second turn resumes the first turn's session (reusing what a fresh prompt computes alike: the first
    prompt's whole chunks), and its answer is the pipeline's to the whole conversation. Unused, the kept session
    is freed on every stage."""
    agent, endpoint = chat_agent
    observer = fleet.identity("observer")
    tokenizer = ChatTokenizer(exported(3, "fp32") / "tokenizer")
    opening = (("user", PROMPTS[3]),)
    first_text = tokenizer.decode(reference(opening))
    conversation = (*opening, ("assistant", first_text), ("user", "Say it again, in fewer words."))
    expected = reference(conversation)  # computed before the turns: the kept session must not expire between them
    before = status(agent.address, observer)["chat"]

    first = asyncio.run(_events(endpoint, ChatRequest(token=endpoint.token, messages=opening, max_tokens=MAX_TOKENS)))
    assert _tokens(first) == reference(opening)
    second = asyncio.run(
        _events(endpoint, ChatRequest(token=endpoint.token, messages=conversation, max_tokens=MAX_TOKENS))
    )
    assert _tokens(second) == expected
    opening_ids = tokenizer.encode_chat([{"role": "user", "content": PROMPTS[3]}])
    stats = second[-1].stats
    assert stats["prompt_tokens"] == len(
        tokenizer.encode_chat([{"role": role, "content": content} for role, content in conversation])
    )
    # f32 stages compute any grouping of positions alike: all the conversation the session holds is reused (the
    # first prompt and the answer), not only the first prompt's whole chunks (chunk_floor: 0 here)
    assert len(opening_ids) < stats["cached_tokens"] < stats["prompt_tokens"], stats
    assert chunk_floor(len(opening_ids), DEFAULT_PREFILL_CHUNK) == 0
    report = status(agent.address, observer)["chat"]
    assert report["resumed"] >= before["resumed"] + 1 and report["kept"] == 1  # type: ignore[index]
    assert "chat resumes a kept session" in agent.log_text()

    async def two_others() -> list[list[ChatEvent]]:  # as many chats as places: the kept one gives its place up
        return list(await asyncio.gather(*(_events(endpoint, _request(endpoint, p)) for p in PROMPTS[:CHAT_SESSIONS])))

    for prompt, events in zip(PROMPTS, asyncio.run(two_others()), strict=False):
        assert _tokens(events) == reference(prompt)

    wait_for(
        lambda: status(agent.address, observer)["chat"]["kept"] == 0,
        KEEP_SECONDS + 20,  # type: ignore[index]
        "the kept session to expire",
    )
    assert status(agent.address, observer)["local_chats"] == 0
    for stage in ring3[1:]:
        wait_for(
            lambda stage=stage: status(stage.address, observer)["sessions"] == [],
            20,
            f"stage {stage.stage} to free the kept session",
        )


def test_a_kept_session_evicted_as_the_next_turn_takes_it_over_starts_afresh(
    reference: Callable[..., list[int]],
    exported: Callable[..., Path],
    ring3: list[AgentProcess],
    fleet: Fleet,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """The eviction crosses the next turn on the wire: a chat agent whose link to stage 1 is slowed (a delay
    proxy) takes its kept session over before the ERROR ``evicted`` reaches it; the resumed step fails
    with it, and the turn starts afresh with the pipeline's answer instead of failing."""
    from agent.head.ring_client import RingClient
    from agent.transport.network import TlsNetwork
    from tests.integration.conftest import RING_MAX_SESSIONS
    from tests.support.delay_proxy import DelayProxy

    folder = exported(3, "fp32")
    tokenizer = ChatTokenizer(folder / "tokenizer")
    opening = (("user", LONG_PROMPT),)
    conversation = (
        *opening,
        ("assistant", tokenizer.decode(reference(opening))),
        ("user", "Say it again, in fewer words."),
    )
    expected = reference(conversation)
    identity = fleet.identity("evicting-head")
    last = ring3[2].address

    async def run() -> None:
        async with DelayProxy(ring3[1].address) as proxy:
            agent = await asyncio.to_thread(
                start_agent,
                folder,
                0,
                fleet.identity("slow-link-chat"),
                cache_dir,
                next_address=proxy.address,
                extra=[
                    "--precision",
                    "f32",
                    "--chat",
                    "127.0.0.1:0",
                    "--chat-file",
                    str(tmp_path / "chat.json"),
                    "--ring-last",
                    f"{last[0]}:{last[1]}",
                ],
            )
            client = RingClient(
                Manifest.load(folder), ring3[0].address, ring3[2].address, TlsNetwork.of(identity), identity.name
            )
            try:
                endpoint = ChatEndpoint.load(tmp_path / "chat.json")
                first = await _events(
                    endpoint, ChatRequest(token=endpoint.token, messages=opening, max_tokens=MAX_TOKENS)
                )
                assert _tokens(first) == reference(opening)
                await asyncio.sleep(0.5)  # the PARK reaches stage 1
                proxy.delay = 1.5  # from now on, stage 1's word takes 1.5 s to reach the chat agent
                await client.connect()
                ids = tokenizer.encode_chat([{"role": "user", "content": PROMPTS[2]}])
                others = [client.session(SamplingParams()) for _ in range(RING_MAX_SESSIONS)]
                for session in others:  # the last one evicts the parked session from the full stage 1
                    await session.step(ids, 0, last_only=True)
                for session in others:  # room again before the turn's fresh session arrives
                    await session.close()
                second = asyncio.create_task(
                    _events(endpoint, ChatRequest(token=endpoint.token, messages=conversation, max_tokens=MAX_TOKENS))
                )
                await asyncio.to_thread(
                    wait_for,
                    lambda: "evicted as the chat took it over" in agent.log_text(),
                    10,
                    "the resumed step to fail with the eviction",
                )
                proxy.delay = 0.0
                events = await second
                assert "chat resumes a kept session" in agent.log_text()
                assert _tokens(events) == expected
                assert events[-1].stats["cached_tokens"] == 0, events[-1].stats  # type: ignore[index]
            finally:
                await client.close()
                await asyncio.to_thread(agent.stop)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("stages", "weights", "extra"),
    [
        # below f32 a history computed in one step would round otherwise than the steps that made it: only a
        # replay of those steps, on one-thread stages that cut rejected drafts out, gives the same tokens (the
        # replay's logic, exact arithmetic, is tested in milliseconds by tests/middle/test_chat_head.py)
        (3, "int4", ["--threads", "1"]),
    ],
    ids=["int4-one-thread"],
)
def test_a_ring_lost_mid_answer_is_replayed_and_the_answer_goes_on(
    stages: int,
    weights: str,
    extra: list[str],
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """The last stage's agent is killed mid-answer (no goodbye) and started again at its address; later stage
    1's agent is frozen for 30 s (``kill -STOP``), which heartbeats notice. Each time the chat agent replays
    the session's steps into a fresh one, and the client gets the whole answer, token for token that of the
    same ring never interrupted, after a pause."""
    folder = exported(stages, weights)
    listen = f"127.0.0.1:{free_port()}"
    tokens = 48
    ring = [
        start_agent(folder, stages - 1, fleet.identity(f"replay-{stages - 1}"), cache_dir, listen=listen, extra=extra)
    ]
    for stage in reversed(range(1, stages - 1)):
        ring.insert(
            0,
            start_agent(
                folder, stage, fleet.identity(f"replay-{stage}"), cache_dir, next_address=ring[0].address, extra=extra
            ),
        )
    agent = start_agent(
        folder,
        0,
        fleet.identity("replay-chat"),
        cache_dir,
        next_address=ring[0].address,
        extra=[
            *extra,
            "--chat",
            "127.0.0.1:0",
            "--chat-file",
            str(tmp_path / "chat.json"),
            "--chat-keep",
            "0",
            "--ring-last",
            listen,
        ],
    )  # nothing kept: each answer afresh
    agents = [agent, *ring]

    async def answer(kill_after: int | None = None, freeze_after: int | None = None) -> list[ChatEvent]:
        endpoint = ChatEndpoint.load(tmp_path / "chat.json")
        events: list[ChatEvent] = []
        async for event in ask(endpoint, _request(endpoint, LONG_PROMPT, tokens)):
            events.append(event)
            if len(events) == freeze_after:  # as a PC that hangs: its kernel still keeps TCP up
                os.kill(ring[0].process.pid, signal.SIGSTOP)
                asyncio.get_running_loop().call_later(FREEZE_SECONDS, os.kill, ring[0].process.pid, signal.SIGCONT)
            if len(events) == kill_after:
                ring[-1].process.kill()  # as a PC switched off: no goodbye
                ring[-1].process.wait(10)
                agents.append(
                    await asyncio.to_thread(
                        start_agent,
                        folder,
                        stages - 1,
                        fleet.identity(f"replay-{stages - 1}"),
                        cache_dir,
                        listen=listen,
                        extra=extra,
                    )
                )
        return events

    try:
        expected = _tokens(asyncio.run(answer(None)))
        assert len(expected) == tokens  # the story outlasts the budget: the kill lands mid-answer
        events = asyncio.run(answer(12))
        assert _tokens(events) == expected
        assert events[-1].stats["replays"] == 1, events[-1].stats  # type: ignore[index]
        assert "replaying its steps into a fresh session" in agent.log_text()
        assert status(agent.address, fleet.identity("observer"))["chat"]["replayed"] == 1  # type: ignore[index]
        # stage 1 frozen for 30 s (kill -STOP): the heartbeats notice it, the answer replays once it thaws
        started = time.monotonic()
        events = asyncio.run(answer(freeze_after=12))
        assert time.monotonic() - started >= FREEZE_SECONDS
        assert _tokens(events) == expected
        stats = events[-1].stats
        assert stats["replays"] == 1 and stats["exact"] is True, stats  # type: ignore[index]
        assert any("not even an answer to heartbeats" in cause for cause in stats["interruptions"]), stats  # type: ignore[index]
    finally:
        os.kill(ring[0].process.pid, signal.SIGCONT)
        for each in agents:
            each.stop()
