"""Acceptance 5: refused peers and malformed frames, against a running agent.

A peer without a fleet certificate is refused and logged with its address; a frame with a bad
length, a wrong version or an unknown type closes that connection only; an oversized frame is
refused from its header, before the agent buffers its payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agent.errors import PeerUnavailableError
from agent.transport.connection import dial, expect
from agent.transport.tls import client_context
from agent.wire import FrameDecoder, FrameType, encode_frame
from agent.wire.frames import HEADER, MAGIC, PROTOCOL_VERSION
from agent.wire.messages import Hello
from shards.manifest import Manifest
from tests.integration.ring_lab import AgentProcess, Fleet, free_port, start_agent, status, wait_for
from tests.integration.test_ring import _client, _generate

pytestmark = pytest.mark.processes


def _protocol_errors(agent: AgentProcess) -> int:
    return sum("protocol error" in line for line in agent.log)


def _refusals(agent: AgentProcess) -> int:
    return sum("refused peer 127.0.0.1:" in line for line in agent.log)


async def _hello(address: tuple[str, int], context: ssl.SSLContext, export_id: str) -> None:
    connection = await dial(*address, context)
    try:
        await connection.send(Hello(node="intruder", role="head", export_id=export_id, head_id=7).to_frame())
        await expect(connection, FrameType.HELLO, 10)
    finally:
        connection.abort()


def test_peer_from_another_ca_is_refused_and_logged(ring3: list[AgentProcess], fleet: Fleet) -> None:
    agent = ring3[0]
    export_id = str(status(agent.address, fleet.identity("head"))["export_id"])
    before = _refusals(agent)
    foreign = client_context(fleet.foreign_identity("impostor"))
    with pytest.raises(PeerUnavailableError):
        asyncio.run(_hello(agent.address, foreign, export_id))
    wait_for(lambda: _refusals(agent) > before, 10, "the refusal in the agent's log")


def test_successor_from_another_ca_is_refused_and_logged_by_the_dialling_stage(
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
) -> None:
    """A stage whose next stage shows another CA's certificate warns, with its address, and never relays."""
    folder = exported(2, "fp32")
    port = free_port()
    impostor = start_agent(
        folder, 1, fleet.foreign_identity("impostor1"), cache_dir, extra=["--listen", f"127.0.0.1:{port}"]
    )
    dialler = start_agent(folder, 0, fleet.identity("dialler0"), cache_dir, next_address=("127.0.0.1", port))
    try:
        wait_for(
            lambda: any(f"refused next stage 127.0.0.1:{port}" in line and "WARNING" in line for line in dialler.log),
            20,
            "the dialling stage's warning",
        )
        assert status(dialler.address, fleet.identity("observer"))["next_stage"] == "down"
    finally:
        dialler.stop()
        impostor.stop()


def test_peer_without_certificate_is_refused_and_logged(ring3: list[AgentProcess], fleet: Fleet) -> None:
    agent = ring3[0]
    before = _refusals(agent)
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.minimum_version = ssl.TLSVersion.TLSv1_3
    anonymous.check_hostname = False
    anonymous.load_verify_locations(fleet.identity("head").ca)  # it trusts the agent, but has no certificate
    with pytest.raises(PeerUnavailableError):
        asyncio.run(_hello(agent.address, anonymous, "x"))
    wait_for(lambda: _refusals(agent) > before, 10, "the refusal in the agent's log")


def _header(
    type_: int = FrameType.STATUS_REQUEST,
    version: int = PROTOCOL_VERSION,
    dtype: int = 0,
    ndim: int = 0,
    dims: tuple[int, int, int, int] = (0, 0, 0, 0),
    size: int = 0,
) -> bytes:
    return HEADER.pack(MAGIC, version, type_, 0, 0, 0, 0, 0, 0, dtype, ndim, *dims, size)


BAD_FRAMES = {
    "wrong version": _header(version=PROTOCOL_VERSION + 1),
    "unknown type": _header(type_=200),
    # 10 float32 values declared, 12 bytes of payload
    "bad length": _header(type_=FrameType.STEP, dtype=5, ndim=1, dims=(10, 0, 0, 0), size=12) + bytes(12),
    "not a frame": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(40),
}


