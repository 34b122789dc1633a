"""The line above the footer: the fleet's state on the left, the chat's on the right."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import Label

Severity = Literal["ok", "warning", "error"]
_MARK = {"ok": "●", "warning": "▲", "error": "✗"}


class StatusLine(Horizontal):
    """Where errors show besides their notification: the fleet (ring ready, a stage uncovered, the agent
    unreachable) and the chat (streaming and its rate, stopped, the last answer's error)."""

    fleet: reactive[tuple[str, Severity]] = reactive(("asking the agent…", "warning"))
    """What the fleet report says, and how bad it is."""
    chat: reactive[tuple[str, Severity]] = reactive(("", "ok"))
    """What the chat is doing, and how bad it is."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._fleet = Label(id="status-fleet", markup=False)
        self._chat = Label(id="status-chat", markup=False)

    def compose(self) -> ComposeResult:
        yield self._fleet
        yield self._chat

    def watch_fleet(self, fleet: tuple[str, Severity]) -> None:
        self._show(self._fleet, *fleet)

    def watch_chat(self, chat: tuple[str, Severity]) -> None:
        self._show(self._chat, *chat)

    def _show(self, label: Label, text: str, severity: Severity) -> None:
        label.update(f"{_MARK[severity]} {text}" if text else "")
        for name in _MARK:
            label.set_class(name == severity, f"-{name}")
