"""What an agent says about itself: its :class:`Announcement`, the same in mDNS TXT and on the control channel.

An announcement is a claim, never a proof. mDNS can be spoofed by anyone on the LAN, so it carries no
secret, and nothing it says is trusted until the peer has passed the mutual-TLS handshake: the control
channel then checks that the node id and fingerprint the peer announces are its certificate's own.

TXT layout (schema 1). Every entry is ``key=value`` and at most 255 bytes (RFC 6763 §6.1)::

    s    schema version (this module's SCHEMA)
    id   node id (derived from the node certificate's public key)
    n    node name (the certificate's common name), for people
    f    fleet id (derived from the fleet CA's public key)
    fp   sha256 fingerprint of the node certificate
    v    software version      p   wire protocol version
    port the agent's port (ring and control channel)
    i    instance: random per process start     t   process start, Unix seconds (for people only: which of two
         processes with one identity keeps it is decided on their control link, by no wall clock)
    q    sequence number, raised on every change (a receiver keeps the newest)
    dev  OpenVINO devices, comma-separated      mem MiB it can give a shard   spd measured speed (GFLOP/s)
    st   stages held, ``index:state`` comma-separated (state: cached, downloading, compiling, ready, standby), a
         download with its progress as ``index:downloading@percent``
    d    donor state (``agent.donor.policy``): serving; draining (its user is back, or it may not serve now:
         it takes no new work and its stage moves away); away (its user is here); off (not allowed now: battery,
         schedule, the load of other programs, no way to tell idleness)
    w    why the agent's stage is stuck, if it is: its last failure (a mirror that cannot be reached, a file that
         fails its check), cut to fit; absent when nothing failed. Peers name it where they say a stage waits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.errors import RemoteProtocolError
from agent.fleet.authority import FINGERPRINT_RE, FLEET_ID_RE, NODE_ID_RE, NODE_NAME_RE

SCHEMA = 1
"""Version of the announcement's layout; a peer announcing another is listed as foreign."""
SERVICE_TYPE = "_shoal._tcp.local."
MAX_ENTRY = 255
"""RFC 6763 §6.1: each TXT string holds at most 255 bytes, ``key=value`` included."""
MAX_PROBLEM = MAX_ENTRY - len("w=")
"""Bytes (UTF-8) of ``w``, the stage's last failure: with its key it fills at most one TXT entry."""

STAGE_STATES = ("cached", "downloading", "compiling", "ready", "standby")
DONOR_STATES = ("serving", "draining", "away", "off")
"""What a donor PC's owner allows now; only a ``serving`` PC is given a stage or a standby (``discovery.placement``)."""

_INSTANCE = re.compile(r"[0-9a-f]{8,32}")
_DEVICE = re.compile(r"[A-Z][A-Z0-9._]{0,31}")
_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,32}")


@dataclass(frozen=True)
class HeldStage:
    """One stage an agent holds, and how far it is with it."""

    index: int
    state: str
    percent: int | None = None
    """How much of the stage's files is downloaded (0-100), while ``state`` is ``downloading``."""

    def __post_init__(self) -> None:
        if self.index < 0 or self.state not in STAGE_STATES:
            raise ValueError(f"a held stage is an index and one of {STAGE_STATES}, not {self.index}:{self.state}")
        if self.percent is not None and (self.state != "downloading" or not 0 <= self.percent <= 100):
            raise ValueError(f"only a download has a percent from 0 to 100, not {self.state}@{self.percent}")

    def describe(self) -> str:
        """For people and the status: ``downloading 42 %``, ``ready``."""
        return self.state if self.percent is None else f"{self.state} {self.percent} %"

    def to_text(self) -> str:
        """The stage's entry of the ``st`` TXT property."""
        return f"{self.index}:{self.state}" + ("" if self.percent is None else f"@{self.percent}")

    @classmethod
    def from_text(cls, text: str) -> HeldStage:
        """Parse one entry of ``st`` (raises ``ValueError``)."""
        index, _, state = text.partition(":")
        state, _, percent = state.partition("@")
        return cls(int(index), state, int(percent) if percent else None)