async def _send_raw_after_hello(address: tuple[str, int], context: ssl.SSLContext, export_id: str, raw: bytes) -> float:
    """Send ``raw`` on a good connection; return how long the agent took to close it."""
    reader, writer = await asyncio.open_connection(*address, ssl=context, server_hostname=address[0])
    try:
        for part in encode_frame(Hello(node="fuzzer", role="head", export_id=export_id, head_id=9).to_frame()):
            writer.write(part)
        decoder = FrameDecoder()
        while (frame := decoder.next_frame()) is None:
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "the agent closed the connection before answering HELLO"
            decoder.receive_data(data)
        assert frame.type is FrameType.HELLO
        loop = asyncio.get_running_loop()
        sent = loop.time()
        writer.write(raw)
        with contextlib.suppress(ConnectionError, ssl.SSLError):  # the agent may close before taking it all
            await writer.drain()
        while True:  # the agent must close the connection without waiting for more bytes
            try:
                data = await asyncio.wait_for(reader.read(65536), 10)
            except (ConnectionError, ssl.SSLError):
                break
            if not data:
                break
        return loop.time() - sent
    finally:
        writer.transport.abort()


@pytest.fixture(scope="module")
def alone(
    ring3: list[AgentProcess], exported: Callable[..., Path], fleet: Fleet, chat_ids: list[list[int]]
) -> list[int]:
    """16 greedy tokens of the first prompt through ring3, nobody else connected."""

    async def run() -> list[int]:
        client = _client(exported(3, "fp32"), ring3, fleet.identity("head"))
        await client.connect()
        try:
            return await _generate(client, chat_ids[0], n=16)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.parametrize("case", list(BAD_FRAMES))
def test_malformed_frame_closes_only_that_connection(
    case: str,
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    chat_ids: list[list[int]],
    alone: list[int],
) -> None:
    agent = ring3[0]
    folder = exported(3, "fp32")
    identity = fleet.identity("head")
    manifest = Manifest.load(folder)
    errors_before = _protocol_errors(agent)

    async def run() -> tuple[list[int], float]:
        client = _client(folder, ring3, identity)
        await client.connect()
        try:
            # a well-behaved session runs while a broken peer is thrown out
            together, closed_after = await asyncio.gather(
                _generate(client, chat_ids[0], n=16),
                _send_raw_after_hello(agent.address, client_context(identity), manifest.export_id, BAD_FRAMES[case]),
            )
            return together, closed_after
        finally:
            await client.close()

    together, closed_after = asyncio.run(run())
    assert together == alone
    assert closed_after < 5
    wait_for(lambda: _protocol_errors(agent) > errors_before, 10, "this connection's protocol error in the log")
    assert agent.process.poll() is None


def test_oversized_frame_is_refused_before_allocation(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
) -> None:
    agent = ring3[0]
    identity = fleet.identity("head")
    export_id = Manifest.load(exported(3, "fp32")).export_id
    rss_before = psutil.Process(agent.process.pid).memory_info().rss
    # announces a 1 GiB float32 payload (over the 64 MiB cap) and sends the first 48 MiB of it: an agent that
    # took the header would buffer them (or a zeroed 1 GiB, which stays unmapped until written)
    count = (1 << 30) // 4
    raw = _header(type_=FrameType.STEP, dtype=5, ndim=1, dims=(count, 0, 0, 0), size=count * 4)
    raw += bytes(48 << 20)
    closed_after = asyncio.run(_send_raw_after_hello(agent.address, client_context(identity), export_id, raw))
    assert closed_after < 5, "the agent waited for the payload instead of refusing the header"
    grown = psutil.Process(agent.process.pid).memory_info().rss - rss_before
    assert grown < 24 << 20, f"the agent's memory grew by {grown >> 20} MiB"
    assert any("exceeds the" in line and "cap" in line for line in agent.log)
