"""An agent's configuration: read once from a TOML file and command-line flags."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from agent.runtime.stage import RuntimeConfig
from agent.wire.codec import DEFAULT_MAX_PAYLOAD
from shards.errors import ShoalError

WIRE_DTYPES = ("auto", "f32", "f16")


class ConfigError(ShoalError, ValueError):
    """The agent's configuration is invalid."""


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

    def __post_init__(self) -> None:
        if not self.stages or list(self.stages) != list(range(self.stages[0], self.stages[0] + len(self.stages))):
            raise ConfigError(f"stages must be consecutive indices, not {self.stages}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions must be at least 1")
        if self.wire_dtype not in WIRE_DTYPES:
            raise ConfigError(f"wire_dtype must be one of {WIRE_DTYPES}")


def load_agent_config(path: Path | None, overrides: dict[str, Any],
                      defaults: Mapping[str, Callable[[], Any]] | None = None) -> AgentConfig:
    """Settings from the TOML file ``path`` (if any), then ``overrides`` (flags that were given); a setting
    neither names comes from ``defaults`` (called only then: finding a default may fail, e.g. the node
    identity under the data dir).

    Keys: export_dir, stages (list or int), identity_dir, listen, next (``HOST:PORT``),
    device, threads, precision, fast_prefill, rewind, cache_dir, max_sessions, max_payload, wire_dtype, verify.
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
    if isinstance(values.get("listen"), str):
        values["listen"] = parse_address(values["listen"])
    if isinstance(values.get("next"), str):
        values["next"] = parse_address(values["next"]) if values["next"] else None
    try:
        return AgentConfig(runtime=runtime, **values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc

