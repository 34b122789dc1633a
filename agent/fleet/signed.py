"""The fleet CA's signed documents (the revocation list, the fleet document): one JSON envelope for both.

::

    {"schema": 1, "body": "<canonical JSON, as text>", "signature": "<ECDSA-SHA256 of the body, base64>"}

The body is signed as the exact bytes it is carried as, so a receiver checks the signature before it parses
anything the body says.
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from agent.errors import FleetError
from agent.fleet.authority import fleet_id_of
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
