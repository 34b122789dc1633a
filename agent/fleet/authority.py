"""The fleet's private certificate authority and the node identities it issues.

A fleet folder looks like this::

    <dir>/ca.pem                 the CA certificate (public; every node holds a copy)
    <dir>/ca.key                 the CA private key (0600; whoever holds it can admit any machine)
    <dir>/nodes/<NODE>/cert.pem  a node certificate, CN = NODE, signed by the CA
    <dir>/nodes/<NODE>/key.pem   its private key (0600)
    <dir>/nodes/<NODE>/ca.pem    a copy of the CA certificate, so the folder alone is a complete identity

Every key is EC P-256: small certificates, fast handshakes, supported by every TLS stack we meet.
Files are written atomically (temp file + ``os.replace``) so that a crash never leaves a
half-written key or certificate behind for the agent to choke on.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.errors import FleetError

CA_VALIDITY_DAYS = 3650
# Certificates start a few minutes in the past: office PCs' clocks drift, and a certificate that
# is "not yet valid" on a peer whose clock is slightly behind would be refused for no good reason.
CLOCK_SKEW = dt.timedelta(minutes=5)
# Letters, digits, '-', '_', '.'; the first character must be a letter or digit so that a name can
# be neither '.'/'..' (it becomes a folder name under nodes/) nor mistaken for a command-line option.
NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# X.509 limits a common name to 64 characters; the CA's is f"{name} fleet CA".
_CA_SUFFIX = " fleet CA"
MAX_FLEET_NAME = 64 - len(_CA_SUFFIX)


@dataclass(frozen=True)
class FleetPaths:
    """Where a fleet folder keeps its CA and node identities."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    def node_dir(self, node: str) -> Path:
        """The default identity folder of ``node`` (the name is validated first)."""
        return self.nodes / validate_node_name(node)


@dataclass(frozen=True)
class NodeIdentity:
    """A node's certificate, private key and the fleet CA certificate it trusts."""

    cert: Path
    key: Path
    ca: Path

    CERT_FILE = "cert.pem"
    KEY_FILE = "key.pem"
    CA_FILE = "ca.pem"

    @classmethod
    def in_folder(cls, folder: Path) -> NodeIdentity:
        """The identity paths inside ``folder``, without checking that they exist."""
        folder = Path(folder)
        return cls(folder / cls.CERT_FILE, folder / cls.KEY_FILE, folder / cls.CA_FILE)

    @classmethod
    def load(cls, folder: Path) -> NodeIdentity:
        """The identity in ``folder``; :class:`FleetError` saying what to run if a file is missing."""
        identity = cls.in_folder(folder)
        missing = [p.name for p in (identity.cert, identity.key, identity.ca) if not p.is_file()]
        if missing:
            raise FleetError(
                f"no complete node identity in {folder} (missing {', '.join(missing)}): run "
                f"`shoal fleet issue NODE --out {folder}` where the fleet CA is kept, then copy the folder here"
            )
        return identity

    def certificate(self) -> x509.Certificate:
        """The parsed node certificate."""
        return read_certificate(self.cert)

    @property
    def name(self) -> str:
        """The node name: the certificate's common name."""
        return common_name(self.certificate())

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the node certificate (DER)."""
        return cert_fingerprint(self.certificate())


def validate_node_name(node: str) -> str:
    """``node`` if it is a valid node name, else :class:`FleetError`."""
    if not NODE_NAME_RE.fullmatch(node):
        raise FleetError(
            f"invalid node name {node!r}: use 1 to 63 letters, digits, '-', '_' or '.', starting with a letter or digit"
        )
    return node


def cert_fingerprint(cert: x509.Certificate) -> str:
    """``sha256:<64 hex digits>`` of the certificate's DER encoding (what peers and join tokens pin)."""
    return "sha256:" + cert.fingerprint(hashes.SHA256()).hex()


def common_name(cert: x509.Certificate) -> str:
    """The subject common name of ``cert``; :class:`FleetError` if it has none."""
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not attrs:
        raise FleetError(f"certificate {cert.subject.rfc4514_string()!r} has no common name")
    value = attrs[0].value
    return value if isinstance(value, str) else value.decode()


