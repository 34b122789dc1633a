"""The local chat endpoint's protocol: one JSON request line in, JSON event lines out.

A chat client on the PC (``shoal ask``, later the TUI) connects to its own agent over loopback TCP,
sends one :class:`ChatRequest` line carrying the endpoint's access token, and reads events until a
``done`` or an ``error``: one ``token`` event per generated token (its id and the text it adds; the
text may be empty while a multi-byte character is incomplete). Closing the connection cancels the
answer. Every line carries the protocol version ``v``; requests are checked field by field here, at
the edge, before anything reaches the generation loop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, Protocol

from agent.errors import ChatProtocolError, ShoalError
from agent.sampling.params import MAX_TOP_LOGPROBS, SamplingParams
from agent.wire.jsonbody import loads_json

MAX_STOPS = 4
"""As OpenAI: at most four stop sequences (``agent.chat.stop_text`` finds them in the answer)."""

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 1 << 20
"""A request longer than this is refused (it would be a prompt far beyond any context anyway)."""
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatRequest:
    """One answer asked of the agent: the conversation so far and how to sample the reply."""

    token: str
    messages: tuple[tuple[str, str], ...]
    """(role, content) pairs, oldest first; the last is the user's."""
    max_tokens: int | None = None
    """New tokens the answer may have at most; None: 256, or what the context leaves after the prompt if less
    (``agent.head.chat.check_prompt``)."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Text that ends the answer (at most ``MAX_STOPS``); the answer's text is cut before it."""
    prompt: str | None = None
    """A completion's raw text, tokenized as it is, without the chat template (``messages`` is then empty)."""
    logprobs: int | None = None
    """Each token's log-probability and this many of the most likely tokens at its position, on its ``token``
    event (0 to ``MAX_TOP_LOGPROBS``); None: none."""

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed, logprobs=self.logprobs
        )

    def chat_messages(self) -> list[dict[str, str]]:
        """The conversation in the form chat templates take."""
        return [{"role": role, "content": content} for role, content in self.messages]

    def to_line(self) -> bytes:
        body = asdict(self)
        body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        return _line({"v": PROTOCOL_VERSION, **body})

    @classmethod
    def from_line(cls, line: bytes) -> ChatRequest:
        """Parse and check one request line (raises :class:`ChatProtocolError`)."""
        return cls.from_mapping(_object(line))

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> ChatRequest:
        """Check the fields of a request already parsed (its version, if any, checked by the caller)."""
        known = {"v", *(f.name for f in fields(cls))}
        unknown = set(data) - known
        if unknown:
            raise ChatProtocolError(f"unknown request fields {sorted(unknown)}")
        token = _typed(data, "token", str)
        prompt = _typed(data, "prompt", (str, type(None)), None)
        if prompt is not None:
            if not prompt or data.get("messages"):
                raise ChatProtocolError("a completion's 'prompt' is non-empty text, and comes without 'messages'")
            data = {**data, "messages": [{"role": "user", "content": prompt}]}  # checked as one user turn
        raw = data.get("messages")
        if not isinstance(raw, list) or not raw:
            raise ChatProtocolError("'messages' must be a non-empty list", param="messages")
        messages = []
        for item in raw:
            if not isinstance(item, dict) or set(item) != {"role", "content"}:
                raise ChatProtocolError('each message must be {"role": ..., "content": ...}', param="messages")
            role, content = item["role"], item["content"]
            if role not in ROLES or not isinstance(content, str):
                raise ChatProtocolError(
                    f"a message's role must be one of {', '.join(ROLES)} and its content text", param="messages"
                )
            messages.append((role, content))
        if messages[-1][0] != "user":
            raise ChatProtocolError("the last message must be the user's", param="messages")
        max_tokens = _typed(data, "max_tokens", (int, type(None)), None)
        if max_tokens is not None and max_tokens < 1:
            raise ChatProtocolError("max_tokens must be at least 1", param="max_tokens")
        request = cls(
            token=token,
            messages=tuple(messages),
            max_tokens=max_tokens,
            temperature=_float(data, "temperature", 0.0),
            top_p=_float(data, "top_p", 1.0),
            top_k=_typed(data, "top_k", int, 0),
            seed=_typed(data, "seed", (int, type(None)), None),
            stop=_stops(data.get("stop")),
            prompt=prompt,
            logprobs=_logprobs(data.get("logprobs")),
        )
        if prompt is not None:
            request = replace(request, messages=())
        try:
            request.sampling  # noqa: B018 - validates the sampling settings
        except ShoalError as exc:
            raise ChatProtocolError(str(exc)) from exc
        return request


