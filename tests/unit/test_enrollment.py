"""Joining with a one-time token: real TLS on 127.0.0.1, real keys, temp fleet folders."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import socket
import ssl
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.addresses import parse_address
from agent.cli.join_cmd import node_name_from_hostname
from agent.cli.main import main
from agent.errors import FleetError, PeerUnavailableError
from agent.fleet import (
    EnrollmentServer,
    JoinToken,
    NodeIdentity,
    create_token,
    enrolled_nodes,
    init_fleet,
    issue_node,
    join,
    parse_join_address,
    read_certificate,
    revoke_node,
    spki_sha256,
)
from agent.fleet.enrollment import StoredToken, check_token, load_tokens, outstanding_tokens, request_mac
from agent.transport.tls import client_context, peer_name, server_context

pytestmark = pytest.mark.timeout(30)
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="file modes are POSIX")
LOOPBACK = "127.0.0.1"
TIMEOUT = 5.0
LOGGER = "agent.fleet.enrollment"


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    init_fleet(tmp_path / "fleet", "ours")
    return tmp_path / "fleet"


@contextlib.asynccontextmanager
async def serving(fleet_dir: Path, **kwargs: object) -> AsyncIterator[tuple[EnrollmentServer, tuple[str, int]]]:
    server = EnrollmentServer(fleet_dir, (LOOPBACK, 0), "ca-pc", **kwargs)  # type: ignore[arg-type]
    address = await server.start()
    try:
        yield server, address
    finally:
        await server.stop()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- tokens -------------------------------------------------------------------------------------------------


def test_token_text_form_and_join_address(fleet: Path) -> None:
    token = create_token(fleet)
    assert len(token.token_id) == 6 and len(token.secret) == 32
    assert token.ca_hash == spki_sha256(read_certificate(fleet / "ca.pem"))
    assert JoinToken.parse(str(token)) == token
    assert str(token) == f"{token.token_id}.{token.secret}.{token.ca_hash}"
    assert parse_join_address(f"{token}@10.0.0.2:7300") == (token, ("10.0.0.2", 7300))
    assert parse_join_address(f"{token}@[fd00::2]:7301") == (token, ("fd00::2", 7301))

    with pytest.raises(FleetError, match="copied whole"):
        JoinToken.parse(f"{token.token_id}.{token.secret}")
    with pytest.raises(FleetError, match="token id"):
        JoinToken.parse(f"ABCDEF.{token.secret}.{token.ca_hash}")
    with pytest.raises(FleetError, match="secret"):
        JoinToken.parse(f"{token.token_id}.{token.secret[:-1]}.{token.ca_hash}")
    with pytest.raises(FleetError, match="CA hash"):
        JoinToken.parse(f"{token.token_id}.{token.secret}.{token.ca_hash[:-2]}")
    with pytest.raises(FleetError, match="TOKEN@HOST:PORT") as info:
        parse_join_address(str(token))
    assert token.secret not in str(info.value)  # an error message never shows the secret
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)  # --listen: any free port
    assert parse_address("[::]", default_port=7300) == ("::", 7300)
    for bad in ("host", "host:0", "host:99999", "fd00::1:7300"):
        with pytest.raises(FleetError, match="HOST:PORT"):
            parse_join_address(f"{token}@{bad}")


def test_token_store(fleet: Path) -> None:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    token = create_token(fleet, ttl=dt.timedelta(hours=2), uses=3, now=now)
    stored = load_tokens(fleet)[token.token_id]
    assert stored == StoredToken(token.token_id, token.secret, now, now + dt.timedelta(hours=2), 3)
    if sys.platform != "win32":
        assert mode(fleet / "tokens.json") == 0o600
    assert outstanding_tokens(fleet, now) == 1
    assert outstanding_tokens(fleet, now + dt.timedelta(hours=2)) == 0
    # long-expired tokens are dropped the next time the store is written
    create_token(fleet, now=now + dt.timedelta(days=30))
    assert token.token_id not in load_tokens(fleet)
    with pytest.raises(FleetError, match="at least one use"):
        create_token(fleet, uses=0)
    with pytest.raises(FleetError, match="positive"):
        create_token(fleet, ttl=dt.timedelta(0))


def test_token_needs_the_ca(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="shoal fleet init"):
        create_token(tmp_path)


def test_check_token_is_pure_and_checks_the_mac_first() -> None:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    secret = "ab" * 16
    tokens = {"abc123": StoredToken("abc123", secret, now, now + dt.timedelta(hours=1), 1)}
    csr = b"any bytes"
    good = request_mac(secret, "abc123", csr)
    assert check_token(tokens, "abc123", csr, good, now) is None
    assert "unknown join token" in (check_token(tokens, "zzz999", csr, good, now) or "")
    # a wrong MAC on an expired token: the MAC is what is reported, nothing of the token's state
    late = now + dt.timedelta(hours=2)
    assert "not signed with the secret" in (check_token(tokens, "abc123", csr, "0" * 64, late) or "")
    assert "not signed with the secret" in (check_token(tokens, "abc123", csr + b"!", good, now) or "")
    assert "expired" in (check_token(tokens, "abc123", csr, good, late) or "")
    spent = {"abc123": StoredToken("abc123", secret, now, now + dt.timedelta(hours=1), 0)}
    assert "used up" in (check_token(spent, "abc123", csr, good, now) or "")


# --- joining ------------------------------------------------------------------------------------------------


def test_join_stores_an_identity_that_works_on_the_ring(fleet: Path, tmp_path: Path) -> None:
    token = create_token(fleet)
    out = tmp_path / "joiner" / "id"
    alpha = issue_node(fleet, "alpha")

    async def main() -> tuple[NodeIdentity, float, dict[str, object]]:
        async with serving(fleet) as (server, address):
            start = time.perf_counter()
            identity = await join(address, token, "pc-new", out, ips=["10.0.0.9"], timeout=TIMEOUT)
            elapsed = time.perf_counter() - start
            status = server.status()
        await mtls_echo(alpha, identity)
        return identity, elapsed, status

    identity, elapsed, status = asyncio.run(main())
    print(f"enrollment round trip on loopback: {elapsed * 1000:.1f} ms")
    assert elapsed < 1.0
    assert status["joins"] == 1 and status["refusals"] == 0 and status["tokens_outstanding"] == 0
    assert NodeIdentity.load(out) == identity
    assert identity.name == "pc-new"
    assert identity.ca.read_bytes() == (fleet / "ca.pem").read_bytes()
    cert = identity.certificate()
    cert.verify_directly_issued_by(read_certificate(fleet / "ca.pem"))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.0.0.9"),
    ]
    assert 364 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 365
    if sys.platform != "win32":
        assert mode(identity.key) == 0o600
    assert sorted(p.name for p in out.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    entries = {e.name: e for e in enrolled_nodes(fleet)}
    assert entries["alpha"].how == "issued"
    assert entries["pc-new"].how == token.token_id
    assert entries["pc-new"].node_id == identity.node_id
    assert entries["pc-new"].fingerprint == identity.fingerprint
    assert load_tokens(fleet)[token.token_id].uses_left == 0
    # the server's short-lived certificate is never written into the fleet folder
    assert sorted(p.name for p in (fleet / "nodes").iterdir()) == ["alpha"]


async def mtls_echo(server_identity: NodeIdentity, client_identity: NodeIdentity) -> None:
    """A real mutual-TLS exchange on loopback: each side sees the other's name."""
    seen: list[str | None] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(peer_name(writer.get_extra_info("ssl_object")))
        writer.write(b"echo " + await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, LOOPBACK, 0, ssl=server_context(server_identity))
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(LOOPBACK, port, ssl=client_context(client_identity)), TIMEOUT
        )
        assert peer_name(writer.get_extra_info("ssl_object")) == server_identity.name
        writer.write(b"ping\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"echo ping\n"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert seen == [client_identity.name]


def test_the_request_carries_no_private_key_and_no_secret(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = create_token(fleet)
    lines: list[bytes] = []
    original = EnrollmentServer._reply

    async def recording(self: EnrollmentServer, peer: str, line: bytes) -> bytes:
        lines.append(line)
        return await original(self, peer, line)

    monkeypatch.setattr(EnrollmentServer, "_reply", recording)

    async def main() -> NodeIdentity:
        async with serving(fleet) as (_, address):
            return await join(address, token, "pc1", tmp_path / "id", timeout=TIMEOUT)

    identity = asyncio.run(main())
    [line] = lines
    request = json.loads(line)
    assert set(request) == {"v", "token_id", "csr", "mac"}
    key = serialization.load_pem_private_key(identity.key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    csr = base64.b64decode(request["csr"])
    for secret in (scalar, der, scalar.hex().encode(), base64.b64encode(scalar), base64.b64encode(der)):
        assert secret not in line and secret not in csr
    assert b"PRIVATE KEY" not in line
    assert token.secret.encode() not in line
    # what was sent is a CSR for the key that was kept
    request_key = x509.load_der_x509_csr(csr).public_key()
    assert request_key == key.public_key()


def join_refused(
    fleet: Path, out: Path, token: JoinToken, name: str = "pc1", first: JoinToken | None = None, **server: object
) -> tuple[str, dict[str, object]]:
    """Join (after an accepted join with ``first``, if given) and return the refusal and the server's status."""

    async def main() -> tuple[str, dict[str, object]]:
        async with serving(fleet, **server) as (srv, address):
            if first is not None:
                await join(address, first, "first", out.parent / "first", timeout=TIMEOUT)
            with pytest.raises(FleetError) as info:
                await join(address, token, name, out, timeout=TIMEOUT)
            return str(info.value), srv.status()

    return asyncio.run(main())


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("case", ["reused", "expired", "forged", "unknown"])
def test_bad_tokens_are_refused_on_both_sides(
    case: str, fleet: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = create_token(fleet)
    out = tmp_path / "id"
    server: dict[str, object] = {}
    first = None
    if case == "reused":
        first, expected = token, "used up"
    elif case == "expired":
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=25)
        server, expected = {"clock": lambda: later}, "expired"
    elif case == "forged":
        token, expected = JoinToken(token.token_id, "0" * 32, token.ca_hash), "not signed with the secret"
    else:
        token, expected = JoinToken("zz99zz", token.secret, token.ca_hash), "unknown join token"

    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, status = join_refused(fleet, out, token, first=first, **server)
    assert "refused to enroll 'pc1'" in message and expected in message
    assert "shoal fleet token" in message or "copied" in message  # says what to do
    [line] = refusal_lines(caplog)
    assert line.startswith(f"enrollment: refused {LOOPBACK}:") and expected in line
    assert status["refusals"] == 1
    assert not out.exists()  # nothing stored for a refused join


def test_a_token_for_another_fleet_is_refused_before_anything_is_sent(
    fleet: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = create_token(fleet)
    wrong = JoinToken(token.token_id, token.secret, "0" * 64)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        message, status = join_refused(fleet, tmp_path / "id", wrong)
    assert message.startswith("CA fingerprint mismatch: this is not the fleet the token names")
    [line] = refusal_lines(caplog)
    assert "closed the connection without a request" in line and LOOPBACK in line
    assert status["dropped"] == 1 and status["joins"] == 0
    assert load_tokens(fleet)[token.token_id].uses_left == 1  # nothing redeemed
    assert not (tmp_path / "id").exists()


def test_a_server_showing_a_ca_it_holds_no_certificate_of_is_refused(fleet: Path, tmp_path: Path) -> None:
    # A server of our fleet pretends to be another fleet's: it can show that CA's certificate (public), but
    # not a TLS certificate that CA issued.
    init_fleet(tmp_path / "theirs", "theirs")
    theirs = create_token(tmp_path / "theirs")

    async def main() -> str:
        async with serving(fleet) as (server, address):
            ca_pem = (tmp_path / "theirs" / "ca.pem").read_text()
            server._greeting = json.dumps({"v": 1, "ca": ca_pem}).encode() + b"\n"
            with pytest.raises(FleetError) as info:
                await join(address, theirs, "pc1", tmp_path / "id", timeout=TIMEOUT)
            return str(info.value)

    assert "not issued by it" in asyncio.run(main())
    assert not (tmp_path / "id").exists()


def test_a_name_enrolled_with_another_key_needs_revoking_first(
    fleet: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    issue_node(fleet, "pc1")
    token = create_token(fleet)
    message, _ = join_refused(fleet, tmp_path / "id", token, name="pc1")
    assert "already enrolled with another key" in message and "shoal fleet revoke pc1" in message
    assert load_tokens(fleet)[token.token_id].uses_left == 1  # a refused name does not use the token up

    revoke_node(fleet, "pc1")

    async def main() -> NodeIdentity:
        async with serving(fleet) as (_, address):
            return await join(address, token, "pc1", tmp_path / "id", timeout=TIMEOUT)

    assert asyncio.run(main()).name == "pc1"
    assert [e.how for e in enrolled_nodes(fleet) if e.name == "pc1"] == ["issued", token.token_id]


def test_invalid_name_and_ips_are_refused_locally(fleet: Path, tmp_path: Path) -> None:
    token = create_token(fleet)
    with pytest.raises(FleetError, match="invalid node name"):
        asyncio.run(join((LOOPBACK, 1), token, "bad name", tmp_path / "id"))
    with pytest.raises(FleetError, match="invalid IP address"):
        asyncio.run(join((LOOPBACK, 1), token, "pc1", tmp_path / "id", ips=["10.0.0.300"]))


def test_no_server_is_a_peer_unavailable_error_naming_the_address(fleet: Path, tmp_path: Path) -> None:
    token = create_token(fleet)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    with pytest.raises(PeerUnavailableError, match=rf"{LOOPBACK}:{port}.*serve-enrollment"):
        asyncio.run(join((LOOPBACK, port), token, "pc1", tmp_path / "id", timeout=TIMEOUT))


def test_a_malformed_request_gets_a_refusal(fleet: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> dict[str, object]:
        async with serving(fleet) as (_, address):
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*address, ssl=ctx), TIMEOUT)
            greeting = json.loads(await asyncio.wait_for(reader.readline(), TIMEOUT))
            assert set(greeting) == {"v", "ca"}
            writer.write(b'{"v": 1, "token_id": "abc123", "csr": "not base64!", "mac": "00"}\n')
            await writer.drain()
            reply: dict[str, object] = json.loads(await asyncio.wait_for(reader.readline(), TIMEOUT))
            writer.close()
            return reply

    reply = asyncio.run(main())
    assert reply["ok"] is False and "malformed request" in str(reply["reason"])
    assert any("malformed request" in line for line in refusal_lines(caplog))


# --- the command line ---------------------------------------------------------------------------------------


def test_node_name_from_hostname() -> None:
    assert node_name_from_hostname("DESKTOP-AB12.corp.example") == "desktop-ab12"
    assert node_name_from_hostname("Lab PC (3)") == "lab-pc-3"
    assert node_name_from_hostname("__") == "node"


def test_cli_token_and_join(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr("agent.cli.join_cmd.socket.gethostname", lambda: "Front-Desk.office.lan")

    async def run() -> int:
        async with serving(fleet) as (_, address):
            port = address[1]
            assert main(["fleet", "token", "--dir", str(fleet), "--ttl", "30m", "--address", f"{LOOPBACK}:{port}"]) == 0
            out = capsys.readouterr().out
            [command] = [line.strip() for line in out.splitlines() if line.strip().startswith("shoal join ")]
            assert command.endswith(f"@{LOOPBACK}:{port}") and "serve-enrollment" in out
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, main, command.split()[1:])

    assert asyncio.run(run()) == 0
    out = capsys.readouterr().out
    identity = NodeIdentity.load(tmp_path / "data" / "fleet" / "nodes" / "front-desk")
    assert identity.node_id in out and identity.fingerprint in out and "front-desk" in out

    assert main(["fleet", "token", "--dir", str(fleet), "--ttl", "soon"]) == 1
    assert "--ttl" in capsys.readouterr().err
    assert main(["join", "nonsense@127.0.0.1:1"]) == 1
    assert capsys.readouterr().err.startswith("shoal: error: a join token is")
