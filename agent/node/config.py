"""An agent's configuration: read once from a TOML file and command-line flags."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.head.drafters import DRAFTERS
from agent.runtime.config import RuntimeConfig
from agent.wire.codec import DEFAULT_MAX_PAYLOAD

WIRE_DTYPES = ("auto", "f32", "f16")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"address {text!r} is not HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass(frozen=True)
class AgentConfig:
    """What one ``shoal agent`` serves and how."""

    export_dir: Path
    stages: tuple[int, ...]
    """Indices of the consecutive stages this agent serves."""
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

    def __post_init__(self) -> None:
        if not self.stages or list(self.stages) != list(range(self.stages[0], self.stages[0] + len(self.stages))):
            raise ConfigError(f"stages must be consecutive indices, not {self.stages}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions must be at least 1")
        if self.wire_dtype not in WIRE_DTYPES:
            raise ConfigError(f"wire_dtype must be one of {WIRE_DTYPES}")
        if self.chat is not None:
            _require_loopback("the chat endpoint", self.chat)
            if self.chat_file is None:
                raise ConfigError("chat_file is needed with chat")
            if self.stages[0] != 0 and self.ring_first is None:
                raise ConfigError(
                    "an agent that does not serve stage 0 needs ring_first (stage 0's address) to head chats"
                )
        if self.http is not None:
            if self.chat is None:
                raise ConfigError("http needs chat: its requests carry the chat endpoint's token")
            _require_loopback("the HTTP API", self.http)
        if self.chat_keep < 0 or self.chat_keep_max < 0:
            raise ConfigError("chat_keep and chat_keep_max must not be negative")
        if self.drafter not in DRAFTERS:
            raise ConfigError(f"drafter must be one of {', '.join(DRAFTERS)}, not {self.drafter!r}")


def _require_loopback(what: str, address: tuple[str, int]) -> None:
    if address[0] not in LOOPBACK:
        raise ConfigError(f"{what} is for clients on this PC: listen on loopback (127.0.0.1), not {address[0]}")


def load_agent_config(
    path: Path | None, overrides: dict[str, Any], defaults: Mapping[str, Callable[[], Any]] | None = None
) -> AgentConfig:
    """Settings from the TOML file ``path`` (if any), then ``overrides`` (flags that were given); a setting
    neither names comes from ``defaults`` (called only then: finding a default may fail, e.g. the node
    identity under the data dir).

    Keys: export_dir, stages (list or int), identity_dir, listen, next (``HOST:PORT``),
    device, threads, precision, fast_prefill, rewind, cache_dir, max_sessions, max_payload, wire_dtype, verify,
    chat, http, chat_file, ring_first, ring_last (``HOST:PORT``), drafter, chat_keep, chat_keep_max.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(path.read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key, default in (defaults or {}).items():
        if key not in values:
            values[key] = default()
    runtime_keys = {f.name for f in fields(RuntimeConfig)}
    runtime = RuntimeConfig()
    runtime_values = {k: values.pop(k) for k in list(values) if k in runtime_keys}
    if "cache_dir" in runtime_values:
        runtime_values["cache_dir"] = Path(runtime_values["cache_dir"])
    runtime = replace(runtime, **runtime_values)
    known = {f.name for f in fields(AgentConfig)}
    unknown = set(values) - known
    if unknown:
        raise ConfigError(f"unknown agent settings: {', '.join(sorted(unknown))}")
    for required in ("export_dir", "stages", "identity_dir"):
        if required not in values:
            raise ConfigError(f"agent setting {required!r} is missing (flag or config file)")
    stages = values["stages"]
    values["stages"] = tuple(stages) if isinstance(stages, (list, tuple)) else (int(stages),)
    values["export_dir"] = Path(values["export_dir"])
    values["identity_dir"] = Path(values["identity_dir"])
    for key in ("listen", "next", "chat", "http", "ring_first", "ring_last"):
        if isinstance(values.get(key), str):
            values[key] = parse_address(values[key]) if values[key] else None
    if values.get("chat_file") is not None:
        values["chat_file"] = Path(values["chat_file"])
    try:
        return AgentConfig(runtime=runtime, **values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
