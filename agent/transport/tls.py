"""Mutual-TLS contexts for ring connections.

Both ends present their node certificate and require the peer's, verified against the fleet CA
only: a peer without a certificate from this fleet is refused during the handshake.

TLS 1.3 caveat (measured, see netlab NOTES.md section 3): when the *server* refuses a client
certificate, the client's handshake call still succeeds; the refusal only shows on the client's
first read. Callers must therefore treat the first read, not the handshake, as the proof of
admission.
"""

from __future__ import annotations

import ssl
from typing import cast

from agent.errors import FleetError
from agent.fleet.authority import NodeIdentity


def server_context(identity: NodeIdentity) -> ssl.SSLContext:
    """Context for accepting ring connections: requires a client certificate from the fleet CA."""
    ctx = _base_context(ssl.PROTOCOL_TLS_SERVER, identity)
    ctx.verify_mode = ssl.CERT_REQUIRED
    # Clients never resume sessions (each ring link is one long connection), so session tickets
    # would only be wasted bytes after the handshake.
    ctx.num_tickets = 0
    return ctx


def client_context(identity: NodeIdentity, check_dates: bool = True) -> ssl.SSLContext:
    """Context for dialling a ring peer: presents our certificate and requires the peer's.

    ``check_hostname`` is off on purpose: peers are dialled by address (found through discovery),
    and membership of the fleet is proven by the CA's signature, not by a name or address in the
    certificate. Any certificate the fleet CA signed belongs to a fleet member. The IP SANs the CA
    issues are there for a later, stricter check (pinning a peer to its address).

    ``check_dates`` False accepts a peer certificate that this PC's clock finds not yet valid or
    expired (the CA's signature is still required): only for the clock probe
    (``discovery.service``), which reads the peer's time and closes, never for a link that carries
    anything else.
    """
    ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT, identity)
    ctx.check_hostname = False  # see the docstring: membership comes from the CA signature
    ctx.verify_mode = ssl.CERT_REQUIRED
    if not check_dates:
        ctx.verify_flags |= _X509_V_FLAG_NO_CHECK_TIME
    return ctx


_X509_V_FLAG_NO_CHECK_TIME = 0x200000
"""OpenSSL's flag to skip the validity dates in a certificate check (the ssl module names no constant for it)."""
_DATE_ERRORS = {9: "is not yet valid", 10: "has expired"}
"""OpenSSL's verify codes X509_V_ERR_CERT_NOT_YET_VALID and X509_V_ERR_CERT_HAS_EXPIRED: a check that failed on
the dates alone, so on one of the two PCs' clocks (or a certificate due for renewal)."""


def date_failure(exc: BaseException) -> str | None:
    """What a failed handshake says of the peer's certificate if it failed on its dates alone (``is not yet
    valid``, ``has expired``: by this PC's clock), else None."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _DATE_ERRORS.get(exc.verify_code)
    return None


def peer_name(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """The common name of the peer's verified certificate, or None (no handshake, no certificate, no CN).

    In asyncio, pass ``writer.get_extra_info("ssl_object")``.
    """
    if ssl_object is None:
        return None
    try:
        cert = ssl_object.getpeercert()
    except ValueError:  # handshake not done yet
        return None
    if not cert:
        return None
    subject = cast(tuple[tuple[tuple[str, str], ...], ...], cert.get("subject", ()))
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _base_context(protocol: int, identity: NodeIdentity) -> ssl.SSLContext:
    # SSLContext() (unlike ssl.create_default_context) trusts no CA until told, so after
    # load_verify_locations the fleet CA is the only trust anchor: a certificate from a public CA
    # or another fleet is not enough to join.
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    # Strict X.509 checks: our own CA always issues well-formed certificates (SKI/AKI, critical
    # basic constraints), so anything that fails them is not ours.
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    try:
        ctx.load_cert_chain(certfile=str(identity.cert), keyfile=str(identity.key))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise FleetError(
            f"cannot load the node certificate {identity.cert} with key {identity.key} "
            f"(missing, unreadable or not a matching pair): {exc}"
        ) from exc
    try:
        ctx.load_verify_locations(cafile=str(identity.ca))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise FleetError(f"cannot load the fleet CA certificate {identity.ca}: {exc}") from exc
    return ctx
