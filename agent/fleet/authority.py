"""The fleet's private certificate authority and the node identities it issues.

A fleet folder looks like this::

    <dir>/ca.pem                 the CA certificate (public; every node holds a copy)
    <dir>/ca.key                 the CA private key (0600; whoever holds it can admit any machine)
    <dir>/nodes/<NODE>/cert.pem  a node certificate, CN = NODE, signed by the CA
    <dir>/nodes/<NODE>/key.pem   its private key (0600)
    <dir>/nodes/<NODE>/ca.pem    a copy of the CA certificate, so the folder alone is a complete identity
    <dir>/enrolled.json          every certificate issued to a node: name, node id, fingerprint, when, how
    <dir>/tokens.json            outstanding join tokens (0600; ``agent.fleet.enrollment``)
    <dir>/revocations.json       the signed revocation list (``agent.fleet.revocation``)

Every key is EC P-256: small certificates, fast handshakes, supported by every TLS stack we meet.
Files are written whole or not at all, and the JSON files changed under the folder's lock (``agent.files``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from agent.errors import FleetError
from agent.files import LOCK_NAME, folder_lock, make_dir, parse_utc, read_json, utc_iso, write_atomic, write_json

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

    @property
    def enrolled(self) -> Path:
        return self.root / "enrolled.json"

    @property
    def tokens(self) -> Path:
        return self.root / "tokens.json"

    @property
    def revocations(self) -> Path:
        return self.root / "revocations.json"

    @property
    def lock(self) -> Path:
        return self.root / LOCK_NAME

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
    def node_id(self) -> str:
        """This PC's node id (:func:`node_id_of` its certificate)."""
        return node_id_of(self.certificate())

    @property
    def fleet_id(self) -> str:
        """The id of the fleet whose CA this identity trusts (:func:`fleet_id_of`)."""
        return fleet_id_of(read_certificate(self.ca))

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


def spki_sha256(cert: x509.Certificate) -> str:
    """Hex sha256 of the certificate's public key (its DER SubjectPublicKeyInfo): what a join token pins the
    fleet CA by, as ``kubeadm --discovery-token-ca-cert-hash`` does (it survives re-issuing the certificate)."""
    return key_sha256(cert.public_key())


def key_sha256(public_key: PublicKeyTypes) -> str:
    """Hex sha256 of a public key's DER SubjectPublicKeyInfo (:func:`spki_sha256` before there is a certificate)."""
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


NODE_ID_LENGTH = 12
"""Hex digits of a node id: 48 bits, so that an office's PCs never share one by chance."""
NODE_ID_RE = re.compile(rf"[0-9a-f]{{{NODE_ID_LENGTH}}}")
FLEET_ID_RE = re.compile(r"[0-9a-f]{16}")
FINGERPRINT_RE = re.compile(r"sha256:[0-9a-f]{64}")
"""The forms of a node id, a fleet id (:func:`fleet_id_of`) and a certificate fingerprint (:func:`cert_fingerprint`)."""


def node_id_of(cert: x509.Certificate) -> str:
    """The node id of an enrolled PC: the start of its public key's sha256. It is derived from the certificate,
    so a PC keeps it when its certificate is renewed with the same key, and two PCs share it only when one's
    identity folder was copied from the other."""
    return node_id_of_key(cert.public_key())


def node_id_of_key(public_key: PublicKeyTypes) -> str:
    """The node id a certificate for ``public_key`` will have (:func:`node_id_of`)."""
    return key_sha256(public_key)[:NODE_ID_LENGTH]


