"""Conversations kept between turns, so that the next turn computes only its new message.

After an answer, its session (the KV state on every stage) is kept for ``keep_seconds``. A request
whose conversation starts with what a kept session holds takes it over (``ResumableTarget.resume``);
any other request starts a fresh session. A kept session still holds a place on every stage, so few
are kept (``keep_max``), each only for a while, and the oldest gives its place up at once when this
agent needs one for a chat or a ring session (``evict_oldest``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent.errors import RingError
from agent.head.resumable import ResumableTarget
from agent.head.sampling import SamplingParams
from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)

MIN_SHARED_FRACTION = 0.5
"""A kept session is taken over only by a conversation that shares at least this much of what it holds:
less (another conversation that shares the system prompt) would spend a long exchange's state on a few
template tokens."""


@dataclass
class KeptConversation:
    """A finished answer's session, kept for the conversation's next turn."""

    target: ResumableTarget
    turn: Any
    """The head's turn its steps take (``RingClient.turn``; None for an in-process pipeline)."""
    release: Callable[[], None]
    """Gives up the place it holds on this agent."""
    expiry: asyncio.Task[None] | None = None


def _same_sampling(a: SamplingParams, b: SamplingParams) -> bool:
    """The stages sample with the parameters a session was opened with; the seed is the head's alone."""
    return (a.temperature, a.top_k, a.top_p) == (b.temperature, b.top_k, b.top_p)


class KeptConversations:
    """At most ``keep_max`` kept sessions, each closed after ``keep_seconds`` unless taken over."""

    def __init__(self, node: str, keep_seconds: float, keep_max: int) -> None:
        self.node = node
        self.keep_seconds = keep_seconds
        self.keep_max = keep_max if keep_seconds > 0 else 0
        self._kept: list[KeptConversation] = []  # oldest first
        self._closing = OwnedTasks()
        self.resumed = 0
        self.reused_tokens = 0
        """Turns that took a kept session over, and the prompt positions they did not compute."""

    def __len__(self) -> int:
        return len(self._kept)

    def take(self, prompt_ids: Sequence[int], params: SamplingParams) -> KeptConversation | None:
        """The kept session that holds the most of ``prompt_ids`` (enough of it, same sampling), no longer
        kept; its target is set to resume. None: start a fresh session."""
        best: KeptConversation | None = None
        best_common = 0
        for kept in list(self._kept):
            if not kept.target.usable():  # its ring was lost meanwhile: its state is gone
                self._drop(kept)
                continue
            common = kept.target.common_prefix(prompt_ids)
            if (common > best_common and common >= MIN_SHARED_FRACTION * len(kept.target.held)
                    and _same_sampling(kept.target.params, params)):
                best, best_common = kept, common
        if best is None:
            return None
        self._kept.remove(best)
        if best.expiry is not None:
            best.expiry.cancel()
        best.target.resume()
        self.resumed += 1
        self.reused_tokens += best_common
        log.info("node=%s chat resumes a kept session: %d of %d prompt tokens held", self.node, best_common,
                 len(prompt_ids))
        return best

    def keep(self, kept: KeptConversation) -> bool:
        """Keep a finished answer's session; False (nothing kept: close it) when keeping is off."""
        if self.keep_max == 0 or not kept.target.usable():
            return False
        while len(self._kept) >= self.keep_max:
            self.evict_oldest()
        kept.expiry = self._closing.spawn(self._expire(kept))
        self._kept.append(kept)
        return True

    def evict_oldest(self) -> asyncio.Task[None] | None:
        """Give up the oldest kept session's place now; its state is freed by the returned task (None:
        none is kept)."""
        if not self._kept:
            return None
        return self._drop(self._kept[0])

    async def close_all(self) -> None:
        """Close every kept session (the agent stops)."""
        kept, self._kept = self._kept, []
        for conversation in kept:
            if conversation.expiry is not None:
                conversation.expiry.cancel()
            conversation.release()
            await self._close(conversation.target)
        await self._closing.cancel_all()

    async def _expire(self, kept: KeptConversation) -> None:
        await asyncio.sleep(self.keep_seconds)
        log.info("node=%s kept chat session closed after %.0f s unused", self.node, self.keep_seconds)
        kept.expiry = None
        self._drop(kept)

    def _drop(self, kept: KeptConversation) -> asyncio.Task[None]:
        self._kept.remove(kept)
        if kept.expiry is not None:
            kept.expiry.cancel()
        kept.release()
        return self._closing.spawn(self._close(kept.target))

    async def _close(self, target: ResumableTarget) -> None:
        with contextlib.suppress(RingError):
            await target.close()
