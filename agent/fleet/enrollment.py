"""Joining the fleet with a one-time token, as ``kubeadm join`` does, without copying identity folders around.

On the PC that holds the fleet CA, ``shoal fleet token`` makes a token and ``shoal fleet serve-enrollment``
listens; on the new PC, ``shoal join TOKEN@HOST:PORT`` makes a key, sends a certificate request and stores
the certificate it gets back. A token is ``<token_id>.<secret>.<ca_hash>``:

- ``token_id`` (6 characters) names the token in ``<fleet dir>/tokens.json``;
- ``secret`` (32 hex digits) never crosses the wire: it keys an HMAC of the request, which proves that the
  joiner holds the token without handing it to whoever listens;
- ``ca_hash`` pins the fleet CA (the sha256 of its public key): the joiner checks the server before it
  sends anything, so a token cannot be phished by a server of another fleet.

The protocol, over TLS 1.3 (the server presents a short-lived certificate of the fleet CA, made in memory at
start; the client cannot verify it before it knows the CA, so it checks it by hand), one JSON line each::

    server -> client   {"v": 1, "ca": "<fleet CA PEM>"}
                       the client checks spki_sha256(ca) == ca_hash and that the server's TLS
                       certificate was issued by that CA; it hangs up otherwise
    client -> server   {"v": 1, "token_id": "...", "csr": "<base64 DER>", "mac": "<hex>"}
                       mac = HMAC-SHA256(key=bytes.fromhex(secret), msg=token_id || csr DER)
    server -> client   {"v": 1, "ok": true, "cert": "<PEM>", "ca": "<PEM>"}
                    or {"v": 1, "ok": false, "reason": "..."}

The joiner's private key never leaves its PC. The node name is the CSR's common name, and the IP
addresses it asks for are the CSR's IP SANs, so the MAC covers them too. A token is used up only when a
certificate is issued: a joiner refused for its name can try again with another.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import ssl
import string
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.addresses import format_address, parse_address
from agent.errors import ConfigError, FleetError, PeerUnavailableError, ShoalError
from agent.files import folder_lock, make_dir, parse_utc, read_json, utc_iso, write_atomic, write_json
from agent.fleet.authority import (
    EnrolledNode,
    FleetPaths,
    NodeIdentity,
    common_name,
    enrolled_nodes,
    key_pem,
    load_ca,
    namesakes,
    node_certificate,
    node_id_of_key,
    record_enrollment,
    sign_certificate,
    spki_sha256,
    validate_node_name,
)
from agent.fleet.revocation import load_revocations
from agent.wire.jsonbody import loads_json

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
DEFAULT_PORT = 7300
"""Where ``shoal fleet serve-enrollment`` listens unless told otherwise."""
MAX_LINE = 64 * 1024
"""Longest protocol line either side reads (a CSR is about 400 bytes, a certificate about 1 KiB)."""
DEFAULT_TTL = dt.timedelta(hours=24)
MAX_IPS = 16
"""IP SANs a joiner may ask for."""
SERVER_CERT_LIFETIME = dt.timedelta(hours=24)
"""The enrollment server's own certificate; it is made afresh every half of this while the server runs."""
KEEP_SPENT = dt.timedelta(days=7)
"""Expired tokens stay in ``tokens.json`` this long, so that a late joiner hears "expired", not "unknown"."""

_TOKEN_ID_RE = re.compile(r"[a-z0-9]{6}")
_SECRET_RE = re.compile(r"[0-9a-f]{32}")
_CA_HASH_RE = re.compile(r"[0-9a-f]{64}")
_MAC_RE = re.compile(r"[0-9a-f]{64}")
_TOKEN_ID_ALPHABET = string.ascii_lowercase + string.digits