def _float(data: dict[str, Any], name: str, default: float) -> float:
    """A number field as a float: an integer too large for one is refused, not raised as ``OverflowError``."""
    try:
        return float(_typed(data, name, (int, float), default))
    except OverflowError as exc:
        raise ChatProtocolError(f"field {name!r} is out of range", param=name) from exc


def _stops(value: Any) -> tuple[str, ...]:
    """``stop``: absent, one string, or a list of at most ``MAX_STOPS`` non-empty strings."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOPS:
        raise ChatProtocolError(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOPS} of them", param="stop"
        )
    return tuple(stops)


def _logprobs(value: Any) -> int | None:
    """``logprobs``: absent, or the number of alternatives (0 to ``MAX_TOP_LOGPROBS``) with each token's own."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise ChatProtocolError(
            f"'logprobs' must be a number of alternatives, 0 to {MAX_TOP_LOGPROBS}", param="logprobs"
        )
    return value


@dataclass(frozen=True)
class Alternative:
    """One of the most likely tokens at a position: its id, its text, its log-probability."""

    id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model (``agent.sampling.logprobs``), its text alone (a
    token that is part of a character shows as U+FFFD), and the most likely tokens at its position."""

    token: str
    logprob: float
    top: tuple[Alternative, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": [[a.id, a.token, a.logprob] for a in self.top]}

    @classmethod
    def from_json(cls, data: Any) -> TokenLogprob:
        try:
            top = tuple(Alternative(int(i), str(t), float(lp)) for i, t, lp in data["top"])
            return cls(str(data["token"]), float(data["logprob"]), top)
        except (KeyError, TypeError, ValueError) as exc:
            raise ChatProtocolError("a token's logprobs must be {token, logprob, top: [[id, token, logprob]]}") from exc


EventKind = Literal["token", "progress", "done", "error"]


@dataclass(frozen=True)
class ChatEvent:
    """One line of an answer: a token, the progress of a long prompt, the end (with what the generation did),
    or an error."""

    event: EventKind
    id: int | None = None
    text: str = ""
    code: str = ""
    """For errors: ``bad_request``, ``unauthorized``, ``prompt_too_long``, ``fleet_busy``, ``ring_unavailable``,
    ``failed``."""
    param: str | None = None
    """For errors: the request field at fault, as OpenAI's errors name it (None: no one field is)."""
    logprobs: TokenLogprob | None = None
    """For tokens of a request that asked for them (``ChatRequest.logprobs``)."""
    stats: dict[str, Any] = field(default_factory=dict)
    """For ``done``: tokens, max_tokens (the most the answer was allowed), seconds, steps, drafted, accepted,
    median_k, finish_reason (``stop``: a stop token or sequence ended it; ``length``: max_tokens did), exact (the
    ring computed it as plain decoding would: the same question gets the same tokens)... A ``done`` event's
    ``text`` is the end of the answer's text that no token event carried (held back while it might have begun a
    stop sequence). For ``progress``: ``done`` and ``total`` prompt positions, ``seconds`` since the answer
    began. For a ``prompt_too_long`` error: ``prompt_tokens``, ``max_tokens`` (null: none asked) and
    ``context_tokens``, for a client to word the refusal in its own terms (``PromptTooLongError.of``)."""

    def to_line(self) -> bytes:
        body: dict[str, Any] = {"v": PROTOCOL_VERSION, "event": self.event}
        if self.event == "token":
            body.update(id=self.id, text=self.text)
            if self.logprobs is not None:
                body.update(logprobs=self.logprobs.to_json())
        elif self.event == "error":
            body.update(code=self.code, text=self.text)
            if self.param is not None:
                body.update(param=self.param)
            if self.stats:
                body.update(stats=self.stats)
        elif self.event == "progress":
            body.update(stats=self.stats)
        else:
            body.update(stats=self.stats)
            if self.text:
                body.update(text=self.text)
        return _line(body)

    @classmethod
    def from_line(cls, line: bytes) -> ChatEvent:
        data = _object(line)
        kind = data.get("event")
        if kind == "token":
            token_id = _typed(data, "id", int)
            scored = data.get("logprobs")
            logprobs = TokenLogprob.from_json(scored) if scored is not None else None
            return cls("token", id=token_id, text=_typed(data, "text", str), logprobs=logprobs)
        if kind == "error":
            code, text = _typed(data, "code", str), _typed(data, "text", str)
            param, stats = _typed(data, "param", (str, type(None)), None), _typed(data, "stats", dict, {})
            return cls("error", code=code, text=text, param=param, stats=stats)
        if kind == "done":
            return cls("done", stats=_typed(data, "stats", dict), text=_typed(data, "text", str, ""))
        if kind == "progress":
            stats = _typed(data, "stats", dict)
            done, total = stats.get("done"), stats.get("total")
            if not isinstance(done, int) or not isinstance(total, int) or not 0 <= done <= total:
                raise ChatProtocolError("a progress event counts 0 <= done <= total prompt positions")
            return cls("progress", stats=stats)
        raise ChatProtocolError(f"unknown event {kind!r}")

    @classmethod
    def error(cls, code: str, text: str, param: str | None = None, stats: dict[str, Any] | None = None) -> ChatEvent:
        return cls("error", code=code, text=text, param=param, stats=stats or {})

    @classmethod
    def progress(cls, done: int, total: int, seconds: float) -> ChatEvent:
        """How far a long prompt's prefill has gone: ``done`` of ``total`` positions after ``seconds``."""
        return cls("progress", stats={"done": done, "total": total, "seconds": round(seconds, 3)})


