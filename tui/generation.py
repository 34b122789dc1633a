"""How the TUI asks for its answers: the generation settings of a chat request, checked when built."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from agent.chat_client.protocol import ChatRequest
from agent.errors import ConfigError

Turn = tuple[str, str]
"""One message of a conversation: (role, content), role ``user`` or ``assistant`` (``system`` first, if any)."""


@dataclass(frozen=True)
class GenerationSettings:
    """The sampling fields of a :class:`ChatRequest` that the settings dialog edits (greedy by default)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k cut."""
    max_tokens: int = 512
    seed: int | None = None
    """None: the agent draws one (a sampled answer is then not repeatable)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise ConfigError("temperature must be between 0 (greedy) and 5")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top-p must be above 0 and at most 1")
        if self.top_k < 0:
            raise ConfigError("top-k must be 0 (off) or more")
        if self.max_tokens < 1:
            raise ConfigError("max tokens must be at least 1")
        if self.seed is not None and self.seed < 0:
            raise ConfigError("the seed must be 0 or more, or empty for a random one")

    def request(self, token: str, messages: Sequence[Turn]) -> ChatRequest:
        """The chat request of ``messages`` (oldest first, the user's last) with these settings."""
        return ChatRequest(
            token=token,
            messages=tuple(messages),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> GenerationSettings:
        """Settings saved by an earlier run; anything unreadable falls back to the defaults (never an error
        at start-up for a file the user did not write by hand)."""
        if not isinstance(data, Mapping):
            return cls()
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (ConfigError, TypeError):
            return cls()

    @classmethod
    def parse(cls, *, temperature: str, top_p: str, top_k: str, max_tokens: str, seed: str) -> GenerationSettings:
        """Settings from the dialog's text fields; :class:`ConfigError` names the field that is wrong."""
        return cls(
            temperature=_number(temperature, "temperature", float),
            top_p=_number(top_p, "top-p", float),
            top_k=_number(top_k, "top-k", int),
            max_tokens=_number(max_tokens, "max tokens", int),
            seed=_number(seed, "seed", int) if seed.strip() else None,
        )

    def describe(self) -> str:
        """One line for the status bar: ``greedy · 512 tokens`` or ``T 0.7 · top-p 0.9 · seed 3 · 512 tokens``."""
        parts = ["greedy"] if self.temperature == 0 else [f"T {self.temperature:g}"]
        if self.temperature > 0 and self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        if self.temperature > 0 and self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        parts.append(f"{self.max_tokens} tokens")
        return " · ".join(parts)


def _number(text: str, name: str, kind: type[int] | type[float]) -> Any:
    try:
        return kind(text.strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{name} must be {what}, not {text.strip()!r}") from None
