"""``FrameConnection`` and ``dial`` on 127.0.0.1: frames in order, an end of stream without a goodbye is a
failure (never a clean close), and a TLS refusal is told apart from a peer that cannot be reached."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from agent.errors import PeerRefusedError, PeerUnavailableError, RemoteProtocolError
from agent.fleet import init_fleet, issue_node
from agent.transport.connection import FrameConnection, dial
from agent.transport.tls import client_context, server_context
from agent.wire import Frame, FrameType, encode_frame
from tests.integration.ring_lab import free_port
from tests.support.stream_server import serving

pytestmark = pytest.mark.timeout(60)

Peer = Callable[[asyncio.StreamWriter], Awaitable[None]]
STEP = Frame.tensor(FrameType.STEP, np.arange(6, dtype=np.int32).reshape(1, 6), session=7, step=3, count=6)


def _raw(frame: Frame) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame))


async def _receive_from(peer: Peer, *, max_payload: int = 1 << 20) -> tuple[list[Frame], BaseException | None]:
    """Frames a FrameConnection receives from a plain-TCP peer that writes, then does ``peer``'s ending."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await peer(writer)

    frames: list[Frame] = []
    failure: BaseException | None = None
    async with serving(handler) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        connection = FrameConnection(reader, writer, max_payload=max_payload, label="test peer")
        try:
            while True:
                frame = await asyncio.wait_for(connection.receive(), 10)
                frames.append(frame)
                if frame.type is FrameType.GOODBYE:
                    break
        except (PeerUnavailableError, RemoteProtocolError) as exc:
            failure = exc
        finally:
            connection.abort()
    return frames, failure


def test_an_end_of_stream_without_goodbye_fails_after_the_frames_before_it() -> None:
    async def peer(writer: asyncio.StreamWriter) -> None:
        writer.write(_raw(STEP) + _raw(STEP))
        await writer.drain()
        writer.close()

    frames, failure = asyncio.run(_receive_from(peer))
    assert [f.step for f in frames] == [3, 3]
    assert frames[0].array().tolist() == [[0, 1, 2, 3, 4, 5]]
    assert isinstance(failure, PeerUnavailableError)
    assert "without a goodbye" in str(failure)


def test_a_goodbye_is_a_clean_end() -> None:
    async def peer(writer: asyncio.StreamWriter) -> None:
        writer.write(_raw(STEP) + _raw(Frame(FrameType.GOODBYE)))
        await writer.drain()
        writer.close()

    frames, failure = asyncio.run(_receive_from(peer))
    assert [f.type for f in frames] == [FrameType.STEP, FrameType.GOODBYE]
    assert failure is None


def test_a_stream_cut_inside_a_frame_is_a_failure() -> None:
    async def peer(writer: asyncio.StreamWriter) -> None:
        writer.write(_raw(STEP)[:-5])
        await writer.drain()
        writer.close()

    frames, failure = asyncio.run(_receive_from(peer))
    assert frames == []
    assert isinstance(failure, PeerUnavailableError)


def test_a_frame_over_the_cap_is_a_protocol_error() -> None:
    async def peer(writer: asyncio.StreamWriter) -> None:
        big = Frame.tensor(FrameType.STEP, np.zeros((1, 64, 64), dtype=np.float32))
        writer.write(_raw(big))
        await writer.drain()
        await asyncio.sleep(5)  # keeps the stream open: only the header may end it

    frames, failure = asyncio.run(_receive_from(peer, max_payload=4096))
    assert frames == []
    assert isinstance(failure, RemoteProtocolError)


def test_dial_tells_a_refusal_from_an_unreachable_peer(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    init_fleet(ours, "ours")
    init_fleet(theirs, "theirs")
    server_identity, stranger = issue_node(ours, "alpha"), issue_node(theirs, "mallory")

    async def run() -> tuple[BaseException, BaseException]:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context(server_identity))
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(PeerRefusedError, match="TLS handshake failed") as refused:
                await dial("127.0.0.1", port, client_context(stranger), label="next stage")
        finally:
            server.close()
            await server.wait_closed()
        with pytest.raises(PeerUnavailableError) as unreachable:
            await dial("127.0.0.1", free_port(), client_context(stranger), timeout=2.0)
        return refused.value, unreachable.value

    refused, unreachable = asyncio.run(run())
    assert "next stage" in str(refused)
    assert not isinstance(unreachable, PeerRefusedError)
