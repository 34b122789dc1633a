"""The prompt: a multi-line text area where Enter sends and ctrl+j (or shift+enter) starts a new line."""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter"})
"""Keys that start a new line: most terminals send ctrl+j for ctrl+enter; those that tell them apart send
shift+enter or alt+enter."""


class PromptInput(TextArea):
    """Where the user writes. Enter posts :class:`PromptInput.Submitted` with the text and clears the area; an
    empty prompt is not sent. Pasted text keeps its newlines."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "submit", "Send", id="send"),
        Binding("ctrl+j", "newline", "New line", id="newline", show=False),
    ]

    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.border_title = "Prompt"

    def on_mount(self) -> None:
        if self.app.is_headless:  # no one to see it blink; a blinking cursor would make screenshots differ
            self.cursor_blink = False

    async def _on_key(self, event: events.Key) -> None:
        # TextArea inserts a newline on Enter before bindings are looked at: take the keys first
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
        elif event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
        else:
            await super()._on_key(event)

    def action_submit(self) -> None:
        text = self.text.strip()
        if text:
            self.post_message(self.Submitted(self, text))
            self.clear()

    def action_newline(self) -> None:
        self.insert("\n")
