"""The fleet's revocation list: the node certificates the CA no longer stands behind, signed by the CA.

``<fleet dir>/revocations.json`` is the list's canonical JSON (sorted keys, no spaces) as a string,
with an ECDSA-SHA256 signature of exactly those bytes by the fleet CA key::

    {"schema": 1, "body": "{\"fleet_id\":...,\"issued_at\":...,\"revoked\":[...],\"version\":3}",
     "signature": "<base64 DER ECDSA signature>"}

The body travels as a string so that a verifier checks the very bytes that were signed, whatever JSON
library re-encodes the outer document. Every node holds the CA certificate, so any node can check a list
it is handed (by a peer, by gossip) and keep the one with the highest ``version``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from agent.errors import FleetError
from agent.files import parse_utc, utc_iso
from agent.fleet.authority import (
    FINGERPRINT_RE,
    FLEET_ID_RE,
    NODE_ID_RE,
    FleetPaths,
    enrolled_nodes,
    read_certificate,
)
from agent.fleet.signed import SignedDocument, edit_signed, read_signed
from agent.wire.jsonbody import canonical_json, loads_json


@dataclass(frozen=True)
class RevokedNode:
    """One revoked node certificate."""

    node_id: str
    fingerprint: str
    """``sha256:<hex>`` of the certificate (``authority.cert_fingerprint``)."""
    name: str
    revoked_at: dt.datetime

    def __post_init__(self) -> None:
        if not NODE_ID_RE.fullmatch(self.node_id):
            raise FleetError(f"invalid node id {self.node_id!r} in a revocation list")
        if not FINGERPRINT_RE.fullmatch(self.fingerprint):
            raise FleetError(f"invalid fingerprint {self.fingerprint!r} in a revocation list")
        if self.revoked_at.tzinfo is None:
            raise FleetError("a revocation time must be in UTC")

    def to_json(self) -> dict[str, str]:
        return {
            "node_id": self.node_id,
            "fingerprint": self.fingerprint,
            "name": self.name,
            "revoked_at": utc_iso(self.revoked_at),
        }


@dataclass(frozen=True)
class RevocationList(SignedDocument):
    """The revoked node certificates of one fleet; ``version`` grows by one with every change."""

    WHAT = "the revocation list"
    KINDS = "the revocation lists"

    fleet_id: str
    version: int
    issued_at: dt.datetime
    revoked: tuple[RevokedNode, ...] = ()

    def __post_init__(self) -> None:
        if not FLEET_ID_RE.fullmatch(self.fleet_id):
            raise FleetError(f"invalid fleet id {self.fleet_id!r} in a revocation list")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise FleetError(f"invalid revocation list version {self.version!r}")
        if self.issued_at.tzinfo is None:
            raise FleetError("a revocation list's issue time must be in UTC")

    @classmethod
    def empty(cls, fleet_id: str, now: dt.datetime | None = None) -> RevocationList:
        """Version 0: nothing revoked yet."""
        return cls(fleet_id, 0, _now(now))

    def body(self) -> bytes:
        """The canonical JSON that is signed."""
        doc = {
            "fleet_id": self.fleet_id,
            "version": self.version,
            "issued_at": utc_iso(self.issued_at),
            "revoked": [r.to_json() for r in self.revoked],
        }
        return canonical_json(doc)

    @classmethod
    def _from_body(cls, body: bytes) -> RevocationList:
        # Signed by our CA, so malformed only through a bug; still checked field by field, never asserted.
        try:
            doc: Any = loads_json(body)
            if not isinstance(doc, dict) or set(doc) != {"fleet_id", "version", "issued_at", "revoked"}:
                raise ValueError("expected fleet_id, version, issued_at and revoked")
            entries = doc["revoked"]
            if not isinstance(entries, list):
                raise ValueError("revoked is not a list")
            revoked = []
            for entry in entries:
                if not isinstance(entry, dict) or set(entry) != {"node_id", "fingerprint", "name", "revoked_at"}:
                    raise ValueError("an entry is not node_id, fingerprint, name, revoked_at")
                if not all(isinstance(v, str) for v in entry.values()):
                    raise ValueError("an entry has a value that is not a string")
                revoked.append(
                    RevokedNode(
                        entry["node_id"],
                        entry["fingerprint"],
                        entry["name"],
                        parse_utc(entry["revoked_at"], "the revocation list"),
                    )
                )
            if not isinstance(doc["fleet_id"], str) or not isinstance(doc["issued_at"], str):
                raise ValueError("fleet_id and issued_at must be strings")
            return cls(
                doc["fleet_id"], doc["version"], parse_utc(doc["issued_at"], "the revocation list"), tuple(revoked)
            )
        except ValueError as exc:
            raise FleetError(f"the revocation list is malformed: {exc}") from exc

    def revokes(self, fingerprint: str) -> bool:
        """Whether the certificate with this ``sha256:<hex>`` fingerprint is revoked."""
        return any(r.fingerprint == fingerprint for r in self.revoked)

    def revokes_node(self, node_id: str) -> bool:
        """Whether a certificate of this node id (this key) is revoked."""
        return any(r.node_id == node_id for r in self.revoked)


def load_revocations(path: Path, ca_cert: x509.Certificate) -> RevocationList | None:
    """The verified list in ``path``; None if there is no such file."""
    found = read_signed(Path(path), ca_cert, RevocationList.verify, RevocationList.WHAT)
    return found[0] if found is not None else None


def fleet_revocations(dir: Path) -> RevocationList | None:
    """The verified list of the fleet folder ``dir`` (its own CA certificate checks it); None if none."""
    paths = FleetPaths(Path(dir))
    if not paths.revocations.is_file():
        return None
    return load_revocations(paths.revocations, read_certificate(paths.ca_cert))


def fleet_revokes(dir: Path) -> Callable[[str], bool]:
    """Whether a certificate (by its fingerprint) is on the revocation list of the fleet folder ``dir`` (none is
    while it has no list)."""
    revocations = fleet_revocations(dir)
    return revocations.revokes if revocations is not None else lambda _: False


def revoke_node(dir: Path, name_or_node_id: str, now: dt.datetime | None = None) -> RevocationList:
    """Revoke every certificate ``enrolled.json`` records for a node name or node id, and write the new list.

    Needs the CA key (run where ``shoal fleet init`` was). :class:`FleetError` listing the enrolled names
    if none matches, or saying so if all matching certificates are revoked already.
    """
    paths = FleetPaths(Path(dir))
    when = _now(now)

    def change(current: RevocationList) -> RevocationList:
        enrolled = enrolled_nodes(paths.root)
        matches = [e for e in enrolled if name_or_node_id in (e.name, e.node_id)]
        if not matches:
            names = ", ".join(sorted({e.name for e in enrolled})) or "none yet"
            raise FleetError(f"no node {name_or_node_id!r} is enrolled in {paths.root} (enrolled: {names})")
        fresh = [e for e in matches if not current.revokes(e.fingerprint)]
        if not fresh:
            raise FleetError(f"{name_or_node_id!r} is already revoked (revocation list version {current.version})")
        added = tuple(RevokedNode(e.node_id, e.fingerprint, e.name, when) for e in fresh)
        return RevocationList(current.fleet_id, current.version + 1, when, current.revoked + added)

    return edit_signed(paths.root, paths.revocations, RevocationList, change, when)[0]


def _now(now: dt.datetime | None) -> dt.datetime:
    return (now if now is not None else dt.datetime.now(dt.UTC)).replace(microsecond=0)
