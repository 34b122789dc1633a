"""The JSON bodies of control frames, as typed messages validated when they arrive."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from agent.errors import RemoteProtocolError, ShoalError
from agent.sampling.params import SamplingParams
from agent.wire.frames import Frame, FrameType
from agent.wire.jsonbody import loads_json

M = TypeVar("M", bound="Message")

ROLES = ("head", "stage", "status", "member", "admin", "clock")


@dataclass(frozen=True)
class Message:
    """Base of the JSON messages: ``to_frame`` / ``from_frame`` with field-by-field type checks."""

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls: type[M], body: bytes) -> M:
        try:
            data = loads_json(body)
        except ValueError as exc:  # UnicodeDecodeError and too deep a nesting too
            raise RemoteProtocolError(f"{cls.__name__}: body is not JSON") from exc
        if not isinstance(data, dict):
            raise RemoteProtocolError(f"{cls.__name__}: body is not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(data) - set(fields)
        if unknown:
            raise RemoteProtocolError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        values: dict[str, Any] = {}
        for name, f in fields.items():
            if name not in data:
                if f.default is dataclasses.MISSING:
                    raise RemoteProtocolError(f"{cls.__name__}: missing field {name!r}")
                continue
            values[name] = _checked(cls.__name__, name, str(f.type), data[name])
        try:
            return cls(**values)
        except (TypeError, ValueError, ShoalError) as exc:
            raise RemoteProtocolError(f"{cls.__name__}: {exc}") from exc


_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "int | None": (int, type(None)),
    "str | None": (str, type(None)),
    "list[int]": (list,),
}


def _checked(owner: str, name: str, annotation: str, value: Any) -> Any:
    allowed = _TYPES.get(annotation)
    if allowed is None:
        raise TypeError(f"{owner}.{name}: unsupported annotation {annotation}")
    bad_bool = isinstance(value, bool) and bool not in allowed
    if bad_bool or not isinstance(value, allowed):
        raise RemoteProtocolError(f"{owner}: field {name!r} must be {annotation}, got {type(value).__name__}")
    if annotation == "list[int]" and not all(
        isinstance(v, int) and not isinstance(v, bool) for v in cast(list[Any], value)
    ):
        raise RemoteProtocolError(f"{owner}: field {name!r} must be a list of integers")
    return value


@dataclass(frozen=True)
class Hello(Message):
    """First frame on a connection, both ways: who is speaking and what it holds."""

    node: str
    role: str
    """``head`` (drives sessions, receives results), ``stage`` (the previous stage), ``status``, ``member`` (a
    fleet member's control link: ``discovery.control``), ``admin`` (an admin's push), ``clock`` (a clock probe:
    two hellos, then goodbye)."""
    export_id: str = ""
    """Fingerprint of the export the speaker serves or drives; a ring only joins equal ones."""
    layer_start: int = 0
    layer_stop: int = 0
    is_last: bool = False
    head_id: int = 0
    """A head's id: the last stage sends the results of this head's sessions on this connection."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {self.role!r}")

    def to_frame(self) -> Frame:
        return Frame.message(FrameType.HELLO, self.to_json())


@dataclass(frozen=True)
class SessionOpen(Message):
    """Starts a session on every stage. Sampling settings matter to the last stage only."""

    head_id: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    logprobs: int | None = None
    """Log-probabilities with this many alternatives at each position, on every RESULT (None: none)."""

    def __post_init__(self) -> None:
        self.sampling  # noqa: B018 - validates the settings

    @classmethod
    def of(cls, head_id: int, params: SamplingParams) -> SessionOpen:
        """The OPEN of a session read out with ``params`` (its seed stays with the head)."""
        return cls(head_id, params.temperature, params.top_k, params.top_p, params.logprobs)

    @property
    def sampling(self) -> SamplingParams:
        """The settings the last stage's readout applies (seeds stay with the head)."""
        return SamplingParams(self.temperature, self.top_k, self.top_p, logprobs=self.logprobs)

    def to_frame(self, session: int) -> Frame:
        return Frame.message(FrameType.OPEN, self.to_json(), session=session)


ERROR_CODES = ("busy", "bad_request", "peer_lost", "stage_failed", "unknown_session", "evicted", "head_unreachable")
"""``evicted``: the session was parked (``FrameType.PARK``) and a stage gave its place to a new one."""


@dataclass(frozen=True)
class ErrorReport(Message):
    """Why a stage gave up a session; travels back up the ring to the head."""

    code: str
    message: str
    node: str = ""

    def __post_init__(self) -> None:
        if self.code not in ERROR_CODES:
            raise ValueError(f"unknown error code {self.code!r}")

    def to_frame(self, session: int) -> Frame:
        return Frame.message(FrameType.ERROR, self.to_json(), session=session)


def parse(frame: Frame, cls: type[M]) -> M:
    """The message a control frame carries, validated."""
    return cls.from_json(frame.body())
