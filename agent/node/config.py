"""An agent's configuration: read once from a TOML file and command-line flags."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.addresses import parse_address
from agent.donor.policy import DonorSettings
from agent.errors import ConfigError
from agent.head.drafters import DRAFTERS
from agent.head.prefill import DEFAULT_PREFILL_CHUNK
from agent.runtime.config import KNOWN_DEVICES, KV_MODES, PRECISIONS, PREFILL_ATTENTIONS, REWINDS, RuntimeConfig
from agent.runtime.packer import DEFAULT_BUDGET, PackPolicy
from agent.runtime.repeatable import ALIKE_MIN_PROMPT
from agent.transport.heartbeat import Liveness
from agent.wire.codec import DEFAULT_MAX_PAYLOAD
from discovery.placement import kv_pool_positions
from shards.manifest import Manifest

WIRE_DTYPES = ("auto", "f32", "f16")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class AgentConfig:
    """What one ``shoal agent`` serves and how."""

    export_dir: Path | None
    """The export whose stages this agent serves (a hand-wired ring); None for the normal way to run, a member of
    a self-forming fleet: it serves what the fleet plan gives it, fetched from the model the fleet document
    names (``agent.node.ring_former``), and heads chats through the plan's ring."""
    stages: tuple[int, ...]
    """Indices of the consecutive stages this agent serves; none for a PC that only heads its user's chats
    (it then needs ``chat``, ``ring_first`` and ``ring_last``), or that only is a member."""
    identity_dir: Path
    """Folder with this node's ``cert.pem``, ``key.pem`` and the fleet's ``ca.pem``."""
    listen: tuple[str, int] = ("127.0.0.1", 0)
    next: tuple[str, int] | None = None
    """The successor stage's address; None for the last stage."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    max_sessions: int = 8
    max_payload: int = DEFAULT_MAX_PAYLOAD
    wire_dtype: str = "auto"
    """Hidden states on the wire: ``auto`` (the dtype the stage computes in: f16 where the device computes
    in f16, else f32; never rounds), ``f32``, or ``f16`` (half the bytes; rounds f32 values)."""
    verify: bool = True
    """Check the stage files' sha256 against the manifest at start-up."""
    chat: tuple[str, int] | None = None
    """Loopback address of this agent's chat endpoint (``agent.chat``): the agent is then the head of the
    conversations asked of it there. None: no chats."""
    http: tuple[str, int] | None = None
    """Loopback address of an OpenAI-style HTTP API for the same chats (``agent.chat.openai_http``)."""
    metrics: tuple[str, int] | None = None
    """Address of this agent's own Prometheus ``/metrics`` endpoint (``agent.metrics.endpoint``), for any agent,
    a stage-only one included: plain HTTP on loopback, elsewhere HTTPS that requires a fleet certificate."""
    chat_file: Path | None = None
    """Where the chat endpoint's address and access token are written for local clients."""
    ring_first: tuple[str, int] | None = None
    """For chats on an agent that does not serve stage 0: the address of stage 0."""
    ring_last: tuple[str, int] | None = None
    """For chats: the last stage's address (default: ``next``, right for a ring of two agents)."""
    drafter: str = "ngram"
    """The drafter of this agent's chats (``agent.head.drafting.make_drafter``)."""
    chat_keep: float = 120.0
    """Seconds a finished chat's session stays on the stages for the conversation's next turn, which then
    computes only its new message (``agent.chat.kept``); 0: every turn starts afresh."""
    chat_keep_max: int = 1
    """Chat sessions kept at once: each holds a place on every stage of the ring while it waits."""
    heartbeat_interval: float = 1.0
    """Seconds between heartbeats on each ring link this agent dials (``agent.transport.heartbeat``)."""
    link_timeout: float = 5.0
    """A ring peer silent this long (a frozen agent, a network gone) is lost; its sessions fail or replay."""
    step_timeout: float = 30.0
    """Seconds a chat's step waits for its answer, plus 0.1 s per position it carries (a prompt), before the
    session is given up (``agent.head.ring_client.StepDeadline``)."""
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    """Positions per chunk of a long prompt that this agent's chats pipeline through the ring (0: a prompt
    is one step; ``agent.head.prefill``)."""
    pack_budget: int = DEFAULT_BUDGET
    """Rows per packed inference of this agent's stages where they keep paged KV (``kv = "paged"``): the ready
    steps of several sessions go through them together, decode rows first, then prompt chunks of this many positions
    (``agent.runtime.packer``); 0, or stages keeping their own KV state: one step at a time, in arrival order."""
    pack_window: float = 0.0
    """Seconds a stage that sat idle waits after a step arrives for others to pack with it (0: it packs what is
    queued at once)."""
    peers: tuple[tuple[str, int], ...] = ()
    """Fleet members to dial at start (``--peer``): where multicast does not carry, one is enough."""
    mdns: bool = True
    """Announce and browse over mDNS (off by itself when the agent listens on loopback only)."""
    lost_after: float = 10.0
    """Seconds a fleet member may stay unheard before it counts as lost (``discovery.membership``)."""
    shards_dir: Path | None = None
    """Where a fleet agent caches the shards it downloads (None: the shared Hugging Face cache)."""
    offer_mb: int | None = None
    """MiB of memory this PC gives the fleet for a shard (None: what it measures free); 0 for a PC that only
    heads its user's chats and never serves a stage."""
    donor: DonorSettings | None = None
    """A donor's PC (``--donor``, or a ``[donor]`` table in agent.toml): it serves only while its owner is away
    and allowed (``agent.donor.policy``), at the lowest priority (``agent.node.background``). None: a PC given
    to the fleet, which serves whenever the agent runs."""
    speed: float | None = None
    """This PC's speed figure for the plan, in GFLOP/s (None: measured once running). An admin who knows a PC
    is busier than a benchmark shows gives it here; equal figures keep a fleet of alike PCs from moving a
    stage on the noise of a measurement."""

    @property
    def liveness(self) -> Liveness:
        return Liveness(self.heartbeat_interval, self.link_timeout)

    @property
    def packing(self) -> PackPolicy | None:
        """How this agent's stages pack the steps of several sessions (None: they do not)."""
        return PackPolicy(self.pack_budget, self.pack_window) if self.pack_budget else None

    def __post_init__(self) -> None:
        if self.export_dir is None:
            if self.stages or self.next is not None or self.ring_first is not None or self.ring_last is not None:
                raise ConfigError(
                    "stages and ring addresses (--stage, --next, --ring-first, --ring-last) wire a ring by hand, "
                    "which needs the export (export_dir, the agent's first argument); without one the fleet plan "
                    "decides them"
                )
        elif not self.stages:
            if self.chat is None or self.ring_first is None or self.ring_last is None:
                raise ConfigError(
                    "an agent that serves no stage heads chats only: give it chat, ring_first and ring_last "
                    "(--chat, --ring-first, --ring-last), or the stages it serves (--stage)"
                )
        elif list(self.stages) != list(range(self.stages[0], self.stages[0] + len(self.stages))):
            raise ConfigError(f"stages must be consecutive indices, not {self.stages}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions must be at least 1")
        if self.pack_budget != 0 and self.pack_budget < ALIKE_MIN_PROMPT:
            raise ConfigError(f"pack_budget must be 0 (no packing) or at least {ALIKE_MIN_PROMPT} rows")
        if self.pack_window < 0:
            raise ConfigError("pack_window must be 0 or more seconds")
        if self.wire_dtype not in WIRE_DTYPES:
            raise ConfigError(f"wire_dtype must be one of {WIRE_DTYPES}")
        if self.chat is not None:
            _require_loopback("the chat endpoint", self.chat)
            if self.chat_file is None:
                raise ConfigError("chat_file is needed with chat")
            if self.stages and self.stages[0] != 0 and self.ring_first is None:
                raise ConfigError(
                    "an agent that does not serve stage 0 needs ring_first (stage 0's address) to head chats"
                )
        if self.http is not None:
            if self.chat is None:
                raise ConfigError("http needs chat: its requests carry the chat endpoint's token")
            _require_loopback("the HTTP API", self.http)
        if self.chat_keep < 0 or self.chat_keep_max < 0:
            raise ConfigError("chat_keep and chat_keep_max must not be negative")
        Liveness(self.heartbeat_interval, self.link_timeout)  # refuses an interval that does not fit the timeout
        if self.lost_after <= 0:
            raise ConfigError("lost_after must be a positive number of seconds")
        if self.drafter not in DRAFTERS:
            raise ConfigError(f"drafter must be one of {', '.join(DRAFTERS)}, not {self.drafter!r}")


