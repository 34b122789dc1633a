"""The fleet CA's signed, versioned documents (the revocation list, the fleet document): one JSON envelope, one
base class for what they share (signing, verifying, which of two is newer), and one way to read, change and
write such a document kept on disk.

::

    {"schema": 1, "body": "<canonical JSON, as text>", "signature": "<ECDSA-SHA256 of the body, base64>"}

The body is signed as the exact bytes it is carried as, so a receiver checks the signature before it parses
anything the body says.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, Self, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from agent.errors import FleetError
from agent.files import folder_lock, write_atomic
from agent.fleet.authority import fleet_id_of, load_ca
from agent.wire.jsonbody import loads_json

SCHEMA = 1


def sign_document(body: bytes, ca_key: ec.EllipticCurvePrivateKey, schema: int = SCHEMA) -> bytes:
    """The signed document carrying ``body`` (canonical JSON) and the CA's signature of exactly those bytes."""
    signature = ca_key.sign(body, ec.ECDSA(hashes.SHA256()))
    doc = {"schema": schema, "body": body.decode(), "signature": base64.b64encode(signature).decode()}
    return (json.dumps(doc, indent=1) + "\n").encode()


def verify_document(data: bytes, ca_cert: x509.Certificate, what: str = "the document", schema: int = SCHEMA) -> bytes:
    """The body of the signed document ``data`` once its signature is found to be the fleet CA's.

    :class:`FleetError` naming ``what`` if ``data`` is not a JSON object, is of another schema, has no body or
    no signature, or its signature is not ``ca_cert``'s key's. The body's own content is the caller's to
    check (its fleet id above all: the CA signs for one fleet only).
    """
    try:
        doc = loads_json(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, too deep a nesting
        raise FleetError(f"{what} is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise FleetError(f"{what} is not a JSON object")
    if doc.get("schema") != schema:
        raise FleetError(
            f"{what} has schema {doc.get('schema')!r}; this shoal reads schema {schema} (update shoal on this PC)"
        )
    body, signature = doc.get("body"), doc.get("signature")
    if not isinstance(body, str) or not isinstance(signature, str) or not signature:
        raise FleetError(f"{what} has no body or no signature (it is not signed by the fleet CA)")
    try:
        raw_signature = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FleetError(f"{what}'s signature is not base64") from exc
    public_key = ca_cert.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise FleetError("the fleet CA key is not an EC key")
    try:
        raw_body = body.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: nothing the CA signed
        raise FleetError(f"{what}'s body is not text") from exc
    try:
        public_key.verify(raw_signature, raw_body, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise FleetError(f"{what}'s signature is not the fleet CA's (tampered with, or of another fleet)") from exc
    return raw_body


def check_fleet(fleet_id: str, ca_cert: x509.Certificate, what: str) -> None:
    """:class:`FleetError` unless a verified body's ``fleet_id`` is the fleet of ``ca_cert`` (the CA signs for one
    fleet only)."""
    if fleet_id != fleet_id_of(ca_cert):
        raise FleetError(f"{what} is for fleet {fleet_id}, not this fleet ({fleet_id_of(ca_cert)})")


class SignedDocument:
    """What the fleet CA's documents share. A subclass is a frozen dataclass with ``fleet_id`` and ``version``
    (it grows by one with every change), names itself in ``WHAT`` (``"the revocation list"``) and ``KINDS``,
    and defines :meth:`empty`, :meth:`body` (its canonical JSON) and :meth:`_from_body` (which checks every
    field of a body whose signature was found good)."""

    WHAT: ClassVar[str]
    KINDS: ClassVar[str]
    fleet_id: str
    version: int

    @classmethod
    def empty(cls, fleet_id: str, now: dt.datetime) -> Self:
        """Version 0 of the fleet ``fleet_id``'s document."""
        raise NotImplementedError

    def body(self) -> bytes:
        """The canonical JSON that is signed (``agent.wire.jsonbody.canonical_json``)."""
        raise NotImplementedError

    @classmethod
    def _from_body(cls, body: bytes) -> Self:
        raise NotImplementedError

    def sign(self, ca_key: ec.EllipticCurvePrivateKey) -> bytes:
        """The signed document (what is stored and gossiped)."""
        return sign_document(self.body(), ca_key)

    @classmethod
    def verify(cls, data: bytes, ca_cert: x509.Certificate) -> Self:
        """The document in the signed ``data``, checked against the fleet CA ``ca_cert``.

        :class:`FleetError` if it is malformed or of another schema, unsigned or not signed by the CA, or the
        document of another fleet.
        """
        result = cls._from_body(verify_document(data, ca_cert, cls.WHAT))
        check_fleet(result.fleet_id, ca_cert, cls.WHAT)
        return result

    def is_newer_than(self, other: Self | None) -> bool:
        """Whether this document replaces ``other`` (a higher version of the same fleet's document)."""
        if other is None:
            return True
        if other.fleet_id != self.fleet_id:
            raise FleetError(f"cannot compare {self.KINDS} of fleets {self.fleet_id} and {other.fleet_id}")
        return self.version > other.version


D = TypeVar("D")
S = TypeVar("S", bound=SignedDocument)

log = logging.getLogger(__name__)


def read_signed(
    path: Path, ca_cert: x509.Certificate, verify: Callable[[bytes, x509.Certificate], D], what: str
) -> tuple[D, bytes] | None:
    """The document in the file ``path``, checked by ``verify`` against ``ca_cert``, and its signed bytes; None
    if there is no such file. :class:`FleetError` naming the file if it cannot be read or is not valid."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise FleetError(f"cannot read {what} {path}: {exc}") from exc
    try:
        return verify(data, ca_cert), data
    except FleetError as exc:
        raise FleetError(f"{path}: {exc}") from exc


def edit_signed(folder: Path, path: Path, kind: type[S], change: Callable[[S], S], now: dt.datetime) -> tuple[S, bytes]:
    """Write ``change(current)``, the next version of the ``kind`` document kept in ``path`` (version 0 if none
    was written yet), signed with the CA key of the fleet folder ``folder``, under that folder's lock; returns
    it and its signed bytes (what is pushed to agents). Needs the CA key (run where ``shoal fleet init`` was)."""
    ca_key, ca_cert = load_ca(folder)
    with folder_lock(folder):
        found = read_signed(path, ca_cert, kind.verify, kind.WHAT)
        current = found[0] if found is not None else kind.empty(fleet_id_of(ca_cert), now)
        result = change(current)
        signed = result.sign(ca_key)
        # public: every agent holds a copy, and it holds nothing secret
        write_atomic(path, signed, private=False)
    return result, signed


class Kept(Generic[S]):
    """The newest validly signed document of one kind that an agent knows, kept in a file across restarts:
    holds :attr:`current` (None: none received yet) and its signed :attr:`document`."""

    def __init__(self, path: Path, ca: x509.Certificate, verify: Callable[[bytes, x509.Certificate], S]) -> None:
        self.path = path
        self._ca = ca
        self._verify = verify
        self.current: S | None = None
        self.document: bytes | None = None

    @classmethod
    def load(cls, path: Path, ca: x509.Certificate, verify: Callable[[bytes, x509.Certificate], S]) -> Kept[S]:
        """The keeper of the file ``path``; a damaged file is logged and ignored (a peer sends the document
        again). Blocking: call it off the event loop."""
        keeper = cls(path, ca, verify)
        try:
            found = read_signed(path, ca, verify, "the kept document")
        except FleetError as exc:
            log.warning("ignored %s", exc)
            return keeper
        if found is not None:
            keeper.current, keeper.document = found
        return keeper

    @property
    def version(self) -> int:
        return self.current.version if self.current is not None else 0

    def verify(self, document: bytes) -> S:
        """The document in ``document``; :class:`FleetError` if it is not validly signed by this fleet's CA."""
        return self._verify(document, self._ca)

    def check(self, document: bytes) -> S | None:
        """The document in ``document`` if it is validly signed and newer than the one held, None if it is not
        newer; :class:`FleetError` if it is not validly signed by this fleet's CA."""
        offered = self.verify(document)
        return offered if offered.is_newer_than(self.current) else None

    def keep(self, offered: S, document: bytes) -> None:
        """Hold (and write) a document that :meth:`check` returned. Blocking: call it off the event loop."""
        write_atomic(self.path, document, private=False)
        self.current, self.document = offered, document