Clock = Callable[[], dt.datetime]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class JoinToken:
    """What a joiner needs: which token, its secret, and the fleet CA it must find at the other end."""

    token_id: str
    secret: str
    ca_hash: str
    """Hex sha256 of the fleet CA's public key (``authority.spki_sha256``)."""

    def __post_init__(self) -> None:
        if not _TOKEN_ID_RE.fullmatch(self.token_id):
            raise FleetError(f"invalid join token id {self.token_id!r}: expected 6 lowercase letters or digits")
        if not _SECRET_RE.fullmatch(self.secret):
            raise FleetError("invalid join token secret: expected 32 lowercase hex digits")
        if not _CA_HASH_RE.fullmatch(self.ca_hash):
            raise FleetError("invalid join token CA hash: expected 64 lowercase hex digits")

    @classmethod
    def parse(cls, text: str) -> JoinToken:
        """``<token_id>.<secret>.<ca_hash>`` -> the token; :class:`FleetError` if it is not one."""
        parts = text.strip().split(".")
        if len(parts) != 3:
            raise FleetError(
                "a join token is <id>.<secret>.<ca hash> (6, 32 and 64 characters, as `shoal fleet token` "
                "prints it): check that it was copied whole"
            )
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.token_id}.{self.secret}.{self.ca_hash}"

    def mac(self, csr_der: bytes) -> str:
        """The request's MAC: hex HMAC-SHA256 keyed by the secret, of ``token_id || csr_der``."""
        return request_mac(self.secret, self.token_id, csr_der)


def request_mac(secret: str, token_id: str, csr_der: bytes) -> str:
    """Hex ``HMAC-SHA256(key=bytes.fromhex(secret), msg=token_id.encode() || csr_der)``."""
    return hmac.new(bytes.fromhex(secret), token_id.encode() + csr_der, hashlib.sha256).hexdigest()


def parse_join_address(text: str) -> tuple[JoinToken, tuple[str, int]]:
    """``TOKEN@HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> the token and the enrollment server's address."""
    token_text, sep, address = text.strip().rpartition("@")
    if not sep:
        raise FleetError(f"expected TOKEN@HOST:PORT (as `shoal fleet token` prints it), not {_redact(text)!r}")
    try:
        return JoinToken.parse(token_text), parse_address(address, any_port=False, empty_host=None)
    except ConfigError as exc:  # the token's address is the token's trouble
        raise FleetError(str(exc)) from exc


def _redact(text: str) -> str:
    # An error message may end up in a log or a screenshot: never echo a token's secret.
    return re.sub(r"\b([a-z0-9]{6})\.[0-9a-f]+", r"\1.<secret>", text)


# --- the token store: <fleet dir>/tokens.json ----------------------------------------------------------------


@dataclass(frozen=True)
class StoredToken:
    """A token as the fleet folder keeps it."""

    token_id: str
    secret: str
    created: dt.datetime
    expires: dt.datetime
    uses_left: int

    def outstanding(self, now: dt.datetime) -> bool:
        return self.uses_left > 0 and now < self.expires

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.token_id,
            "secret": self.secret,
            "created": utc_iso(self.created),
            "expires": utc_iso(self.expires),
            "uses_left": self.uses_left,
        }

    @classmethod
    def from_json(cls, item: object, where: Path) -> StoredToken:
        if not (
            isinstance(item, dict)
            and all(isinstance(item.get(k), str) for k in ("id", "secret", "created", "expires"))
            and isinstance(item.get("uses_left"), int)
        ):
            raise FleetError(f"{where} is malformed (a token is not id, secret, created, expires, uses_left)")
        return cls(
            item["id"],
            item["secret"],
            parse_utc(item["created"], where),
            parse_utc(item["expires"], where),
            item["uses_left"],
        )


def load_tokens(fleet_dir: Path) -> dict[str, StoredToken]:
    """The tokens in ``<fleet_dir>/tokens.json`` by id (none if the file is absent)."""
    path = FleetPaths(Path(fleet_dir)).tokens
    doc = read_json(path)
    if doc is None:
        return {}
    items = doc.get("tokens") if doc.get("schema") == 1 else None
    if not isinstance(items, list):
        raise FleetError(f"{path} is malformed (expected schema 1 and a list of tokens)")
    tokens = (StoredToken.from_json(item, path) for item in items)
    return {t.token_id: t for t in tokens}


def _write_tokens(fleet_dir: Path, tokens: Iterable[StoredToken], now: dt.datetime) -> None:
    kept = [t.to_json() for t in tokens if now < t.expires + KEEP_SPENT]
    # 0600: the secrets are in there (the server needs them to check a request's MAC).
    write_json(FleetPaths(Path(fleet_dir)).tokens, {"schema": 1, "tokens": kept}, private=True)


