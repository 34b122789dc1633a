"""The sessions one agent holds: a KV state per session on each of its stages, and who owns it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.runtime.protocol import KVSession
from agent.wire.messages import SessionOpen


@dataclass
class SessionState:
    """One conversation on this agent."""

    id: int
    open: SessionOpen
    stages: list[KVSession]
    upstream: Any
    """The connection the session arrived on (errors go back there; if it dies, the session ends)."""
    steps: int = 0
    next_step: int = 0
    parked_at: float | None = None
    """When its head parked it (``FrameType.PARK``: kept for the conversation's next turn); None while active."""

    @property
    def logical_length(self) -> int:
        return self.stages[0].logical_length


@dataclass
class SessionTable:
    """Sessions by id, capped at ``capacity`` together with the agent's own chats (``reserve``)."""

    capacity: int
    sessions: dict[int, SessionState] = field(default_factory=dict)
    local: int = 0
    """KV states held outside the table: the chats this agent heads, on its own stages."""
    reclaim: Callable[[], bool] | None = None
    """Frees a place held by a session the agent keeps idle (a chat kept for its next turn); True if it did.
    Asked before anyone is refused for want of room."""
    on_evict: Callable[[SessionState, str], None] | None = None
    """Told of a parked session the table dropped, and why (its head and the next stages must hear of it)."""
    evicted: int = 0

    @property
    def full(self) -> bool:
        return len(self.sessions) + self.local >= self.capacity

    def make_room(self) -> bool:
        """Whether a session may be added: a place is free, or ``reclaim`` freed one, or the session parked
        the longest ago gave its place up (``on_evict`` hears of it). Active sessions are never evicted."""
        if not self.full or (self.reclaim is not None and self.reclaim() and not self.full):
            return True
        parked = [s for s in self.sessions.values() if s.parked_at is not None]
        if not parked:
            return False
        victim = min(parked, key=lambda s: s.parked_at or 0.0)
        self.evict(victim.id, "its place went to a new session")
        return True

    def evict(self, session: int, why: str) -> SessionState | None:
        """Drop the parked session ``session`` (``on_evict`` hears of it, and ``why``); None if it is not parked
        here. Its KV states are the caller's to free."""
        state = self.sessions.get(session)
        if state is None or state.parked_at is None:
            return None
        del self.sessions[session]
        self.evicted += 1
        if self.on_evict is not None:
            self.on_evict(state, why)
        return state

    def parked(self) -> int:
        """Sessions held while their heads wait for a conversation's next turn."""
        return sum(1 for s in self.sessions.values() if s.parked_at is not None)

    def reserve(self) -> bool:
        """Claim room for one of the agent's own chats; False when every place is taken."""
        if not self.make_room():
            return False
        self.local += 1
        return True

    def release(self) -> None:
        self.local = max(0, self.local - 1)

    def get(self, session: int) -> SessionState | None:
        return self.sessions.get(session)

    def add(self, state: SessionState) -> None:
        self.sessions[state.id] = state

    def pop(self, session: int) -> SessionState | None:
        return self.sessions.pop(session, None)

    def owned_by(self, connection: object) -> list[int]:
        """Sessions that arrived over ``connection``."""
        return [s.id for s in self.sessions.values() if s.upstream is connection]

    def of_head(self, head_id: int) -> list[int]:
        return [s.id for s in self.sessions.values() if s.open.head_id == head_id]