def fleet_id_of(ca: x509.Certificate) -> str:
    """The fleet id: the start of the fleet CA's public-key sha256 (announced over mDNS; not a secret)."""
    return spki_sha256(ca)[:16]


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
    make_dir(paths.root)
    # Key first: ca.pem is what `issue` and the agent look for, so it appears only once the key is in place.
    write_atomic(paths.ca_key, key_pem(key), private=True)
    write_atomic(paths.ca_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return paths.ca_cert


def issue_node(
    dir: Path,
    node: str,
    ips: Iterable[str] = (),
    days: int = 365,
    out: Path | None = None,
    force: bool = False,
) -> NodeIdentity:
    """Issue a certificate for ``node`` from the CA in ``dir``, write its identity folder and record it in
    ``enrolled.json`` (how: ``"issued"``).

    The folder is ``out`` or ``<dir>/nodes/<node>``; an existing identity there is replaced. Names are unique
    within a fleet, so that a pin or a revocation by name means one PC: a name enrolled with a certificate
    that is not revoked is refused (:class:`FleetError` saying what to do) unless ``force``, the admin
    insisting (a renewal: re-issuing is how a node's certificate is renewed, under a new key). The new
    certificate is then recorded beside the old one, and ``shoal fleet revoke NODE`` revokes both.
    """
    paths = FleetPaths(Path(dir))
    validate_node_name(node)
    if days < 1:
        raise FleetError(f"--days must be at least 1, not {days}")
    ips = list(ips)
    _parse_ips(ips)  # refuse a bad address before touching anything
    ca_key, ca_cert = load_ca(paths.root)

    key = ec.generate_private_key(ec.SECP256R1())
    cert = node_certificate(ca_key, ca_cert, key.public_key(), node, ips=ips, days=days)

    # Imported here: the revocation list is built on this module.
    from agent.fleet.revocation import fleet_revokes

    folder = Path(out) if out is not None else paths.node_dir(node)
    with folder_lock(paths.root):
        enrolled = enrolled_nodes(paths.root)  # a malformed registry stops us before anything is written
        named = not force and any(e.name == node for e in enrolled)  # only then is the revocation list read
        taken = namesakes(enrolled, fleet_revokes(paths.root), node) if named else []
        if taken:
            raise FleetError(
                f"a node named {node!r} is enrolled already (node id {taken[-1].node_id}): choose another name, "
                f"revoke it first (`shoal fleet revoke {node}`), or pass --force to issue a second certificate "
                "under that name (a renewal)"
            )
        make_dir(folder)
        identity = NodeIdentity.in_folder(folder)
        write_atomic(identity.key, key_pem(key), private=True)
        write_atomic(identity.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
        write_atomic(identity.ca, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
        _write_enrolled(paths, (*enrolled, EnrolledNode.of(cert, "issued")))
    return identity


NODE_USAGES = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
"""Every node both accepts connections (from its predecessor) and makes them (to its successor)."""


def node_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    public_key: object,
    node: str,
    ips: Iterable[str] = (),
    days: int = 365,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """A node certificate for ``public_key`` (EC P-256): CN = ``node``, SANs ``node``, ``node.local``,
    127.0.0.1 and ``ips``, server and client auth, ``days`` of validity (never past the CA's).

    Both ``issue_node`` (the key made here) and enrollment (the key in a joiner's CSR) issue through it.
    """
    validate_node_name(node)
    if days < 1:
        raise FleetError(f"--days must be at least 1, not {days}")
    if not (isinstance(public_key, ec.EllipticCurvePublicKey) and isinstance(public_key.curve, ec.SECP256R1)):
        raise FleetError("a node key must be EC P-256")
    san: list[x509.GeneralName] = [x509.DNSName(node), x509.DNSName(f"{node}.local")]
    san += [x509.IPAddress(ip) for ip in _parse_ips(ips)]
    return sign_certificate(
        ca_key, ca_cert, public_key, node, san, dt.timedelta(days=days), usages=NODE_USAGES, now=now
    )


def sign_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    public_key: ec.EllipticCurvePublicKey,
    common_name: str,
    san: Sequence[x509.GeneralName],
    lifetime: dt.timedelta,
    usages: Sequence[ObjectIdentifier],
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """The one builder of the end-entity certificates the CA signs (node certificates, the enrollment
    server's): not a CA, digital signature only, the given extended key ``usages``, SKI/AKI.

    It starts :data:`CLOCK_SKEW` before ``now`` and must not outlive its CA: verifiers would reject the
    chain at that point anyway.
    """
    now = now if now is not None else dt.datetime.now(dt.UTC)
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    try:
        ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        aki = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
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
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(x509.SubjectAlternativeName(list(san)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(aki, critical=False)
        .sign(ca_key, hashes.SHA256())
    )


@dataclass(frozen=True)
class EnrolledNode:
    """One certificate the CA issued to a node, as ``enrolled.json`` records it."""

    name: str
    node_id: str
    fingerprint: str
    enrolled_at: dt.datetime
    how: str
    """``"issued"`` (``shoal fleet issue``) or the id of the join token redeemed."""

    @classmethod
    def of(cls, cert: x509.Certificate, how: str, now: dt.datetime | None = None) -> EnrolledNode:
        when = now if now is not None else dt.datetime.now(dt.UTC)
        return cls(common_name(cert), node_id_of(cert), cert_fingerprint(cert), when.replace(microsecond=0), how)

    def to_json(self) -> dict[str, str]:
        return {
            "name": self.name,
            "node_id": self.node_id,
            "fingerprint": self.fingerprint,
            "enrolled_at": utc_iso(self.enrolled_at),
            "how": self.how,
        }

    @classmethod
    def from_json(cls, item: object, where: Path) -> EnrolledNode:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("name", "node_id", "fingerprint", "enrolled_at", "how")
        ):
            raise FleetError(f"{where} is malformed (an entry is not name, node_id, fingerprint, enrolled_at, how)")
        return cls(
            item["name"], item["node_id"], item["fingerprint"], parse_utc(item["enrolled_at"], where), item["how"]
        )


def enrolled_nodes(dir: Path) -> tuple[EnrolledNode, ...]:
    """Every certificate recorded in ``<dir>/enrolled.json``, oldest first (none if the file is absent)."""
    path = FleetPaths(Path(dir)).enrolled
    doc = read_json(path)
    if doc is None:
        return ()
    nodes = doc.get("nodes") if doc.get("schema") == 1 else None
    if not isinstance(nodes, list):
        raise FleetError(f"{path} is malformed (expected schema 1 and a list of nodes)")
    return tuple(EnrolledNode.from_json(item, path) for item in nodes)


def namesakes(
    enrolled: Iterable[EnrolledNode], revoked: Callable[[str], bool], name: str, node_id: str | None = None
) -> list[EnrolledNode]:
    """The certificates of ``enrolled`` named ``name`` that are not revoked (``revoked(fingerprint)``) and are
    of another key than ``node_id`` (None: of any key), oldest first: what a new node of that name would
    share it with."""
    return [e for e in enrolled if e.name == name and e.node_id != node_id and not revoked(e.fingerprint)]


def record_enrollment(dir: Path, cert: x509.Certificate, how: str, now: dt.datetime | None = None) -> EnrolledNode:
    """Add ``cert`` to ``<dir>/enrolled.json``; the caller holds :func:`agent.files.folder_lock`."""
    paths = FleetPaths(Path(dir))
    entry = EnrolledNode.of(cert, how, now)
    _write_enrolled(paths, (*enrolled_nodes(paths.root), entry))
    return entry


def _write_enrolled(paths: FleetPaths, nodes: Iterable[EnrolledNode]) -> None:
    write_json(paths.enrolled, {"schema": 1, "nodes": [n.to_json() for n in nodes]}, private=False)


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


def load_ca(dir: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The fleet CA's key and certificate in ``dir``; :class:`FleetError` saying what to do if either is
    missing, unreadable, or they are not a pair."""
    paths = FleetPaths(Path(dir))
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


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The PKCS#8 PEM of ``key``, unencrypted."""
    # Unencrypted: agents start unattended; the 0600 file mode is the protection.
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
