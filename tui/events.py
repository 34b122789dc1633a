"""The messages that bring what workers learn (an answer's events, a status poll, the store's replies) to the
app, which shows them in its widgets: widgets never reach out for data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from agent.chat_client.protocol import ChatEvent
from tui.answer import AnswerTally
from tui.generation import GenerationSettings, Turn
from tui.message import MessageView
from tui.store import Conversation, ConversationSummary


@dataclass
class Thread:
    """The conversation on screen: its id in the store (None until its first turn is saved) and the turns
    that the next request sends (answered ones only: a failed turn is not history)."""

    id: int | None = None
    title: str = ""
    history: list[Turn] = field(default_factory=list)


@dataclass
class AnswerTurn:
    """One prompt and the answer streaming for it."""

    thread: Thread
    prompt: str
    settings: GenerationSettings
    tally: AnswerTally
    view: MessageView

    @property
    def messages(self) -> tuple[Turn, ...]:
        return (*self.thread.history, ("user", self.prompt))


class AnswerToken(Message):
    """A token's text, and when it arrived (read by the worker: the UI's own pace does not count)."""

    def __init__(self, turn: AnswerTurn, text: str, at: float) -> None:
        super().__init__()
        self.turn, self.text, self.at = turn, text, at


class AnswerProgress(Message):
    """How far the answer's prompt has gone in (a long prompt, before the first token)."""

    def __init__(self, turn: AnswerTurn, progress: ChatEvent) -> None:
        super().__init__()
        self.turn, self.progress = turn, progress


class AnswerDone(Message):
    def __init__(self, turn: AnswerTurn, done: ChatEvent) -> None:
        super().__init__()
        self.turn, self.done = turn, done


class AnswerFailed(Message):
    def __init__(self, turn: AnswerTurn, error: str) -> None:
        super().__init__()
        self.turn, self.error = turn, error


class AnswerStopped(Message):
    """The user stopped the answer (Esc): its stream is closed, which cancels it on the agent."""

    def __init__(self, turn: AnswerTurn) -> None:
        super().__init__()
        self.turn = turn


class StatusPolled(Message):
    """One poll of the agent's status: the document, or why there is none."""

    def __init__(self, status: dict[str, Any] | None, error: str | None = None) -> None:
        super().__init__()
        self.status, self.error = status, error


class PeersPolled(Message):
    """Answers of the plan's other agents: each one's status document by node id, None where it failed (those
    still being asked are not in it)."""

    def __init__(self, statuses: dict[str, dict[str, Any] | None]) -> None:
        super().__init__()
        self.statuses = statuses


class ConversationSaved(Message):
    def __init__(self, thread: Thread) -> None:
        super().__init__()
        self.thread = thread


class ConversationLoaded(Message):
    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conversation = conversation


class ConversationsListed(Message):
    def __init__(self, conversations: Sequence[ConversationSummary]) -> None:
        super().__init__()
        self.conversations = conversations


class SettingsLoaded(Message):
    def __init__(self, settings: GenerationSettings) -> None:
        super().__init__()
        self.settings = settings


class StoreFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