def create_token(
    fleet_dir: Path, ttl: dt.timedelta = DEFAULT_TTL, uses: int = 1, now: dt.datetime | None = None
) -> JoinToken:
    """Make a join token valid for ``ttl`` and ``uses`` joins, and store it in ``<fleet_dir>/tokens.json``.

    Needs the CA key: tokens are redeemed where it is (``shoal fleet serve-enrollment``).
    """
    if ttl <= dt.timedelta(0):
        raise FleetError(f"a token's lifetime must be positive, not {ttl}")
    if uses < 1:
        raise FleetError(f"a token must allow at least one use, not {uses}")
    now = (now if now is not None else _utcnow()).replace(microsecond=0)
    _, ca_cert = load_ca(fleet_dir)
    with folder_lock(fleet_dir):
        tokens = load_tokens(fleet_dir)
        token_id = _new_token_id(tokens)
        token = JoinToken(token_id, secrets.token_hex(16), spki_sha256(ca_cert))
        tokens[token_id] = StoredToken(token_id, token.secret, now, now + ttl, uses)
        _write_tokens(fleet_dir, tokens.values(), now)
    return token


def _new_token_id(taken: Mapping[str, object]) -> str:
    while True:
        token_id = "".join(secrets.choice(_TOKEN_ID_ALPHABET) for _ in range(6))
        if token_id not in taken:
            return token_id


def outstanding_tokens(fleet_dir: Path, now: dt.datetime | None = None) -> int:
    """Tokens that can still be redeemed."""
    when = now if now is not None else _utcnow()
    return sum(t.outstanding(when) for t in load_tokens(fleet_dir).values())


# --- redeeming a token ---------------------------------------------------------------------------------------


def check_token(
    tokens: Mapping[str, StoredToken], token_id: str, csr_der: bytes, mac: str, now: dt.datetime
) -> str | None:
    """Why a request may not redeem ``token_id``, or None if it may. Pure: nothing is used up here.

    The MAC is checked before the token's state, so that one who lacks the secret learns nothing of it.
    """
    token = tokens.get(token_id)
    if token is None:
        return f"unknown join token {token_id!r}: make one with `shoal fleet token` where the fleet CA is"
    expected = request_mac(token.secret, token_id, csr_der)
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        return f"the request is not signed with the secret of join token {token_id!r}: check the whole token was copied"
    if now >= token.expires:
        return f"join token {token_id!r} expired at {utc_iso(token.expires)}: make a new one with `shoal fleet token`"
    if token.uses_left <= 0:
        return f"join token {token_id!r} is used up: make a new one with `shoal fleet token`"
    return None


@dataclass(frozen=True)
class NodeRequest:
    """What a verified CSR asks for."""

    name: str
    public_key: ec.EllipticCurvePublicKey
    ips: tuple[str, ...]


def read_csr(csr_der: bytes) -> NodeRequest:
    """The node name, key and IP addresses a CSR asks for; :class:`FleetError` if it is not a valid one."""
    try:
        csr = x509.load_der_x509_csr(csr_der)
    except ValueError as exc:
        raise FleetError("the certificate request is not a DER-encoded CSR") from exc
    try:
        return _read_csr(csr)
    except ValueError as exc:  # cryptography parses a CSR's fields when they are first read
        raise FleetError(f"the certificate request is malformed: {exc}") from exc


def _read_csr(csr: x509.CertificateSigningRequest) -> NodeRequest:
    if not csr.is_signature_valid:
        raise FleetError("the certificate request's signature does not verify")
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or not isinstance(names[0].value, str):
        raise FleetError("the certificate request names no node (it needs exactly one common name)")
    name = validate_node_name(names[0].value)
    public_key = csr.public_key()
    if not (isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(public_key.curve, ec.SECP256R1)):
        raise FleetError("the certificate request's key is not EC P-256")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        ips = ()
    if len(ips) > MAX_IPS:
        raise FleetError(f"the certificate request asks for {len(ips)} IP addresses; at most {MAX_IPS}")
    return NodeRequest(name, public_key, ips)


def name_conflict(
    enrolled: Iterable[EnrolledNode], revoked: Callable[[str], bool], name: str, node_id: str
) -> str | None:
    """Why ``name`` may not be enrolled for the key ``node_id``, or None. ``revoked(fingerprint)`` tells a
    revoked certificate. The same key may enroll again (a renewal); another key only once the name's
    certificates are all revoked."""
    others = namesakes(enrolled, revoked, name, node_id)
    if others:
        return (
            f"the name {name!r} is already enrolled with another key (node id {others[-1].node_id}): revoke it "
            f"first (`shoal fleet revoke {name}` where the fleet CA is) or join with another --name"
        )
    return None


