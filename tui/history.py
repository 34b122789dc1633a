"""The list of past conversations: Enter resumes one, Delete removes one, Esc goes back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from tui.store import ConversationSummary


def ago(seconds: float) -> str:
    """``just now``, ``5 min ago``, ``3 h ago``, ``2 days ago``."""
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    days = seconds // 86400
    return f"{days:.0f} day{'s' if days >= 2 else ''} ago"


class HistoryScreen(ModalScreen[int | None]):
    """Dismissed with the id of the conversation to resume, or None. Deleting posts :class:`Delete` (the app
    deletes it from the store) and takes the line away at once."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Back", id="history.close"),
        Binding("delete,ctrl+d", "delete", "Delete", id="history.delete"),
    ]

    class Delete(Message):
        def __init__(self, conversation: int) -> None:
            super().__init__()
            self.conversation = conversation

    def __init__(self, conversations: Sequence[ConversationSummary], now: float) -> None:
        """``now``: the wall clock, to say how long ago each conversation changed."""
        super().__init__()
        self.conversations = list(conversations)
        self.now = now

    def compose(self) -> ComposeResult:
        with Vertical(id="history-dialog") as dialog:
            dialog.border_title = "Conversations"
            yield OptionList(*(self._option(c) for c in self.conversations), id="history-list")
            yield Label("No conversation yet.", id="history-empty")
            yield Label("enter resume · delete remove · esc back", id="history-help")

    def on_mount(self) -> None:
        self._show_empty()

    def _option(self, conversation: ConversationSummary) -> Option:
        when = ago(max(self.now - conversation.updated, 0.0))
        turns = conversation.messages // 2
        meta = f"  {when} · {turns} turn{'s' if turns != 1 else ''}"
        return Option(Text.assemble(conversation.title, (meta, "dim")), id=str(conversation.id))

    def _show_empty(self) -> None:
        self.query_one("#history-empty").display = not self.conversations
        self.query_one("#history-list").display = bool(self.conversations)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        index = options.highlighted
        if index is None:
            return
        option = options.get_option_at_index(index)
        if option.id is None:
            return
        options.remove_option(option.id)
        self.conversations = [c for c in self.conversations if str(c.id) != option.id]
        self.post_message(self.Delete(int(option.id)))
        self._show_empty()

    def action_close(self) -> None:
        self.dismiss(None)
