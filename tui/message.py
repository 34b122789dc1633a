"""One message of the conversation: the user's prompt, or an answer streamed as markdown with a note under it."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

Role = Literal["user", "assistant"]


class MessageView(Vertical):
    """A prompt (plain text: what the user typed, as typed) or an answer (markdown).

    An answer grows through :meth:`append`, which writes into a ``MarkdownStream``: fragments that arrive
    faster than the markdown renders are joined into one update, so a long answer is not re-parsed per
    token. :meth:`finish` ends the stream and shows the note (the answer's stats, or why it stopped)."""

    note: reactive[str] = reactive("", layout=True)
    """The line under the message: ttft and tokens/s of an answer, ``stopped``, or an error."""
    failed: reactive[bool] = reactive(False)
    """The answer ended in an error (the note says which): styled as such."""

    def __init__(self, role: Role, text: str = "", note: str = "") -> None:
        super().__init__(classes=f"message -{role}" + ("" if note else " -no-note"))
        self.role = role
        self._text = text
        self._stream: MarkdownStream | None = None
        self._gone = False
        self._markdown = Markdown(text, classes="body")
        self._note = Static(note, markup=False, classes="note")
        self.set_reactive(MessageView.note, note)

    def compose(self) -> ComposeResult:
        yield Static(self._text, markup=False, classes="body") if self.role == "user" else self._markdown
        yield self._note

    @property
    def text(self) -> str:
        """The message's text so far."""
        return self._text if self.role == "user" else self._markdown.source

    async def append(self, fragment: str) -> None:
        """Add to an answer's markdown as it streams (nothing once the view is gone: another conversation is
        on screen, while the stopped answer's last tokens arrive)."""
        if self._gone:
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self._markdown)
        await self._stream.write(fragment)

    async def finish(self, note: str, failed: bool = False) -> None:
        """The answer has ended: render what is pending and show ``note`` under it."""
        if self._stream is not None and not self._gone:
            stream, self._stream = self._stream, None
            await stream.stop()
        self.failed = failed
        self.note = note

    async def on_unmount(self) -> None:
        self._gone = True
        if self._stream is not None:  # left open, its task would idle, holding this view, until the app ended
            stream, self._stream = self._stream, None
            await stream.stop()

    def watch_note(self, note: str) -> None:
        self._note.update(note)
        self.set_class(not note, "-no-note")

    def watch_failed(self, failed: bool) -> None:
        self.set_class(failed, "-failed")