@dataclass(frozen=True)
class Issued:
    """A redeemed token: the new node certificate and the CA that signed it."""

    cert: x509.Certificate
    ca: x509.Certificate
    node: EnrolledNode


@dataclass(frozen=True)
class Refused:
    """A request that was not granted, and why (sent to the joiner as it is)."""

    reason: str


def redeem(
    fleet_dir: Path, token_id: str, csr_der: bytes, mac: str, now: dt.datetime | None = None, days: int = 365
) -> Issued | Refused:
    """Check a join request against ``<fleet_dir>``'s tokens, issue its certificate, use the token up by one
    and record the node in ``enrolled.json``. Blocking (files, signing): run it off the event loop.

    Problems of the fleet folder itself (no CA key, a malformed file) raise :class:`FleetError`; everything
    the joiner got wrong is a :class:`Refused`.
    """
    now = now if now is not None else _utcnow()
    ca_key, ca_cert = load_ca(fleet_dir)
    paths = FleetPaths(Path(fleet_dir))
    with folder_lock(paths.root):
        tokens = load_tokens(paths.root)
        reason = check_token(tokens, token_id, csr_der, mac, now)
        if reason is not None:
            return Refused(reason)
        try:
            request = read_csr(csr_der)
        except FleetError as exc:
            return Refused(str(exc))
        revocations = load_revocations(paths.revocations, ca_cert)
        node_id = node_id_of_key(request.public_key)
        if revocations is not None and revocations.revokes_node(node_id):
            return Refused(f"this key (node id {node_id}) has been revoked: join with a new key")
        reason = name_conflict(
            enrolled_nodes(paths.root),
            revocations.revokes if revocations is not None else lambda _: False,
            request.name,
            node_id,
        )
        if reason is not None:
            return Refused(reason)
        cert = node_certificate(ca_key, ca_cert, request.public_key, request.name, request.ips, days=days, now=now)
        token = tokens[token_id]
        tokens[token_id] = replace(token, uses_left=token.uses_left - 1)
        _write_tokens(paths.root, tokens.values(), now)
        entry = record_enrollment(paths.root, cert, token_id, now)
    return Issued(cert, ca_cert, entry)


# --- the enrollment server -----------------------------------------------------------------------------------


