"""Errors of the running system: fleet identity, the wire protocol, the ring.

::

    ShoalError (shards.errors)
    ├── FleetError             certificates / CA files missing, unreadable or not of this fleet
    ├── ProtocolError          a frame could not be encoded or decoded
    │   ├── RemoteProtocolError     a peer sent something invalid: drop that peer only
    │   └── LocalProtocolError      we tried to send something invalid: our bug
    └── RingError              the ring cannot serve a request
        ├── PeerUnavailableError    a stage cannot be reached, or its connection died
        │   └── PeerRefusedError        the TLS handshake failed: not of this fleet, or it refused us
        ├── FleetBusyError          a stage has no room for another session
        └── SessionFailedError      a stage reported an error for this session

ssl, socket and OpenVINO exceptions are mapped to these where they arrive (``raise ... from exc``).
"""

from __future__ import annotations

from shards.errors import ShoalError


class FleetError(ShoalError):
    """A fleet identity (CA, node certificate, key) is missing, unreadable or inconsistent."""


class ProtocolError(ShoalError):
    """A wire frame could not be encoded or decoded."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; the connection to it is closed, nothing else is affected."""


class LocalProtocolError(ProtocolError, ValueError):
    """We were about to send an invalid frame."""


class RingError(ShoalError):
    """The ring cannot serve this request."""


class PeerUnavailableError(RingError, ConnectionError):
    """A stage cannot be reached, or its connection ended without a goodbye."""


class PeerRefusedError(PeerUnavailableError):
    """The TLS handshake with a peer failed: its certificate is not of this fleet, or it refused ours."""


class FleetBusyError(RingError):
    """A stage already holds its configured maximum of sessions."""


class SessionFailedError(RingError):
    """A stage reported a failure for this session."""


class SessionEvictedError(SessionFailedError):
    """The session was parked between turns and a stage gave its place to a new session."""