def _line(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _object(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise ChatProtocolError(f"line longer than {MAX_LINE_BYTES} bytes")
    try:
        data = loads_json(line)
    except ValueError as exc:  # UnicodeDecodeError and too deep a nesting too
        raise ChatProtocolError("not a JSON line") from exc
    if not isinstance(data, dict):
        raise ChatProtocolError("not a JSON object")
    if data.get("v") != PROTOCOL_VERSION:
        raise ChatProtocolError(
            f"protocol version {data.get('v')!r}, this agent speaks {PROTOCOL_VERSION}", code="bad_version"
        )
    return data


_MISSING = object()


def _typed(data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
    value = data.get(name, default)
    if value is _MISSING:
        raise ChatProtocolError(f"missing field {name!r}", param=name)
    # bool is an int to isinstance; a flag where a number belongs is still a mistake
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ChatProtocolError(f"field {name!r} has the wrong type", param=name)
    return value


class ChatAnswerer(Protocol):
    """What answers chats, as a front end (the JSON-lines endpoint, the OpenAI-style API, the TUI) sees it."""

    @property
    def node(self) -> str:
        """The answering agent's node id (for its log lines)."""
        ...

    @property
    def token(self) -> str:
        """The access token every request must carry."""
        ...

    @property
    def model_id(self) -> str:
        """The model the answers come from."""
        ...

    def answer(self, request: ChatRequest) -> AsyncGenerator[ChatEvent, None]:
        """The events of one answer: ``token`` events, then ``done``; or one ``error``."""
        ...
