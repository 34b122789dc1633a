"""HTTP/1.1 over asyncio streams with h11 (sans-IO): reading one request, sending one response. The agent's HTTP
endpoints (the OpenAI-style API, the metrics endpoint) speak through these."""

from __future__ import annotations

import asyncio

import h11

from agent.errors import HTTPError


async def request_begins(connection: h11.Connection, reader: asyncio.StreamReader) -> None:
    """Wait for the first bytes of the next request (already buffered ones count); ``EOFError`` if the client
    closed its kept-alive connection instead, as pooled clients do."""
    if connection.trailing_data[0] or connection.their_state is not h11.IDLE:
        return
    data = await reader.read(65536)
    if not data:
        raise EOFError
    connection.receive_data(data)


async def read_request(
    connection: h11.Connection, reader: asyncio.StreamReader, max_body: int
) -> tuple[h11.Request, bytes]:
    """The next request and its body (``HTTPError`` ``too_large`` past ``max_body`` bytes)."""
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
            if len(body) > max_body:
                raise HTTPError("too_large", f"request body over {max_body} bytes")
        elif isinstance(event, h11.EndOfMessage):
            assert request is not None
            return request, bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("the client closed the connection before its request was complete")


async def send_body(
    connection: h11.Connection, writer: asyncio.StreamWriter, status: int, content_type: str, payload: bytes
) -> None:
    """One whole response: ``payload`` as ``content_type`` with ``status``."""
    headers = [("content-type", content_type), ("content-length", str(len(payload)))]
    await send(writer, connection.send(h11.Response(status_code=status, headers=headers)))
    await send(writer, connection.send(h11.Data(data=payload)))
    await send(writer, connection.send(h11.EndOfMessage()))


async def send(writer: asyncio.StreamWriter, data: bytes | None) -> None:
    """Write what h11 gave to send (None or nothing: nothing to write) and wait for the buffer to drain."""
    if data:
        writer.write(data)
        await writer.drain()
