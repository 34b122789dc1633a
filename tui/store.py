"""The TUI's conversations, kept in SQLite under the user's data dir (``<data dir>/conversations.sqlite``).

Every call runs the stdlib ``sqlite3`` on a worker thread (``asyncio.to_thread``), one short connection per
call, so the event loop never waits on the disk. A turn (the prompt and its answer) is written in one
transaction: a conversation never holds a prompt without its answer. The schema carries its version in
``PRAGMA user_version``. A file that cannot be used raises :class:`~agent.errors.ConfigError` naming it (the
user can pass another with ``--conversations``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agent.errors import ConfigError
from tui.generation import Turn

SCHEMA_VERSION = 1
TITLE_CHARS = 60
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    conversation INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT
);
CREATE INDEX IF NOT EXISTS messages_of ON messages(conversation, id);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class StoredMessage:
    role: str
    content: str
    stats: Mapping[str, Any] | None = None
    """For an answer: what its ``done`` event and the TUI measured (``tui.answer.AnswerTally.finish``)."""


@dataclass(frozen=True)
class ConversationSummary:
    """One line of the list of past conversations."""

    id: int
    title: str
    updated: float
    messages: int


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    messages: tuple[StoredMessage, ...] = field(default=())

    def history(self) -> tuple[Turn, ...]:
        """What the next request sends before its new prompt."""
        return tuple((m.role, m.content) for m in self.messages)


def title_of(prompt: str) -> str:
    """A conversation's title: its first prompt's first line, cut to ``TITLE_CHARS``."""
    line = next((line.strip() for line in prompt.splitlines() if line.strip()), "") or "(empty)"
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


class ConversationStore:
    """Conversations in one SQLite file (made, with its folder, on first use)."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        """``clock``: wall-clock seconds, stamped on each conversation as it changes (tests pass a fixed one)."""
        self.path = path
        self._clock = clock
        self._ready = False

    # -- what the app awaits ---------------------------------------------------------------------
    async def conversations(self) -> list[ConversationSummary]:
        """Every conversation, the most recently changed first."""
        return await self._run(self._list)

    async def load(self, conversation: int) -> Conversation:
        return await self._run(self._load, conversation)

    async def add_turn(
        self, conversation: int | None, prompt: str, answer: str, stats: Mapping[str, Any] | None
    ) -> int:
        """Append a prompt and its answer to ``conversation`` (None: a new one, titled by the prompt); returns
        the conversation's id."""
        return await self._run(self._add_turn, conversation, prompt, answer, stats)

    async def delete(self, conversation: int) -> None:
        await self._run(self._delete, conversation)

    async def setting(self, key: str) -> Any:
        """A value saved with :meth:`put_setting`, None if there is none."""
        return await self._run(self._setting, key)

    async def put_setting(self, key: str, value: Any) -> None:
        await self._run(self._put_setting, key, value)

    # -- on the worker thread ----------------------------------------------------------------------
    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(call, *args)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        try:
            if not self._ready:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=5.0)
        except (OSError, sqlite3.Error) as exc:
            where = f"the conversations file {self.path}"
            raise ConfigError(f"cannot open {where}: {exc} (pass another with --conversations FILE)") from exc
        try:
            connection.execute("PRAGMA foreign_keys = ON")
            if not self._ready:
                self._migrate(connection)
                self._ready = True
            with connection:  # one transaction: committed, or rolled back on an error
                yield connection
        except sqlite3.Error as exc:
            raise ConfigError(f"the conversations file {self.path} failed: {exc}") from exc
        finally:
            connection.close()

    def _migrate(self, connection: sqlite3.Connection) -> None:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path} was written by a newer shoal (schema {version}, this one reads {SCHEMA_VERSION}): "
                "upgrade shoal, or pass another --conversations file"
            )
        connection.executescript(_SCHEMA)
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _list(self) -> list[ConversationSummary]:
        with self._connection() as db:
            rows = db.execute(
                "SELECT c.id, c.title, c.updated, COUNT(m.id) FROM conversations c "
                "LEFT JOIN messages m ON m.conversation = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC"
            ).fetchall()
        return [ConversationSummary(int(i), str(t), float(u), int(n)) for i, t, u, n in rows]

    def _load(self, conversation: int) -> Conversation:
        with self._connection() as db:
            found = db.execute("SELECT title FROM conversations WHERE id = ?", (conversation,)).fetchone()
            if found is None:
                raise ConfigError(f"conversation {conversation} is not in {self.path} (deleted?)")
            rows = db.execute(
                "SELECT role, content, stats FROM messages WHERE conversation = ? ORDER BY id", (conversation,)
            ).fetchall()
        messages = tuple(StoredMessage(role, content, _stats(stats)) for role, content, stats in rows)
        return Conversation(conversation, found[0], messages)

    def _add_turn(self, conversation: int | None, prompt: str, answer: str, stats: Mapping[str, Any] | None) -> int:
        now = self._clock()
        with self._connection() as db:
            if conversation is None:
                cursor = db.execute(
                    "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)", (title_of(prompt), now, now)
                )
                conversation = int(cursor.lastrowid or 0)
            elif db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation)).rowcount == 0:
                raise ConfigError(f"conversation {conversation} is not in {self.path} (deleted?)")
            db.executemany(
                "INSERT INTO messages (conversation, role, content, stats) VALUES (?, ?, ?, ?)",
                [
                    (conversation, "user", prompt, None),
                    (conversation, "assistant", answer, None if stats is None else json.dumps(dict(stats))),
                ],
            )
        return conversation

    def _delete(self, conversation: int) -> None:
        with self._connection() as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation,))

    def _setting(self, key: str) -> Any:
        with self._connection() as db:
            row = db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else _json(row[0])

    def _put_setting(self, key: str, value: Any) -> None:
        with self._connection() as db:
            db.execute(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, json.dumps(value)),
            )


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _stats(text: str | None) -> Mapping[str, Any] | None:
    value = None if text is None else _json(text)
    return value if isinstance(value, dict) else None
