"""The local chat endpoint's protocol and endpoint file: what is accepted, what is refused, and why."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import MAX_LINE_BYTES, ChatEvent, ChatRequest
from agent.errors import ChatEndpointError, ChatProtocolError


def _line(**fields: object) -> bytes:
    body: dict[str, object] = {"v": 1, "token": "t", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode() + b"\n"


def test_request_round_trip() -> None:
    request = ChatRequest(
        token="t",
        messages=(("system", "be brief"), ("user", "hi")),
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=3,
    )
    assert ChatRequest.from_line(request.to_line()) == request
    assert request.chat_messages() == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert request.sampling.top_k == 40 and not request.sampling.greedy


def test_defaults() -> None:
    request = ChatRequest.from_line(_line())
    # no max_tokens: the answer gets what room the context leaves, up to 256 (agent.head.chat.check_prompt)
    assert (request.max_tokens, request.temperature, request.seed) == (None, 0.0, None)
    assert request.sampling.greedy


@pytest.mark.parametrize(
    ("line", "code", "message"),
    [
        (b"not json\n", "bad_request", "not a JSON line"),
        (b"[1, 2]\n", "bad_request", "not a JSON object"),
        (_line(v=2), "bad_version", "protocol version 2"),
        (_line(v=...), "bad_version", "protocol version None"),
        (_line(token=...), "bad_request", "missing field 'token'"),
        (_line(messages=[]), "bad_request", "non-empty list"),
        (_line(messages=[{"role": "user"}]), "bad_request", "each message"),
        (_line(messages=[{"role": "robot", "content": "x"}]), "bad_request", "role must be one of"),
        (
            _line(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
            "bad_request",
            "last message must be the user's",
        ),
        (_line(max_tokens=0), "bad_request", "at least 1"),
        (_line(max_tokens="9"), "bad_request", "'max_tokens' has the wrong type"),
        (_line(max_tokens=True), "bad_request", "'max_tokens' has the wrong type"),
        (_line(temperature=-1), "bad_request", "temperature must be"),
        (_line(top_p=0), "bad_request", "top-p"),
        (_line(extra=1), "bad_request", "unknown request fields"),
    ],
)
def test_bad_requests_are_refused(line: bytes, code: str, message: str) -> None:
    with pytest.raises(ChatProtocolError, match=message) as caught:
        ChatRequest.from_line(line)
    assert caught.value.code == code


def test_oversized_line_is_refused_before_parsing() -> None:
    with pytest.raises(ChatProtocolError, match="longer than"):
        ChatRequest.from_line(_line(messages=[{"role": "user", "content": "x" * MAX_LINE_BYTES}]))


def test_events_round_trip() -> None:
    for event in (
        ChatEvent("token", id=42, text="é"),
        ChatEvent.error("fleet_busy", "try later"),
        ChatEvent("done", stats={"tokens": 3, "seconds": 0.5}),
    ):
        assert ChatEvent.from_line(event.to_line()) == event
    with pytest.raises(ChatProtocolError, match="unknown event"):
        ChatEvent.from_line(b'{"v":1,"event":"shrug"}\n')


def test_endpoint_file_is_private_and_round_trips(tmp_path: Path) -> None:
    endpoint = ChatEndpoint.new("127.0.0.1", 4567)
    path = tmp_path / "data" / "chat.json"
    endpoint.write(path)
    assert ChatEndpoint.load(path) == endpoint
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(endpoint.token) == 64 and endpoint.token != ChatEndpoint.new("127.0.0.1", 4567).token
    assert list(path.parent.iterdir()) == [path]  # no scratch file left behind


def test_missing_or_bad_endpoint_file(tmp_path: Path) -> None:
    with pytest.raises(ChatEndpointError, match="--chat"):
        ChatEndpoint.load(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text('{"host": "127.0.0.1"}')
    with pytest.raises(ChatEndpointError, match="not a chat endpoint file"):
        ChatEndpoint.load(tmp_path / "bad.json")
