"""An OpenAI-style HTTP endpoint in front of what answers the agent's chats (``ChatAnswerer``), for any such client.

``POST /v1/chat/completions`` (streamed as server-sent events with ``"stream": true``, else one JSON
body) and ``GET /v1/models``, on loopback only, authorised by ``Authorization: Bearer TOKEN`` with the
token of the agent's endpoint file. HTTP/1.1 is parsed by h11 (sans-IO); one request per connection.
Errors are OpenAI-shaped JSON (``{"error": {"message", "type", "code"}}``) with a fitting status:
400 bad request, 401 wrong token, 404 unknown path, 413 body too large, 429 fleet busy, 503 ring
unavailable, 500 anything else. A client that disconnects cancels its answer, as on the chat endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import h11

from agent.chat.protocol import MAX_LINE_BYTES, ChatAnswerer, ChatEvent, ChatRequest
from agent.chat.watch import ClientWatch
from agent.errors import ChatProtocolError, HTTPError
from agent.transport.listen import listen_tcp
from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0
STATUS_OF = {
    "bad_request": 400,
    "bad_version": 400,
    "prompt_too_long": 400,
    "unauthorized": 401,
    "not_found": 404,
    "too_large": 413,
    "fleet_busy": 429,
    "ring_unavailable": 503,
}


class OpenAIEndpoint:
    """Serves one agent's chats over HTTP in the OpenAI chat-completions format."""

    def __init__(self, service: ChatAnswerer, listen: tuple[str, int]) -> None:
        self.service = service
        self._listen = listen
        self._server: asyncio.Server | None = None
        self._tasks = OwnedTasks()

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
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
        watch: ClientWatch | None = None
        try:
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    request, body = await _read_request(connection, reader)
                watch = ClientWatch.start(reader)  # one request per connection: nothing more comes
                await self._route(connection, writer, request, body)
            except HTTPError as exc:
                log.warning("node=%s HTTP request refused: %s: %s", self.service.node, exc.code, exc)
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _send_json(connection, writer, STATUS_OF.get(exc.code, 500), _error_body(exc.code, str(exc)))
            except (h11.RemoteProtocolError, TimeoutError) as exc:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _send_json(connection, writer, 400, _error_body("bad_request", f"bad HTTP request: {exc}"))
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
        if request.method != b"POST" or path != "/v1/chat/completions":
            raise HTTPError("not_found", f"no {request.method.decode()} {path} here: use POST /v1/chat/completions")
        chat, stream = self._chat_request(body)
        events = self.service.answer(chat)
        completion_id = f"chatcmpl-{secrets.token_hex(12)}"
        created = int(time.time())
        async with contextlib.aclosing(events):
            if stream:
                await self._stream(connection, writer, events, chat, completion_id, created, model)
            else:
                await self._whole(connection, writer, events, chat, completion_id, created, model)

    def _authorise(self, request: h11.Request) -> None:
        given = dict(request.headers).get(b"authorization", b"")
        token = self.service.token.encode()
        if not secrets.compare_digest(given, b"Bearer " + token):
            raise HTTPError("unauthorized", "missing or wrong bearer token (the token of the agent's chat.json)")

    def _chat_request(self, body: bytes) -> tuple[ChatRequest, bool]:
        """The OpenAI body as a chat request; only what shoal can honour is accepted."""
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HTTPError("bad_request", "the body is not JSON") from exc
        if not isinstance(data, dict):
            raise HTTPError("bad_request", "the body is not a JSON object")
        stream = data.pop("stream", False)
        if not isinstance(stream, bool):
            raise HTTPError("bad_request", "'stream' must be true or false")
        if data.get("n", 1) != 1:
            raise HTTPError("bad_request", "only n = 1 is supported")
        max_tokens = data.get("max_completion_tokens", data.get("max_tokens", 256))
        fields = {"token": self.service.token, "messages": data.get("messages"), "max_tokens": max_tokens}
        fields.update({name: data[name] for name in ("temperature", "top_p", "seed") if data.get(name) is not None})
        try:
            return ChatRequest.from_mapping(fields), stream
        except ChatProtocolError as exc:
            raise HTTPError("bad_request", str(exc)) from exc

    async def _whole(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        events: AsyncIterator[ChatEvent],
        chat: ChatRequest,
        completion_id: str,
        created: int,
        model: str,
    ) -> None:
        text: list[str] = []
        async for event in events:
            if event.event == "token":
                text.append(event.text)
            elif event.event == "error":
                raise HTTPError(event.code, event.text)
            else:
                tokens = int(event.stats["tokens"])
                await _send_json(
                    connection,
                    writer,
                    200,
                    {
                        "id": completion_id,
                        "object": "chat.completion",
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "".join(text)},
                                "finish_reason": _finish(tokens, chat),
                            }
                        ],
                        "usage": _usage(event.stats),
                    },
                )

    async def _stream(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        events: AsyncIterator[ChatEvent],
        chat: ChatRequest,
        completion_id: str,
        created: int,
        model: str,
    ) -> None:
        started = False

        def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        async for event in events:
            if event.event == "error" and not started:
                raise HTTPError(event.code, event.text)  # nothing sent yet: a proper status
            if not started:
                await _send(
                    writer,
                    connection.send(
                        h11.Response(
                            status_code=200,
                            headers=[
                                ("content-type", "text/event-stream"),
                                ("cache-control", "no-cache"),
                                ("connection", "close"),
                            ],
                        )
                    ),
                )
                await _send_event(connection, writer, chunk({"role": "assistant", "content": ""}))
                started = True
            if event.event == "token":
                if event.text:
                    await _send_event(connection, writer, chunk({"content": event.text}))
            elif event.event == "error":
                await _send_event(connection, writer, _error_body(event.code, event.text))
                break
            else:
                await _send_event(connection, writer, chunk({}, _finish(int(event.stats["tokens"]), chat)))
                await _send(writer, connection.send(h11.Data(data=b"data: [DONE]\n\n")))
        await _send(writer, connection.send(h11.EndOfMessage()))