class EnrollmentServer:
    """Redeems join tokens over TLS where the fleet CA is; a part of an agent (``name``, ``start``, ``stop``,
    ``status``) or run alone by ``shoal fleet serve-enrollment``."""

    name = "enrollment"

    def __init__(
        self,
        fleet_dir: Path,
        listen: tuple[str, int] = ("0.0.0.0", DEFAULT_PORT),
        node: str = "",
        *,
        clock: Clock = _utcnow,
        timeout: float = 10.0,
    ) -> None:
        """``node``: this PC's node name, shown in the server certificate; ``clock``: the time tokens are
        checked against; ``timeout``: how long one joiner may take to send its request."""
        self.fleet_dir = Path(fleet_dir)
        self.listen = listen
        self.node = node
        self._clock = clock
        self._timeout = timeout
        self._server: asyncio.Server | None = None
        self._context: ssl.SSLContext | None = None
        self._address: tuple[str, int] | None = None
        self._greeting = b""
        self._handlers: set[asyncio.Task[None]] = set()
        self._renewal: asyncio.Task[None] | None = None
        self._outstanding = 0
        self.joins = 0
        self.refusals = 0
        self.dropped = 0
        """Connections that ended without a request: a joiner whose token names another fleet hangs up."""

    async def start(self) -> tuple[str, int]:
        """Make the server certificate, listen, and return the bound address."""
        loop = asyncio.get_running_loop()
        context, ca_pem = await loop.run_in_executor(None, self._make_context)
        self._context = context
        self._greeting = _line({"v": PROTOCOL_VERSION, "ca": ca_pem.decode()})
        self._outstanding = await loop.run_in_executor(None, outstanding_tokens, self.fleet_dir, self._clock())
        host, port = self.listen
        try:
            self._server = await asyncio.start_server(
                self._handle, host, port, ssl=context, limit=MAX_LINE, ssl_handshake_timeout=self._timeout
            )
        except OSError as exc:
            raise FleetError(f"cannot listen on {format_address(self.listen)} for enrollment: {exc}") from exc
        bound = self._server.sockets[0].getsockname()
        self._address = (str(bound[0]), int(bound[1]))
        self._renewal = asyncio.create_task(self._renew_certificate())
        log.info("enrollment: listening on %s for fleet %s", format_address(self._address), self.fleet_dir)
        return self._address

    async def stop(self) -> None:
        """Stop listening and end the joins in progress."""
        tasks = [t for t in (self._renewal, *self._handlers) if t is not None]
        if self._server is not None:
            self._server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        self._renewal = None

    def status(self) -> dict[str, Any]:
        """Address, tokens outstanding (as of the last join request), joins served and refusals."""
        return {
            "address": format_address(self._address) if self._address else None,
            "tokens_outstanding": self._outstanding,
            "joins": self.joins,
            "refusals": self.refusals,
            "dropped": self.dropped,
        }

    def _make_context(self) -> tuple[ssl.SSLContext, bytes]:
        ca_key, ca_cert = load_ca(self.fleet_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.num_tickets = 0
        _load_server_certificate(ctx, ca_key, ca_cert, self.node, self._clock())
        return ctx, ca_cert.public_bytes(serialization.Encoding.PEM)

    async def _renew_certificate(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SERVER_CERT_LIFETIME.total_seconds() / 2)
            try:
                ca_key, ca_cert = await loop.run_in_executor(None, load_ca, self.fleet_dir)
                if self._context is not None:
                    ctx, now = self._context, self._clock()
                    await loop.run_in_executor(None, _load_server_certificate, ctx, ca_key, ca_cert, self.node, now)
            except FleetError as exc:
                log.warning("enrollment: cannot renew the server certificate: %s", exc)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        peer = _peer(writer)
        try:
            await self._serve(peer, reader, writer)
        except (ConnectionError, ssl.SSLError, TimeoutError) as exc:
            self.dropped += 1
            log.warning("enrollment: %s dropped: %s", peer, exc or type(exc).__name__)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self._greeting)
        await writer.drain()
        try:
            line = await asyncio.wait_for(reader.readline(), self._timeout)
        except ValueError:  # longer than the reader's limit
            reply = self._refuse(peer, f"request line longer than {MAX_LINE} bytes")
        else:
            if not line:
                self.dropped += 1
                log.warning(
                    "enrollment: %s closed the connection without a request (its token may name another fleet)", peer
                )
                return
            reply = await self._reply(peer, line)
        writer.write(reply)
        await writer.drain()

    async def _reply(self, peer: str, line: bytes) -> bytes:
        """The reply line to one request line."""
        try:
            token_id, csr_der, mac = _parse_request(line)
        except FleetError as exc:
            return self._refuse(peer, str(exc))
        loop = asyncio.get_running_loop()
        now = self._clock()
        try:
            result = await loop.run_in_executor(None, redeem, self.fleet_dir, token_id, csr_der, mac, now)
            self._outstanding = await loop.run_in_executor(None, outstanding_tokens, self.fleet_dir, now)
        except FleetError as exc:  # the fleet folder's own trouble: say so on both sides
            log.error("enrollment: cannot serve %s: %s", peer, exc)
            return self._refuse(peer, f"the enrollment server cannot issue certificates: {exc}", logged=True)
        except Exception:  # our bug: the joiner hears of it, the server goes on
            log.exception("enrollment: failed to serve %s", peer)
            return self._refuse(peer, "internal error of the enrollment server (see its log)", logged=True)
        if isinstance(result, Refused):
            return self._refuse(peer, result.reason)
        self.joins += 1
        log.info(
            "enrollment: enrolled %s (node id %s) from %s with token %s",
            result.node.name,
            result.node.node_id,
            peer,
            token_id,
        )
        pem = serialization.Encoding.PEM
        return _line(
            {
                "v": PROTOCOL_VERSION,
                "ok": True,
                "cert": result.cert.public_bytes(pem).decode(),
                "ca": result.ca.public_bytes(pem).decode(),
            }
        )

    def _refuse(self, peer: str, reason: str, logged: bool = False) -> bytes:
        self.refusals += 1
        if not logged:
            log.warning("enrollment: refused %s: %s", peer, reason)
        return _line({"v": PROTOCOL_VERSION, "ok": False, "reason": reason})