def read_certificate(path: Path) -> x509.Certificate:
    """Parse a PEM certificate; :class:`FleetError` if it is missing or not a certificate."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except FileNotFoundError as exc:
        raise FleetError(f"certificate {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise FleetError(f"cannot read certificate {path}: {exc}") from exc


def init_fleet(dir: Path, name: str = "shoal", force: bool = False) -> Path:
    """Create the fleet CA in ``dir``; returns the CA certificate's path.

    Refuses to replace an existing CA unless ``force``: a new CA silently orphans every node
    certificate issued by the old one.
    """
    paths = FleetPaths(Path(dir))
    name = name.strip()
    if not name or len(name) > MAX_FLEET_NAME or not name.isprintable():
        raise FleetError(f"invalid fleet name {name!r}: use 1 to {MAX_FLEET_NAME} printable characters")
    existing = [p for p in (paths.ca_cert, paths.ca_key) if p.exists()]
    if existing and not force:
        raise FleetError(
            f"a fleet CA already exists in {paths.root}; pass --force to replace it "
            "(every node certificate must then be issued again)"
        )

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name + _CA_SUFFIX)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=CA_VALIDITY_DAYS))
        # path_length=0: the CA signs node certificates only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    # The root holds the CA key: keep it private to its owner where the OS honours modes.
    _make_dir(paths.root)
    # Key first: ca.pem is what `issue` and the agent look for, so it appears only once the key is in place.
    _write_atomic(paths.ca_key, _key_pem(key), private=True)
    _write_atomic(paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return paths.ca_cert


def issue_node(
    dir: Path,
    node: str,
    ips: Iterable[str] = (),
    days: int = 365,
    out: Path | None = None,
) -> NodeIdentity:
    """Issue a certificate for ``node`` from the CA in ``dir`` and write its identity folder.

    The folder is ``out`` or ``<dir>/nodes/<node>``; an existing identity there is replaced
    (re-issuing is how a node's certificate is renewed).
    """
    paths = FleetPaths(Path(dir))
    validate_node_name(node)
    if days < 1:
        raise FleetError(f"--days must be at least 1, not {days}")
    addresses = _parse_ips(ips)
    ca_key, ca_cert = _load_ca(paths)

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    # A node certificate must not outlive its CA: verifiers would reject the chain at that point anyway.
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    san: list[x509.GeneralName] = [x509.DNSName(node), x509.DNSName(f"{node}.local")]
    san += [x509.IPAddress(ip) for ip in addresses]
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # Every node both accepts connections (from its predecessor) and makes them (to its successor).
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(aki, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    folder = Path(out) if out is not None else paths.node_dir(node)
    _make_dir(folder)
    identity = NodeIdentity.in_folder(folder)
    _write_atomic(identity.key, _key_pem(key), private=True)
    _write_atomic(identity.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write_atomic(identity.ca, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    return identity


def _parse_ips(ips: Iterable[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    # 127.0.0.1 is always there so that a node can dial itself (tests, a one-PC fleet).
    result: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ipaddress.IPv4Address("127.0.0.1")]
    for text in ips:
        try:
            ip = ipaddress.ip_address(text.strip())
        except ValueError as exc:
            raise FleetError(f"invalid IP address {text!r}") from exc
        if ip not in result:
            result.append(ip)
    return result


def _load_ca(paths: FleetPaths) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if not paths.ca_cert.is_file():
        raise FleetError(f"no fleet CA in {paths.root}: run `shoal fleet init` first (with the same --dir)")
    if not paths.ca_key.is_file():
        raise FleetError(
            f"{paths.ca_key} is missing: node certificates can only be issued where `shoal fleet init` was run"
        )
    cert = read_certificate(paths.ca_cert)
    try:
        key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise FleetError(f"cannot read the fleet CA key {paths.ca_key}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise FleetError(f"the fleet CA key {paths.ca_key} is not an EC key")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        # A mixed-up ca.key/ca.pem pair would issue certificates that no peer accepts.
        raise FleetError(f"{paths.ca_key} does not belong to {paths.ca_cert}")
    return key, cert


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # Unencrypted: agents start unattended; the 0600 file mode is the protection.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _make_dir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise FleetError(f"cannot create {folder}: {exc}") from exc


def _write_atomic(path: Path, data: bytes, private: bool) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    try:
        # mkstemp creates the file 0600 from the start, so a private key is never readable by
        # others, not even for the moment between creation and chmod.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise FleetError(f"cannot write {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if not private:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise FleetError(f"cannot write {path}: {exc}") from exc
        raise