def _finish(tokens: int, chat: ChatRequest) -> str:
    return "length" if tokens >= chat.max_tokens else "stop"


def _error_body(code: str, message: str) -> dict[str, Any]:
    kind = "invalid_request_error" if STATUS_OF.get(code, 500) < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code}}


async def _read_request(connection: h11.Connection, reader: asyncio.StreamReader) -> tuple[h11.Request, bytes]:
    request: h11.Request | None = None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            connection.receive_data(data)  # b"" marks the end of the stream; h11 then reports the problem
            continue
        if isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > MAX_LINE_BYTES:
                raise HTTPError("too_large", f"request body over {MAX_LINE_BYTES} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("the client closed the connection before its request was complete")


async def _send_json(
    connection: h11.Connection, writer: asyncio.StreamWriter, status: int, body: dict[str, Any]
) -> None:
    payload = json.dumps(body, ensure_ascii=False).encode()
    await _send(
        writer,
        connection.send(
            h11.Response(
                status_code=status,
                headers=[
                    ("content-type", "application/json"),
                    ("content-length", str(len(payload))),
                    ("connection", "close"),
                ],
            )
        ),
    )
    await _send(writer, connection.send(h11.Data(data=payload)))
    await _send(writer, connection.send(h11.EndOfMessage()))


async def _send_event(connection: h11.Connection, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
    await _send(writer, connection.send(h11.Data(data=data)))


async def _send(writer: asyncio.StreamWriter, data: bytes | None) -> None:
    if data:
        writer.write(data)
        await writer.drain()


def _usage(stats: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage block; ``cached_tokens``: prompt tokens a kept session already held (``agent.chat.kept``)."""
    prompt, completion = int(stats["prompt_tokens"]), int(stats["tokens"])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(stats["cached_tokens"])},
    }
