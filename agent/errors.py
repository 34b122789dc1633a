"""shoal's one error tree. Every error shoal raises on purpose derives from :class:`ShoalError`.

::

    ShoalError
    ├── ConfigError            a setting (flag, config file) is invalid or missing
    ├── SourceError            the model to export cannot be found or read
    │   ├── UnsupportedModelError   an architecture shoal does not export
    │   └── CorruptCheckpointError  a truncated or malformed checkpoint file
    ├── ExportError            the export itself failed (bad options, conversion failure)
    ├── MissingExtraError      this install lacks an optional part (``pip install 'shoal[export]'``)
    ├── ManifestError          a manifest is missing, malformed or of an unknown version
    │   └── IntegrityError          a file does not match the manifest's size or sha256
    ├── RuntimeStageError      a stage cannot be compiled or run (device, shapes)
    ├── PromptTooLongError     the prompt and the requested answer do not fit the model's context
    ├── FleetError             certificates / CA files missing, unreadable or not of this fleet
    ├── ProtocolError          a frame could not be encoded or decoded
    │   ├── RemoteProtocolError     a peer sent something invalid: drop that peer only
    │   └── LocalProtocolError      we tried to send something invalid: our bug
    ├── RingError              the ring cannot serve a request
    │   ├── PeerUnavailableError    a stage cannot be reached, or its connection died
    │   │   ├── PeerRefusedError        the TLS handshake failed: not of this fleet, or it refused us
    │   │   │   └── CertificateDatesError   its certificate is not yet valid, or expired, by this PC's clock
    │   │   ├── RingNotReadyError       the plan's ring cannot answer yet: which stage waits for what
    │   │   └── RingMovedError          the ring moved as a request opened its session: transient, retry
    │   ├── FleetBusyError          a stage has no room for another session
    │   └── SessionFailedError      a stage reported an error for this session
    │       └── SessionEvictedError     a parked session gave its place to a new one
    ├── ChatProtocolError      a chat request or event line is malformed (``code`` for the client)
    │   └── HTTPError               the same, for the OpenAI-style HTTP API (mapped to a status)
    ├── ChatEndpointError      no agent on this PC serves chats (the endpoint file is missing)
    ├── ChatAnswerError        the agent answered a chat with an error event
    ├── BenchError             a measurement or benchmark step failed (``shoal bench stages``, ``bench/``)
    ├── IdleSourceError        a donor's idle source cannot read on this PC (caught in ``agent.donor.idle``)
    └── ServiceError           ``shoal service``: the platform's service manager is missing or refused a step

Foreign exceptions (ssl, socket, OpenVINO, gguf, transformers) are mapped to these where they arrive,
with ``raise ... from exc``, so that the command line prints one line and exits non-zero.
"""

from __future__ import annotations


class ShoalError(Exception):
    """Root of every error shoal raises on purpose."""


class ConfigError(ShoalError, ValueError):
    """A configuration setting is invalid or missing."""


class SourceError(ShoalError):
    """The model source cannot be found or read."""


class UnsupportedModelError(SourceError, ValueError):
    """The checkpoint's architecture is not one shoal can export."""


class CorruptCheckpointError(SourceError):
    """A checkpoint file is truncated or malformed."""


class ExportError(ShoalError):
    """The export could not be completed."""


class MissingExtraError(ShoalError, ImportError):
    """A command needs packages of an optional extra that this install lacks."""

    def __init__(self, what: str, extra: str, missing: str) -> None:
        super().__init__(f"{what} needs the '{extra}' extra ({missing} is not installed): pip install 'shoal[{extra}]'")
        self.extra = extra


class ManifestError(ShoalError):
    """A manifest is missing, malformed or of an unsupported version."""


class IntegrityError(ManifestError):
    """A file on disk does not match what the manifest records."""


class RuntimeStageError(ShoalError):
    """A stage cannot be compiled or run."""


class PromptTooLongError(ShoalError, ValueError):
    """The prompt (plus the requested completion) does not fit the model's context. ``figures``: the prompt's
    tokens, the new tokens asked for (None: no limit named) and the context, so that each front end can word the
    refusal with its own name for the limit (:meth:`of`)."""

    def __init__(self, message: str, figures: dict[str, int | None] | None = None) -> None:
        super().__init__(message)
        self.figures = figures or {}

    @classmethod
    def of(cls, prompt_tokens: int, max_tokens: int | None, context_tokens: int, setting: str) -> PromptTooLongError:
        """The refusal of a ``prompt_tokens``-token prompt and ``max_tokens`` new tokens in ``context_tokens``,
        naming the limit as the asker knows it (``setting``: ``--max-tokens``, ``max_tokens``) where lowering it
        would do."""
        room = context_tokens - prompt_tokens
        if max_tokens is None or room < 1:
            text = (
                f"prompt of {prompt_tokens} tokens leaves no room for an answer in the {context_tokens}-token "
                "context; shorten the prompt"
            )
        else:
            text = (
                f"prompt of {prompt_tokens} tokens plus {max_tokens} new tokens exceeds the {context_tokens}-token "
                f"context; shorten the prompt or lower {setting} to {room} or less"
            )
        figures = {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "context_tokens": context_tokens}
        return cls(text, figures)

    @property
    def lowering_helps(self) -> bool:
        """Fewer new tokens would fit (else only a shorter prompt does)."""
        f = self.figures
        return f.get("max_tokens") is not None and (f.get("context_tokens") or 0) > (f.get("prompt_tokens") or 0)


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


class CertificateDatesError(PeerRefusedError):
    """The peer's certificate is not yet valid, or has expired, by this PC's clock: one of the two clocks is set
    wrong (or the certificate is due for renewal). ``discovery.clocks`` tells which, from the two PCs' times."""


class RingNotReadyError(PeerUnavailableError):
    """The plan's ring cannot answer yet; the message says which stage waits for what."""


class RingMovedError(PeerUnavailableError):
    """The head's connections to the ring were closed (the plan moved the ring, or the agent stops) just as a
    request opened its session: transient, the same request retried in a moment goes to the new ring."""


class FleetBusyError(RingError):
    """A stage already holds its configured maximum of sessions."""


class SessionFailedError(RingError):
    """A stage reported a failure for this session."""


class SessionEvictedError(SessionFailedError):
    """The session was parked between turns and a stage gave its place, or its KV blocks, to other sessions."""


class ChatProtocolError(ShoalError, ValueError):
    """A request or event line is malformed; ``code`` names the kind for the client, ``param`` the request field at
    fault (None when no one field is)."""

    def __init__(self, message: str, code: str = "bad_request", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


class HTTPError(ChatProtocolError):
    """A request to the OpenAI-style API is refused; ``code`` picks the HTTP status, ``param`` names the request
    field at fault (OpenAI's error ``param``; None when no one field is); ``answered``: the chat service answered
    the request with this error (and counted it), the API did not refuse it."""

    def __init__(self, code: str, message: str, param: str | None = None, *, answered: bool = False) -> None:
        super().__init__(message, code, param)
        self.answered = answered


class ChatEndpointError(ShoalError):
    """The endpoint file is missing or unreadable: no agent on this PC serves chats."""


class ChatAnswerError(ShoalError):
    """The agent answered a chat with an error event."""


class BenchError(ShoalError):
    """A measurement or benchmark step (an export or a measured run) failed."""


class IdleSourceError(ShoalError):
    """An idle source cannot read on this PC; the message says why, for people (and what to install or change).
    It never leaves ``agent.donor.idle``: a source turns it into its ``problem()``."""


class ServiceError(ShoalError):
    """``shoal service`` cannot install, query or remove the agent's service on this PC."""