@dataclass(frozen=True)
class Announcement:
    """Who an agent is, where it listens, and what it can give (see the module docstring for the fields)."""

    node: str
    name: str
    fleet: str
    fingerprint: str
    version: str
    protocol: int
    port: int
    instance: str
    started: int
    """Unix seconds the agent's process started, by its wall clock: for people, never to decide anything (a
    copy's clock may be minutes off; ``discovery.membership.outranks`` decides between copies)."""
    sequence: int = 0
    devices: tuple[str, ...] = ()
    memory_mb: int = 0
    speed: float = 0.0
    stages: tuple[HeldStage, ...] = ()
    donor: str = "serving"
    problem: str = ""
    """Why this agent's stage is stuck (its last failure, at most ``MAX_PROBLEM`` bytes); empty: nothing."""
    schema: int = field(default=SCHEMA)

    def __post_init__(self) -> None:
        _require(self.schema >= 1, "schema", self.schema)
        _require(bool(NODE_ID_RE.fullmatch(self.node)), "node id", self.node)
        _require(bool(NODE_NAME_RE.fullmatch(self.name)), "name", self.name)
        _require(bool(FLEET_ID_RE.fullmatch(self.fleet)), "fleet id", self.fleet)
        _require(bool(FINGERPRINT_RE.fullmatch(self.fingerprint)), "fingerprint", self.fingerprint)
        _require(bool(_VERSION.fullmatch(self.version)), "version", self.version)
        _require(bool(_INSTANCE.fullmatch(self.instance)), "instance", self.instance)
        _require(0 < self.port < 65536, "port", self.port)
        _require(self.protocol >= 1 and self.started >= 0 and self.sequence >= 0, "counters", self.sequence)
        _require(all(_DEVICE.fullmatch(d) for d in self.devices), "devices", self.devices)
        _require(self.memory_mb >= 0 and self.speed >= 0, "resources", (self.memory_mb, self.speed))
        _require(self.donor in DONOR_STATES, "donor state", self.donor)
        _require(len(self.problem.encode()) <= MAX_PROBLEM and self.problem.isprintable(), "problem", self.problem)

    def changed(self, **changes: Any) -> Announcement:
        """This announcement with ``changes`` and the next sequence number (receivers keep the newest)."""
        return replace(self, sequence=self.sequence + 1, **changes)

    def to_properties(self) -> dict[str, str]:
        """The TXT properties; :class:`RemoteProtocolError` if an entry would not fit 255 bytes."""
        properties = {
            "s": str(self.schema),
            "id": self.node,
            "n": self.name,
            "f": self.fleet,
            "fp": self.fingerprint,
            "v": self.version,
            "p": str(self.protocol),
            "port": str(self.port),
            "i": self.instance,
            "t": str(self.started),
            "q": str(self.sequence),
            "dev": ",".join(self.devices),
            "mem": str(self.memory_mb),
            "spd": f"{self.speed:.1f}",
            "st": ",".join(s.to_text() for s in self.stages),
            "d": self.donor,
        }
        if self.problem:
            properties["w"] = self.problem
        for key, value in properties.items():
            if len(key.encode()) + 1 + len(value.encode()) > MAX_ENTRY:
                raise RemoteProtocolError(f"TXT entry {key!r} is longer than {MAX_ENTRY} bytes")
        return properties

    @classmethod
    def from_properties(cls, properties: Mapping[Any, Any]) -> Announcement:
        """Read TXT properties (``bytes`` or ``str`` keys and values, as zeroconf or JSON give them).

        Any mistake raises :class:`RemoteProtocolError`, never another exception: this reads what any host on
        the LAN may send.
        """
        text = {_text(k): _text(v) for k, v in properties.items()}
        try:
            schema = int(text.get("s", "0"))
            if schema != SCHEMA:
                # a newer or older layout: what it calls its fields is unknown, so only the ids are read
                return _foreign_schema(schema, text)
            return cls(
                schema=schema,
                node=text["id"],
                name=text["n"],
                fleet=text["f"],
                fingerprint=text["fp"],
                version=text["v"],
                protocol=int(text["p"]),
                port=int(text["port"]),
                instance=text["i"],
                started=int(text["t"]),
                sequence=int(text["q"]),
                devices=tuple(d for d in text.get("dev", "").split(",") if d),
                memory_mb=int(text.get("mem", "0")),
                speed=float(text.get("spd", "0")),
                stages=tuple(HeldStage.from_text(s) for s in text.get("st", "").split(",") if s),
                donor=text.get("d", "serving"),
                problem=text.get("w", ""),
            )
        except RemoteProtocolError:
            raise
        except (KeyError, ValueError) as exc:
            raise RemoteProtocolError(f"announcement does not follow schema {SCHEMA}: {exc}") from exc


def problem_text(message: str) -> str:
    """``message`` as an announcement's ``problem``: one printable line, cut to ``MAX_PROBLEM`` bytes."""
    line = "".join(c if c.isprintable() else "?" for c in " ".join(message.split()))
    if len(line.encode()) <= MAX_PROBLEM:
        return line
    cut = line.encode()[: MAX_PROBLEM - len("…".encode())].decode(errors="ignore")
    return cut + "…"


def _foreign_schema(schema: int, text: dict[str, str]) -> Announcement:
    """An announcement of another schema: kept with what it names, so that it is listed (as foreign)."""
    if schema < 1:
        raise RemoteProtocolError(f"announcement without a schema version ({text.get('s')!r})")
    try:
        return Announcement(
            schema=schema,
            node=text["id"],
            name=text.get("n", "unknown"),
            fleet=text["f"],
            fingerprint=text.get("fp", "sha256:" + "0" * 64),
            version=text.get("v", "unknown"),
            protocol=int(text.get("p", "1")),
            port=int(text["port"]),
            instance=text.get("i", "0" * 8),
            started=int(text.get("t", "0")),
        )
    except (KeyError, ValueError) as exc:
        raise RemoteProtocolError(f"announcement of schema {schema} without a readable node id and port") from exc


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise RemoteProtocolError("announcement entry is not UTF-8") from exc
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RemoteProtocolError(f"announcement entry is {type(value).__name__}, not text")
    return value


def _require(ok: bool, what: str, value: object) -> None:
    if not ok:
        raise RemoteProtocolError(f"announcement has an invalid {what}: {value!r}")
