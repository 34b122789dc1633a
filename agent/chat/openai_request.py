"""OpenAI request bodies as shoal chat requests, checked at the edge.

What clients send routinely and shoal does not use is accepted and ignored (``user``, ``store``, a
message's ``name``...). What would change the answer's meaning and shoal cannot honour is refused with a
400 naming it (tools, penalties, ``n`` above 1...). ``logprobs`` (and a chat's ``top_logprobs``) ask for each
token's log-probability and up to ``MAX_TOP_LOGPROBS`` alternatives. Content given as a list of text parts is
joined; other part types are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agent.chat_client.protocol import ChatRequest
from agent.errors import ChatProtocolError, HTTPError
from agent.sampling.params import MAX_TOP_LOGPROBS
from agent.wire.jsonbody import loads_json

IGNORED = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls", "prompt_cache_key"})
"""Fields a client may send that change nothing shoal does."""
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "response_format": ({"type": "text"},),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
}
"""Fields accepted only at the value that asks for nothing shoal lacks (or absent, or null)."""
ROLES_AS = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING = ("temperature", "top_p", "top_k", "seed")


@dataclass(frozen=True)
class OpenAIRequest:
    """A chat (or completion) request in shoal's terms, and how the client wants the answer delivered."""

    chat: ChatRequest
    model: str | None
    stream: bool
    include_usage: bool
    """``stream_options.include_usage``: a last chunk with the usage and no choices."""


def parse_openai(body: bytes, token: str, *, completion: bool) -> OpenAIRequest:
    """A ``/v1/chat/completions`` body (``completion``: a ``/v1/completions`` one) as an :class:`OpenAIRequest`."""
    try:
        data = loads_json(body)
    except ValueError as exc:  # UnicodeDecodeError and too deep a nesting too
        raise HTTPError("bad_request", "the body is not JSON") from exc
    if not isinstance(data, dict):
        raise HTTPError("bad_request", "the body is not a JSON object")
    input_field = "prompt" if completion else "messages"
    handled = {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "logprobs",
        "top_logprobs",
        input_field,
        *SAMPLING,
    }
    for name, value in data.items():
        if name in handled or name in IGNORED or value is None:
            continue
        if name not in NEUTRAL:
            raise HTTPError("bad_request", f"unsupported field {name!r}", name)
        if value not in NEUTRAL[name]:
            raise HTTPError("bad_request", _unsupported(name, value), name)
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise HTTPError("bad_request", "'stream' must be true or false", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise HTTPError(
            "bad_request", "'stream_options' must be an object with a boolean include_usage", "stream_options"
        )
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise HTTPError("bad_request", "'model' must be a string", "model")
    fields: dict[str, Any] = {
        "token": token,
        "logprobs": _logprobs(data, completion),
        "max_tokens": data.get("max_completion_tokens", data.get("max_tokens")),
        **{name: data[name] for name in (*SAMPLING, "stop") if data.get(name) is not None},
    }
    if completion:
        prompt = data.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise HTTPError("bad_request", "'prompt' must be a non-empty string (one prompt per request)", "prompt")
        fields["prompt"] = prompt
    else:
        fields["messages"] = _messages(data.get("messages"))
    try:
        chat = ChatRequest.from_mapping(fields)
    except ChatProtocolError as exc:
        raise HTTPError("bad_request", str(exc), exc.param) from exc
    return OpenAIRequest(chat, model, stream, bool(options.get("include_usage", False)))


def _logprobs(data: dict[str, Any], completion: bool) -> int | None:
    """The alternatives asked for with each token's log-probability, or None: a chat's ``logprobs: true`` with
    ``top_logprobs`` (0 unless given), a completion's ``logprobs`` (a number, OpenAI's legacy form)."""
    asked, top = data.get("logprobs"), data.get("top_logprobs")
    bound = f"0 to {MAX_TOP_LOGPROBS}"
    if completion:
        if top is not None:
            raise HTTPError("bad_request", "completions take 'logprobs' (a number), not 'top_logprobs'", "top_logprobs")
        if asked is not None and not _count(asked):
            raise HTTPError("bad_request", f"'logprobs' must be a number of alternatives, {bound}", "logprobs")
        return asked
    if asked is not None and not isinstance(asked, bool):
        raise HTTPError("bad_request", "'logprobs' must be true or false", "logprobs")
    if top is not None and not _count(top):
        raise HTTPError("bad_request", f"'top_logprobs' must be a number, {bound}", "top_logprobs")
    if not asked:
        if top:
            raise HTTPError("bad_request", "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    return top or 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOP_LOGPROBS


def _unsupported(name: str, value: Any) -> str:
    """Why a field's value is refused: a short value is quoted, a long one (a ``tools`` list is kilobytes of JSON)
    only described."""
    shown = json.dumps(value)
    if len(shown) <= 40:
        return f"{name}={shown} is not supported by shoal"
    kind = f"a list of {len(value)}" if isinstance(value, list) else f"a {type(value).__name__}"
    return f"{name!r} ({kind}) is not supported by shoal: send the request without it"


def _messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise HTTPError("bad_request", "'messages' must be a non-empty list", "messages")
    messages = []
    for item in raw:
        if not isinstance(item, dict):
            raise HTTPError("bad_request", "each message must be an object", "messages")
        given = item.get("role")
        role = ROLES_AS.get(given) if isinstance(given, str) else None
        if role is None:
            raise HTTPError("bad_request", f"a message's role must be one of {', '.join(ROLES_AS)}", "messages")
        extra = set(item) - {"role", "content", "name"}
        if extra:
            raise HTTPError("bad_request", f"message fields {sorted(extra)} are not supported", "messages")
        messages.append({"role": role, "content": _content(item.get("content"))})
    return messages


def _content(content: Any) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": ...}`` parts, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise HTTPError("bad_request", "a message's content must be text or a list of text parts", "messages")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise HTTPError("bad_request", f"content parts of type {kind!r} are not supported: only text", "messages")
        texts.append(part["text"])
    return "".join(texts)
