"""What the app asks of its SQLite store (``tui.store``): each job a coroutine for a worker of the app's ``store``
group, run one at a time under one lock, its result and its failure posted back as :mod:`tui.events` messages."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from textual.message import Message

from agent.errors import ShoalError
from tui.events import (
    ConversationLoaded,
    ConversationSaved,
    ConversationsListed,
    SettingsLoaded,
    StoreFailed,
    Thread,
)
from tui.generation import GenerationSettings
from tui.store import ConversationStore

T = TypeVar("T")
SETTINGS_KEY = "generation"


class StoreJobs:
    """The jobs of one app on its ``store``; ``post`` sends their messages to the app."""

    def __init__(self, store: ConversationStore, post: Callable[[Message], object]) -> None:
        self.store = store
        self._post = post
        self._lock = asyncio.Lock()

    async def _run(
        self, call: Callable[[], Awaitable[T]], reply: Callable[[T], Message | None] = lambda _: None, failed: str = ""
    ) -> None:
        """Await ``call`` (a store method) under the store's lock, then post what ``reply`` makes of its result;
        a failure is posted as :class:`StoreFailed` (``failed`` says what was lost)."""
        try:
            async with self._lock:  # in order: a conversation's first turn makes the id the next one uses
                result = await call()
        except ShoalError as exc:
            self._post(StoreFailed(f"{failed}{exc}"))
            return
        if (message := reply(result)) is not None:
            self._post(message)

    def save_turn(self, thread: Thread, prompt: str, answer: str, stats: dict[str, Any]) -> Awaitable[None]:
        async def add() -> Thread:
            thread.id = await self.store.add_turn(thread.id, prompt, answer, stats)
            return thread

        return self._run(add, ConversationSaved, "the turn was not saved: ")

    def list_conversations(self) -> Awaitable[None]:
        return self._run(self.store.conversations, ConversationsListed)

    def load_conversation(self, conversation: int) -> Awaitable[None]:
        return self._run(lambda: self.store.load(conversation), ConversationLoaded)

    def delete_conversation(self, conversation: int) -> Awaitable[None]:
        return self._run(lambda: self.store.delete(conversation), failed="the conversation was not deleted: ")

    def load_settings(self) -> Awaitable[None]:
        def loaded(saved: Any) -> Message | None:
            return None if saved is None else SettingsLoaded(GenerationSettings.from_json(saved))

        return self._run(lambda: self.store.setting(SETTINGS_KEY), loaded)

    def save_settings(self, settings: GenerationSettings) -> Awaitable[None]:
        return self._run(
            lambda: self.store.put_setting(SETTINGS_KEY, settings.to_json()), failed="the settings were not saved: "
        )
