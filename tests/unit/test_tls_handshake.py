"""Real mutual-TLS handshakes on 127.0.0.1 with the fleet's contexts, and socket tuning.

TLS 1.3: a client whose certificate the server refuses still completes its handshake call; the
refusal shows on its first read (measured in netlab NOTES.md section 3). Under asyncio that read
returns EOF (b"") rather than raising, so every client here reads, and the refused ones must get
nothing.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.errors import FleetError
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.transport.sockets import tune_socket
from agent.transport.tls import client_context, peer_name, server_context

TIMEOUT = 5.0
pytestmark = pytest.mark.timeout(60)


@dataclass
class Fleets:
    server: NodeIdentity  # "alpha", of the fleet
    member: NodeIdentity  # "beta", of the same fleet
    foreign: NodeIdentity  # "mallory", of another fleet (trusts only that other CA)
    fleet_ca: Path


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Fleets:
    ours, theirs = tmp_path_factory.mktemp("fleet"), tmp_path_factory.mktemp("other-fleet")
    init_fleet(ours, "ours")
    init_fleet(theirs, "theirs")
    return Fleets(issue_node(ours, "alpha"), issue_node(ours, "beta"), issue_node(theirs, "mallory"), ours / "ca.pem")


Body = Callable[[int, list[str | None]], Awaitable[None]]


async def with_server(identity: NodeIdentity, body: Body) -> list[str | None]:
    """Run a TLS server that greets each admitted client with ``hello <client CN>`` and echoes one line.

    Returns the client names the server admitted.
    """
    admitted: list[str | None] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        name = peer_name(writer.get_extra_info("ssl_object"))
        admitted.append(name)
        try:
            writer.write(f"hello {name}\n".encode())
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), TIMEOUT)
            writer.write(b"echo " + line)
            await writer.drain()
        except (ConnectionError, ssl.SSLError, TimeoutError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_context(identity))
    try:
        port = server.sockets[0].getsockname()[1]
        await asyncio.wait_for(body(port, admitted), TIMEOUT * 2)
    finally:
        server.close()
        await asyncio.wait_for(server.wait_closed(), TIMEOUT)
    return admitted


async def first_read_after_handshake(port: int, ctx: ssl.SSLContext) -> bytes:
    """Connect, complete the client-side handshake, and return the first line read (b"" on EOF)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=ctx), TIMEOUT)
    try:
        try:
            return await asyncio.wait_for(reader.readline(), TIMEOUT)
        except (ssl.SSLError, ConnectionError):
            return b""
    finally:
        writer.close()


def test_fleet_member_is_admitted_and_exchanges_bytes(fleets: Fleets) -> None:
    async def body(port: int, admitted: list[str | None]) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client_context(fleets.member)), TIMEOUT
        )
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            assert ssl_object.version() == "TLSv1.3"
            assert peer_name(ssl_object) == "alpha"
            assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"hello beta\n"
            writer.write(b"ping\n")
            await writer.drain()
            assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"echo ping\n"
        finally:
            writer.close()

    assert asyncio.run(with_server(fleets.server, body)) == ["beta"]


def test_certificate_of_another_fleet_is_refused(fleets: Fleets) -> None:
    # The client trusts our CA (so it accepts the server) but presents a certificate of another fleet.
    impostor = NodeIdentity(fleets.foreign.cert, fleets.foreign.key, fleets.fleet_ca)

    async def body(port: int, admitted: list[str | None]) -> None:
        assert await first_read_after_handshake(port, client_context(impostor)) == b""

    assert asyncio.run(with_server(fleets.server, body)) == []


def test_client_of_another_fleet_refuses_our_server(fleets: Fleets) -> None:
    async def body(port: int, admitted: list[str | None]) -> None:
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=client_context(fleets.foreign)), TIMEOUT
            )

    assert asyncio.run(with_server(fleets.server, body)) == []


def test_client_without_certificate_is_refused(fleets: Fleets) -> None:
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    bare.load_verify_locations(cafile=str(fleets.fleet_ca))

    async def body(port: int, admitted: list[str | None]) -> None:
        assert await first_read_after_handshake(port, bare) == b""

    assert asyncio.run(with_server(fleets.server, body)) == []


def test_plain_tcp_client_gets_nothing(fleets: Fleets) -> None:
    async def body(port: int, admitted: list[str | None]) -> None:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        writer.write(b"hello?\n")
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(100), TIMEOUT)
        except ConnectionError:
            data = b""
        writer.close()
        assert b"hello" not in data

    assert asyncio.run(with_server(fleets.server, body)) == []


def test_contexts_settings(fleets: Fleets) -> None:
    for ctx in (server_context(fleets.server), client_context(fleets.server)):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        # Only the fleet CA is trusted.
        assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "ours fleet CA"),),)]
    assert client_context(fleets.server).check_hostname is False


def test_bad_identity_files_are_fleet_errors(fleets: Fleets, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not PEM")
    wrong_key = NodeIdentity(fleets.server.cert, fleets.member.key, fleets.fleet_ca)
    with pytest.raises(FleetError, match="not a matching pair"):
        server_context(wrong_key)
    with pytest.raises(FleetError, match="node certificate"):
        client_context(NodeIdentity(garbage, fleets.server.key, fleets.fleet_ca))
    with pytest.raises(FleetError, match="fleet CA certificate"):
        client_context(NodeIdentity(fleets.server.cert, fleets.server.key, garbage))
    with pytest.raises(FleetError):
        server_context(NodeIdentity(tmp_path / "absent.pem", fleets.server.key, fleets.fleet_ca))


def test_peer_name_without_handshake() -> None:
    assert peer_name(None) is None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ssl_object = ctx.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="x")
    assert peer_name(ssl_object) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads back Linux-only options")
def test_tune_socket_sets_liveness_options() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname(), timeout=TIMEOUT) as client,
    ):
        tune_socket(client, user_timeout_ms=2500, keepalive_idle=2, keepalive_interval=1, keepalive_count=4)
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 2500
        listener.accept()[0].close()


def test_tune_socket_on_asyncio_transport_and_non_tcp() -> None:
    async def run() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tune_socket(writer.get_extra_info("socket"))
            writer.close()

        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
        sock = writer.get_extra_info("socket")
        tune_socket(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
        writer.close()
        server.close()
        await asyncio.wait_for(server.wait_closed(), TIMEOUT)

    asyncio.run(run())
    if hasattr(socket, "AF_UNIX"):
        a, b = socket.socketpair()
        with a, b:
            tune_socket(a)  # not TCP: left alone, no error
    with socket.socket() as fresh, pytest.raises(ValueError):
        tune_socket(fresh, keepalive_idle=0)
