"""The conversation: its messages, oldest first, kept scrolled to the newest while an answer streams."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from tui.answer import stats_line
from tui.message import MessageView, Role
from tui.store import StoredMessage

EMPTY_HINT = "Ask the fleet anything. Enter sends; ctrl+j starts a new line; ctrl+p lists every command."


FOLLOW_LINES = 2
"""Within this many lines of the end, the view follows a streaming answer; further up, the user is reading."""


class ConversationView(VerticalScroll, can_focus=True):
    """The messages of one conversation. It follows its end: a streaming answer stays in view unless the user
    scrolled up to read, and a new message brings the end back into view."""

    def compose(self) -> ComposeResult:
        yield Static(EMPTY_HINT, id="empty-hint")

    async def add(self, role: Role, text: str = "", note: str = "") -> MessageView:
        """Append a message (an answer starts empty and grows through ``MessageView.append``)."""
        self.query_one("#empty-hint").display = False
        message = MessageView(role, text, note)
        await self.mount(message)
        self.scroll_end(animate=False)
        return message

    def follow(self) -> None:
        """Call as an answer grows: scroll to the end after the next layout, unless the user scrolled up."""
        if self.max_scroll_y - self.scroll_y <= FOLLOW_LINES:
            self.scroll_end(animate=False)

    async def show(self, messages: Iterable[StoredMessage]) -> None:
        """Replace the view with a stored conversation (an empty one shows the hint)."""
        await self.query(MessageView).remove()
        views = [
            MessageView("user" if m.role == "user" else "assistant", m.content, stats_line(m.stats)) for m in messages
        ]
        self.query_one("#empty-hint").display = not views
        if views:
            await self.mount_all(views)
        self.scroll_end(animate=False)

    @property
    def messages(self) -> list[MessageView]:
        return list(self.query(MessageView))
