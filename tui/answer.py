"""One answer as it streams: its text, the time to its first token, its rate; what is kept of it once done."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.chat_client.protocol import ChatEvent


@dataclass
class AnswerTally:
    """What the TUI counts of the answer streaming now, on its own clock (``asked_at`` is when it sent the
    request): the agent's ``done`` event says how long generating took, not when the first token arrived."""

    asked_at: float
    first_token_at: float | None = None
    tokens: int = 0
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def token(self, text: str, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        self.tokens += 1
        self.parts.append(text)

    @property
    def ttft(self) -> float | None:
        """Seconds from the request to its first token (None before it)."""
        return None if self.first_token_at is None else self.first_token_at - self.asked_at

    def rate(self, now: float) -> float | None:
        """Tokens a second since the first token (None until there are two to time)."""
        if self.first_token_at is None or self.tokens < 2 or now <= self.first_token_at:
            return None
        return (self.tokens - 1) / (now - self.first_token_at)

    def finish(self, done: ChatEvent) -> dict[str, Any]:
        """The stats kept with the answer: the ``done`` event's (tokens/s as ``shoal ask`` counts it) and the
        time to the first token measured here; ``done.text`` (the held-back end) joins the text."""
        if done.text:
            self.parts.append(done.text)
        stats = done.stats
        tokens = int(stats.get("tokens", self.tokens))
        seconds = float(stats.get("seconds", 0.0))
        kept: dict[str, Any] = {
            "tokens": tokens,
            "seconds": round(seconds, 4),
            "tok_s": round(tokens / max(seconds, 1e-9), 2),
            "ttft": None if self.ttft is None else round(self.ttft, 4),
            "finish_reason": stats.get("finish_reason"),
            "drafted": stats.get("drafted", 0),
            "accepted": stats.get("accepted", 0),
        }
        if stats.get("replays"):
            kept["replays"] = stats["replays"]
        if stats.get("exact") is False:
            kept["exact"] = False
        return kept

    def stopped(self) -> dict[str, Any]:
        """The stats kept with an answer the user stopped."""
        return {"stopped": True, "tokens": self.tokens, "ttft": None if self.ttft is None else round(self.ttft, 4)}


def stats_line(stats: Mapping[str, Any] | None) -> str:
    """The line under an answer: ``42 tokens · first token 0.31 s · 38.5 tok/s · 30 of 41 drafted accepted``."""
    if not stats:
        return ""
    ttft = stats.get("ttft")
    first = f"first token {ttft:.2f} s" if isinstance(ttft, (int, float)) else "no token"
    if stats.get("stopped"):
        return f"stopped after {stats.get('tokens', 0)} tokens · {first}"
    parts = [f"{stats.get('tokens', 0)} tokens", first, f"{float(stats.get('tok_s', 0.0)):.1f} tok/s"]
    if stats.get("drafted"):
        parts.append(f"{stats.get('accepted', 0)} of {stats['drafted']} drafted accepted")
    if stats.get("finish_reason") == "length":
        parts.append("cut at max tokens")
    if stats.get("replays"):
        parts.append(f"ring replayed {stats['replays']}×")
    if stats.get("exact") is False:
        parts.append("not exact")
    return " · ".join(parts)
