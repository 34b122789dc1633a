"""An OpenAI-style HTTP endpoint in front of what answers the agent's chats (``ChatAnswerer``), for any such client.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed as server-sent events with
``"stream": true``, else one JSON body), ``GET /v1/models`` and ``GET /metrics`` (the agent's figures in the
Prometheus text format, when the daemon gives a renderer), on loopback only, authorised by
``Authorization: Bearer TOKEN`` with the token of the agent's endpoint file. HTTP/1.1 is parsed by h11
(sans-IO), connections are kept alive for a pooled client's next request. Request bodies are checked by
``agent.chat.openai_request``. Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "param", "code"}}``)
with a fitting status: 400 bad request, 401 wrong token, 404 unknown path or model, 413 body too large,
429 fleet busy, 503 ring unavailable, 500 anything else. A client that disconnects cancels its answer, as
on the chat endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h11

from agent.chat.openai_request import parse_openai
from agent.chat.watch import ClientWatch
from agent.chat_client.protocol import MAX_LINE_BYTES, ChatAnswerer, ChatEvent, TokenLogprob
from agent.errors import HTTPError
from agent.transport.http import read_request, request_begins, send, send_body
from agent.transport.listen import listen_tcp
from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
"""A request must arrive whole within this long once it has begun."""
IDLE_TIMEOUT = 60.0
"""A kept-alive connection with no new request for this long is closed."""
STATUS_OF = {
    "bad_request": 400,
    "bad_version": 400,
    "prompt_too_long": 400,
    "unauthorized": 401,
    "not_found": 404,
    "model_not_found": 404,
    "too_large": 413,
    "fleet_busy": 429,
    "ring_unavailable": 503,
}


class OpenAIEndpoint:
    """Serves one agent's chats over HTTP in the OpenAI chat-completions format."""

    def __init__(
        self,
        service: ChatAnswerer,
        listen: tuple[str, int],
        metrics: Callable[[], bytes] | None = None,
        metrics_type: str = "text/plain",
    ) -> None:
        self.service = service
        self._listen = listen
        self._metrics = metrics
        self._metrics_type = metrics_type
        self._server: asyncio.Server | None = None
        self._tasks = OwnedTasks()
        self.connections = 0
        self.requests = 0
        """Connections accepted and requests read, all told (a kept-alive connection serves several)."""
        self.refused: Counter[str] = Counter()
        """Requests refused here, by code, before any answer began (a wrong token, a bad body, an unknown path or
        model...); the chat service counts the answers that ended in an error."""

    def status(self) -> dict[str, Any]:
        """The ``http`` section of the agent's status."""
        return {"connections": self.connections, "requests": self.requests, "refused": dict(self.refused)}

    async def start(self) -> tuple[str, int]:
        self._server = await listen_tcp(self._handle, self._listen, "the HTTP API")
        host, port = self._server.sockets[0].getsockname()[:2]
        log.info("node=%s OpenAI-style API on http://%s:%d/v1", self.service.node, host, port)
        return host, port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._tasks.cancel_all()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.adopt()
        self.connections += 1
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        watch: ClientWatch | None = None
        try:
            while True:
                try:
                    try:
                        async with asyncio.timeout(IDLE_TIMEOUT):  # a kept-alive client's next request
                            await request_begins(connection, reader)
                    except (TimeoutError, EOFError):
                        return
                    async with asyncio.timeout(READ_TIMEOUT):
                        request, body = await read_request(connection, reader, MAX_LINE_BYTES)
                    self.requests += 1
                    watch = ClientWatch.start(reader)  # the client sends nothing more until its answer is whole
                    await self._route(connection, writer, request, body)
                except HTTPError as exc:
                    log.warning("node=%s HTTP request refused: %s: %s", self.service.node, exc.code, exc)
                    if not exc.answered:
                        self.refused[exc.code] += 1
                    if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                        return
                    refusal = _error_body(exc.code, str(exc), exc.param)
                    await _send_json(connection, writer, STATUS_OF.get(exc.code, 500), refusal)
                except (h11.RemoteProtocolError, TimeoutError) as exc:
                    self.refused["bad_request"] += 1
                    if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await _send_json(
                            connection, writer, 400, _error_body("bad_request", f"bad HTTP request: {exc}")
                        )
                    return
                early = b""
                if watch is not None:
                    early, watch = await watch.release(), None
                if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                    return  # the client asked to close, or its request was not read whole
                connection.start_next_cycle()
                if early:
                    connection.receive_data(early)
        except asyncio.CancelledError:
            if watch is None or not watch.absorbed():
                raise
            log.info("node=%s HTTP client left before its answer was complete", self.service.node)
        except (ConnectionError, asyncio.IncompleteReadError):
            log.info("node=%s HTTP client left before its answer was complete", self.service.node)
        except Exception:  # a bug must not go unanswered, nor take the agent down
            log.exception("node=%s HTTP request failed unexpectedly", self.service.node)
        finally:
            if watch is not None:
                watch.stop()
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _route(
        self, connection: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        path = request.target.decode("latin-1").split("?", 1)[0]
        self._authorise(request)
        model = self.service.model_id
        if request.method == b"GET" and path == "/v1/models":
            await _send_json(
                connection,
                writer,
                200,
                {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "shoal"}]},
            )
            return
        if request.method == b"GET" and path == "/metrics" and self._metrics is not None:
            exposition = await asyncio.get_running_loop().run_in_executor(None, self._metrics)
            await send_body(connection, writer, 200, self._metrics_type, exposition)
            return
        completion = path == "/v1/completions"
        if request.method != b"POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            raise HTTPError(
                "not_found",
                f"no {request.method.decode()} {path} here: use POST /v1/chat/completions or /v1/completions",
            )
        asked = parse_openai(body, self.service.token, completion=completion)
        if asked.model not in (None, "", model):
            raise HTTPError(
                "model_not_found",
                f"the model {asked.model!r} does not exist here: this fleet serves {model!r}",
                "model",
            )
        reply = _Reply(
            f"{'cmpl' if completion else 'chatcmpl'}-{secrets.token_hex(12)}",
            int(time.time()),
            model,
            completion,
            asked.chat.logprobs is not None,
        )
        events = self.service.answer(asked.chat)
        async with contextlib.aclosing(events):
            if asked.stream:
                await self._stream(connection, writer, events, reply, asked.include_usage)
            else:
                await self._whole(connection, writer, events, reply)

    def _authorise(self, request: h11.Request) -> None:
        given = dict(request.headers).get(b"authorization", b"")
        token = self.service.token.encode()
        if not secrets.compare_digest(given, b"Bearer " + token):
            raise HTTPError("unauthorized", "missing or wrong bearer token (the token of the agent's chat.json)")

    async def _whole(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        events: AsyncIterator[ChatEvent],
        reply: _Reply,
    ) -> None:
        text: list[str] = []
        scored: list[TokenLogprob] = []
        async for event in events:
            if event.event == "token":
                text.append(event.text)
                if event.logprobs is not None:
                    scored.append(event.logprobs)
            elif event.event == "error":
                raise HTTPError(event.code, event.text, event.param, answered=True)
            elif event.event == "done":
                text.append(event.text)
                body = reply.body("".join(text), str(event.stats["finish_reason"]), scored)
                await _send_json(connection, writer, 200, {**body, "usage": _usage(event.stats), **_exact(event.stats)})

    async def _stream(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        events: AsyncIterator[ChatEvent],
        reply: _Reply,
        include_usage: bool,
    ) -> None:
        started = False
        async for event in events:
            if event.event == "progress":
                continue  # OpenAI's stream has no such chunk; its clients wait for the first token
            if event.event == "error" and not started:
                raise HTTPError(event.code, event.text, event.param, answered=True)  # nothing sent yet: a proper status
            if not started:
                headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
                await send(writer, connection.send(h11.Response(status_code=200, headers=headers)))
                if not reply.completion:
                    await _send_event(connection, writer, reply.chunk({"role": "assistant", "content": ""}))
                started = True
            if event.event == "token":
                scored = [event.logprobs] if event.logprobs is not None else []
                if event.text or scored:  # a token held back (part of a character, a stop sequence?) still scores
                    await _send_event(connection, writer, reply.chunk({"content": event.text}, scored=scored))
            elif event.event == "error":
                await _send_event(connection, writer, _error_body(event.code, event.text))
                break
            else:
                if event.text:
                    await _send_event(connection, writer, reply.chunk({"content": event.text}))
                finish = str(event.stats["finish_reason"])
                await _send_event(connection, writer, {**reply.chunk({}, finish), **_exact(event.stats)})
                if include_usage:  # the last chunk says it too, as the finish chunk does
                    usage = {**reply.chunk({}), "choices": [], "usage": _usage(event.stats), **_exact(event.stats)}
                    await _send_event(connection, writer, usage)
                await send(writer, connection.send(h11.Data(data=b"data: [DONE]\n\n")))
        await send(writer, connection.send(h11.EndOfMessage()))