def _load_server_certificate(
    ctx: ssl.SSLContext, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, node: str, now: dt.datetime
) -> None:
    """Make a fresh server certificate and key and load them into ``ctx`` (later handshakes present it).

    Its common name is not a valid node name and it is for server auth only, so it can never pass for a
    ring member's client certificate. The key lives only in this process: ``ssl`` loads keys from files
    alone, so it passes through a private temporary folder that is removed at once.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    label = f"shoal enrollment ({node})" if node else "shoal enrollment"
    cert = sign_certificate(
        ca_key,
        ca_cert,
        key.public_key(),
        label,
        [x509.DNSName("shoal-enrollment")],
        SERVER_CERT_LIFETIME,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        now=now,
    )
    with tempfile.TemporaryDirectory(prefix="shoal-enroll-") as folder:
        cert_path, key_path = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        write_atomic(key_path, key_pem(key), private=True)
        write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=True)
        ctx.load_cert_chain(certfile=str(cert_path), keyfile=str(key_path))


def _parse_request(line: bytes) -> tuple[str, bytes, str]:
    try:
        doc = loads_json(line)
    except ValueError as exc:
        raise FleetError("malformed request: not a JSON line") from exc
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL_VERSION:
        raise FleetError(f"malformed request: expected a JSON object of protocol version {PROTOCOL_VERSION}")
    token_id, csr, mac = doc.get("token_id"), doc.get("csr"), doc.get("mac")
    if not isinstance(token_id, str) or not _TOKEN_ID_RE.fullmatch(token_id):
        raise FleetError("malformed request: token_id is not a join token id")
    if not isinstance(mac, str) or not _MAC_RE.fullmatch(mac):
        raise FleetError("malformed request: mac is not 64 hex digits")
    if not isinstance(csr, str):
        raise FleetError("malformed request: no csr")
    try:
        csr_der = base64.b64decode(csr, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FleetError("malformed request: csr is not base64") from exc
    return token_id, csr_der, mac


def _line(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return format_address((str(peer[0]), int(peer[1])))
    return str(peer)


# --- the joiner ----------------------------------------------------------------------------------------------


async def join(
    address: tuple[str, int],
    token: JoinToken,
    name: str,
    out_dir: Path,
    ips: Iterable[str] = (),
    timeout: float = 10.0,
) -> NodeIdentity:
    """Enroll this PC as ``name`` with the enrollment server at ``address``; write the identity to ``out_dir``.

    The server is checked before anything is sent: its CA must be the one the token pins and its TLS
    certificate must be that CA's. The key is made here and stays here. Refusals and a server that fails
    those checks raise :class:`FleetError`; an unreachable or silent server :class:`PeerUnavailableError`.
    Nothing is written unless a certificate of the fleet for this key and name came back.
    """
    validate_node_name(name)
    wanted = _joiner_ips(ips)
    where = format_address(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # The server is checked by hand against the token's CA hash (below): no CA is known before that.
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        async with asyncio.timeout(timeout):
            cert, ca, key = await _exchange(address, where, ctx, token, name, wanted)
    except TimeoutError as exc:
        raise PeerUnavailableError(f"the enrollment server at {where} did not answer within {timeout:g} s") from exc
    except ShoalError:
        raise
    except (OSError, ssl.SSLError, EOFError) as exc:
        raise PeerUnavailableError(
            f"cannot enroll with {where}: {exc or type(exc).__name__} (is `shoal fleet serve-enrollment` running "
            "there, and is the address right?)"
        ) from exc
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, _store_identity, Path(out_dir), key, cert, ca)


async def _exchange(
    address: tuple[str, int], where: str, ctx: ssl.SSLContext, token: JoinToken, name: str, ips: list[str]
) -> tuple[x509.Certificate, x509.Certificate, ec.EllipticCurvePrivateKey]:
    reader, writer = await asyncio.open_connection(*address, ssl=ctx, limit=MAX_LINE)
    try:
        greeting = await _read_message(reader, where)
        ca = _pem_certificate(greeting.get("ca"), where, "its greeting")
        server_der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        _check_server(ca, server_der, token, where)

        key = ec.generate_private_key(ec.SECP256R1())
        csr_der = _csr(key, name, ips)
        request = {
            "v": PROTOCOL_VERSION,
            "token_id": token.token_id,
            "csr": base64.b64encode(csr_der).decode(),
            "mac": token.mac(csr_der),
        }
        writer.write(_line(request))
        await writer.drain()
        reply = await _read_message(reader, where)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
    if reply.get("ok") is not True:
        reason = reply.get("reason")
        raise FleetError(f"{where} refused to enroll {name!r}: {reason if isinstance(reason, str) else 'no reason'}")
    if _pem_certificate(reply.get("ca"), where, "its reply") != ca:
        raise FleetError(f"{where} answered with another CA than it greeted with: not enrolling there")
    cert = _pem_certificate(reply.get("cert"), where, "its reply")
    _check_issued(cert, ca, key, name, where)
    return cert, ca, key


async def _read_message(reader: asyncio.StreamReader, where: str) -> dict[str, Any]:
    try:
        line = await reader.readline()
    except ValueError as exc:  # over the reader's limit
        raise FleetError(f"{where} sent a line longer than {MAX_LINE} bytes: not a shoal enrollment server") from exc
    if not line:
        raise PeerUnavailableError(f"{where} closed the connection (is it a shoal enrollment server?)")
    try:
        doc = loads_json(line)
    except ValueError as exc:
        raise FleetError(f"{where} sent something that is not JSON: not a shoal enrollment server") from exc
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL_VERSION:
        raise FleetError(
            f"{where} does not speak enrollment protocol version {PROTOCOL_VERSION} (update shoal on one side)"
        )
    return doc


def _pem_certificate(value: object, where: str, what: str) -> x509.Certificate:
    if not isinstance(value, str):
        raise FleetError(f"{where} sent no certificate in {what}")
    try:
        return x509.load_pem_x509_certificate(value.encode())
    except ValueError as exc:
        raise FleetError(f"{where} sent an unreadable certificate in {what}") from exc


def _check_server(ca: x509.Certificate, server_der: bytes | None, token: JoinToken, where: str) -> None:
    """The server's CA is the one the token pins, and its TLS certificate is that CA's."""
    found = spki_sha256(ca)
    if not hmac.compare_digest(found, token.ca_hash):
        raise FleetError(
            f"CA fingerprint mismatch: this is not the fleet the token names ({where} presents CA "
            f"{found[:16]}..., the token names {token.ca_hash[:16]}...); check the address, or ask for a new token"
        )
    if not server_der:
        raise FleetError(f"{where} presented no TLS certificate")
    try:
        x509.load_der_x509_certificate(server_der).verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:  # any of them means "not that CA's"
        raise FleetError(
            f"{where} shows the fleet's CA but its TLS certificate was not issued by it: someone is in between; "
            "not enrolling there"
        ) from exc


def _check_issued(
    cert: x509.Certificate, ca: x509.Certificate, key: ec.EllipticCurvePrivateKey, name: str, where: str
) -> None:
    """What came back is a certificate of the fleet CA, for our key and the name we asked for."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise FleetError(f"{where} sent a certificate the fleet CA did not sign") from exc
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise FleetError(f"{where} sent a certificate for another key")
    if common_name(cert) != name:
        raise FleetError(f"{where} sent a certificate for {common_name(cert)!r}, not {name!r}")


def _csr(key: ec.EllipticCurvePrivateKey, name: str, ips: list[str]) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    )
    if ips:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


def _joiner_ips(ips: Iterable[str]) -> list[str]:
    result: list[str] = []
    for text in ips:
        try:
            ip = str(ipaddress.ip_address(text.strip()))
        except ValueError as exc:
            raise FleetError(f"invalid IP address {text!r}") from exc
        if ip not in result:
            result.append(ip)
    if len(result) > MAX_IPS:
        raise FleetError(f"at most {MAX_IPS} IP addresses, not {len(result)}")
    return result


def _store_identity(
    folder: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, ca: x509.Certificate
) -> NodeIdentity:
    make_dir(folder)
    identity = NodeIdentity.in_folder(folder)
    pem = serialization.Encoding.PEM
    write_atomic(identity.key, key_pem(key), private=True)
    write_atomic(identity.cert, cert.public_bytes(pem), private=False)
    write_atomic(identity.ca, ca.public_bytes(pem), private=False)
    return identity