def _require_loopback(what: str, address: tuple[str, int]) -> None:
    if address[0] not in LOOPBACK:
        raise ConfigError(f"{what} is for clients on this PC: listen on loopback (127.0.0.1), not {address[0]}")


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"agent setting {name!r} must be a non-empty string, not {value!r}")
    return value


def _path(name: str, value: Any) -> Path:
    return value if isinstance(value, Path) else Path(_text(name, value))


def _optional_path(name: str, value: Any) -> Path | None:
    return None if value is None else _path(name, value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"agent setting {name!r} must be true or false, not {value!r}")
    return value


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"agent setting {name!r} must be a whole number, not {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise ConfigError(f"agent setting {name!r} must be {bounds}, not {value}")
        return value

    return parse


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"agent setting {name!r} must be a number of seconds, 0 or more, not {value!r}")
    return float(value)


def _speed(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"agent setting {name!r} must be a speed in GFLOP/s, above 0, not {value!r}")
    return float(value)


def _choice(options: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        if value not in options:
            raise ConfigError(f"agent setting {name!r} must be one of {', '.join(options)}, not {value!r}")
        return str(value)

    return parse


def _address(name: str, value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple):
        return value
    if value == "":
        return None
    text = _text(name, value)
    try:
        return parse_address(text)
    except ConfigError as exc:
        raise ConfigError(f"agent setting {name!r}: {exc}") from exc


def _addresses(name: str, value: Any) -> tuple[tuple[str, int], ...]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return tuple(a for a in (_address(name, item) for item in items) if a is not None)


def _stages(name: str, value: Any) -> tuple[int, ...]:
    indices = value if isinstance(value, (list, tuple)) else [value]  # [] or (): a head holding no stage
    return tuple(_whole(0)(name, index) for index in indices)


def _threads(name: str, value: Any) -> int | None:
    return None if value is None else _whole(0)(name, value)


def _device(name: str, value: Any) -> str:
    device = _text(name, value)
    if device.upper().split(".")[0] not in KNOWN_DEVICES:
        raise ConfigError(f"agent setting {name!r} must be one of {', '.join(KNOWN_DEVICES)}, not {value!r}")
    return device


def _donor(name: str, value: Any) -> DonorSettings | None:
    """``true`` (the defaults), a table of donor settings, or ``false``/absent (not a donor's PC)."""
    if value is None or value is False:
        return None
    if value is True:
        return DonorSettings()
    if isinstance(value, Mapping):
        return DonorSettings.from_mapping(value)
    raise ConfigError(f"agent setting {name!r} must be true, false or a table of donor settings, not {value!r}")


_SETTINGS: dict[str, Callable[[str, Any], Any]] = {
    "export_dir": _optional_path,
    "stages": _stages,
    "identity_dir": _path,
    "listen": _address,
    "next": _address,
    "max_sessions": _whole(1),
    "max_payload": _whole(1024),
    "wire_dtype": _choice(WIRE_DTYPES),
    "verify": _flag,
    "chat": _address,
    "http": _address,
    "metrics": _address,
    "chat_file": _path,
    "ring_first": _address,
    "ring_last": _address,
    "drafter": _choice(DRAFTERS),
    "chat_keep": _seconds,
    "chat_keep_max": _whole(0),
    "heartbeat_interval": _seconds,
    "link_timeout": _seconds,
    "step_timeout": _seconds,
    "prefill_chunk": _whole(0, 65535),
    "pack_budget": lambda name, value: 0 if value == 0 else _whole(ALIKE_MIN_PROMPT, 65535)(name, value),
    "pack_window": _seconds,
    "peers": _addresses,
    "mdns": _flag,
    "lost_after": _seconds,
    "shards_dir": _optional_path,
    "offer_mb": lambda name, value: None if value is None else _whole(0)(name, value),
    "speed": lambda name, value: None if value is None else _speed(name, value),
    "donor": _donor,
}
"""Every agent setting and how its value is read and checked (a message names the setting)."""
_RUNTIME_SETTINGS: dict[str, Callable[[str, Any], Any]] = {
    "device": _device,
    "threads": _threads,
    "cache_dir": _path,
    "precision": _choice(PRECISIONS),
    "tune_precision": _flag,
    "fast_prefill": _flag,
    "prefill_attention": _choice(PREFILL_ATTENTIONS),
    "rewind": _choice(REWINDS),
    "kv": _choice(KV_MODES),
    "kv_positions": _whole(1),
}


def load_agent_config(
    path: Path | None, overrides: dict[str, Any], defaults: Mapping[str, Callable[[], Any]] | None = None
) -> AgentConfig:
    """Settings from the TOML file ``path`` (if any), then ``overrides`` (flags that were given); a setting
    neither names comes from ``defaults`` (called only then: finding a default may fail, e.g. the node
    identity under the data dir). Every value is checked here, its type and range, and a mistake raises
    ``ConfigError`` naming the setting.

    Keys: export_dir, stages (list or int), identity_dir, listen, next (``HOST:PORT``), device, threads,
    precision, fast_prefill, prefill_attention, rewind, kv, kv_positions, cache_dir, max_sessions, max_payload,
    wire_dtype, verify, chat, http, metrics, chat_file, ring_first, ring_last (``HOST:PORT``), drafter, chat_keep,
    chat_keep_max, heartbeat_interval, link_timeout, step_timeout, prefill_chunk, pack_budget, pack_window,
    peers (list of ``HOST:PORT``), mdns,
    lost_after, shards_dir, offer_mb, speed, donor (true, or a table: ``agent.donor.policy.DonorSettings``).
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(path.read_text()))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    if overrides.get("donor") is True and isinstance(values.get("donor"), Mapping):
        overrides = {**overrides, "donor": None}  # --donor with a [donor] table: the table's settings
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key, default in (defaults or {}).items():
        if key not in values:
            values[key] = default()
    unknown = set(values) - set(_SETTINGS) - set(_RUNTIME_SETTINGS)
    if unknown:
        raise ConfigError(f"unknown agent settings: {', '.join(sorted(unknown))}")
    if "identity_dir" not in values:
        raise ConfigError("agent setting 'identity_dir' is missing (flag or config file)")
    values.setdefault("export_dir", None)
    if values["export_dir"] is not None and "stages" not in values and "chat" not in values:
        raise ConfigError(
            "agent setting 'stages' is missing (flag or config file); an agent that serves no stage "
            "must head chats (chat, ring_first, ring_last)"
        )
    values.setdefault("stages", ())
    runtime = RuntimeConfig(
        **{k: _RUNTIME_SETTINGS[k](k, values.pop(k)) for k in list(values) if k in _RUNTIME_SETTINGS}
    )
    return AgentConfig(runtime=runtime, **{k: _SETTINGS[k](k, v) for k, v in values.items()})


def stage_runtime(config: AgentConfig, manifest: Manifest, indices: Sequence[int], offer_mb: int) -> RuntimeConfig:
    """The runtime settings this agent compiles stages ``indices`` of ``manifest`` with: where no ``kv_positions``
    was set, a paged KV pool sized from the ``offer_mb`` MiB this PC offers and its ``max_sessions``
    (``discovery.placement.kv_pool_positions``)."""
    runtime = config.runtime
    if runtime.kv_positions is not None or not indices:
        return runtime
    positions = kv_pool_positions(manifest, indices, offer_mb, config.max_sessions)
    return replace(runtime, kv_positions=positions)