@dataclass(frozen=True)
class _Reply:
    """The shape of one answer's bodies: a chat completion or a (text) completion."""

    id: str
    created: int
    model: str
    completion: bool
    logprobs: bool = False
    """The client asked for log-probabilities: every choice carries them (else ``"logprobs": null``)."""
    _text_offset: list[int] = field(default_factory=lambda: [0], compare=False)
    """Where a completion's next token starts in its text (OpenAI's ``text_offset``), across chunks."""

    def body(self, text: str, finish: str, scored: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        if self.completion:
            choice: dict[str, Any] = {"index": 0, "text": text}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        choice.update(logprobs=self._logprobs(scored), finish_reason=finish)
        kind = "text_completion" if self.completion else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def chunk(
        self, delta: dict[str, str], finish: str | None = None, scored: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        if self.completion:
            choice: dict[str, Any] = {"index": 0, "text": delta.get("content", "")}
        else:
            choice = {"index": 0, "delta": delta}
        choice["logprobs"] = self._logprobs(scored) if scored else None
        choice["finish_reason"] = finish
        kind = "text_completion" if self.completion else "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def _logprobs(self, scored: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """The tokens' log-probabilities in OpenAI's shape: a chat's ``content`` entries (token, logprob, bytes,
        top_logprobs), or a completion's parallel lists (tokens, token_logprobs, top_logprobs as {token:
        logprob} with the chosen token among them, text_offset)."""
        if not self.logprobs:
            return None
        if not self.completion:
            content = [
                {**_entry(t.token, t.logprob), "top_logprobs": [_entry(a.token, a.logprob) for a in t.top]}
                for t in scored
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for t in scored:
            offsets.append(self._text_offset[0])
            self._text_offset[0] += len(t.token)
        return {
            "tokens": [t.token for t in scored],
            "token_logprobs": [t.logprob for t in scored],
            "top_logprobs": [{**{a.token: a.logprob for a in t.top}, t.token: t.logprob} for t in scored],
            "text_offset": offsets,
        }


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def _exact(stats: dict[str, Any]) -> dict[str, bool]:
    """shoal's own field on an answer's body, and on a stream's finish chunk and last chunk (the usage chunk with
    ``include_usage``): whether the ring computed it exactly as plain decoding would, so the same request gets the
    same text (``AnswerTally.exact``). OpenAI's clients keep fields they do not know (the ``openai`` client:
    ``response.model_extra``)."""
    return {"exact": bool(stats.get("exact", False))}


def _error_body(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body; ``param``: the request field at fault (null when no one field is)."""
    kind = "invalid_request_error" if STATUS_OF.get(code, 500) < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _send_json(
    connection: h11.Connection, writer: asyncio.StreamWriter, status: int, body: dict[str, Any]
) -> None:
    await send_body(connection, writer, status, "application/json", json.dumps(body, ensure_ascii=False).encode())


async def _send_event(connection: h11.Connection, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
    await send(writer, connection.send(h11.Data(data=data)))


def _usage(stats: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage block; ``cached_tokens``: prompt tokens a kept session already held (``agent.chat.kept``)."""
    prompt, completion = int(stats["prompt_tokens"]), int(stats["tokens"])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(stats["cached_tokens"])},
    }
