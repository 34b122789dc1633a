"""Conversations kept between turns, so that the next turn computes only its new message.

After an answer, its session (the KV state on every stage) is kept for ``keep_seconds``. A request that
continues the kept conversation (its prompt begins with the whole prompt the kept answer was given: the
earlier turns, sent again) takes the session over (``ResumableTarget.resume``) and reuses what it holds
up to where the two part, as far as its positions are those a fresh prompt would compute
(``ResumableTarget.reusable``: so the answer is a fresh session's); any other request starts a fresh
session, even one that shares the chat template's opening. A kept session still holds a place on every
stage, so few are kept (``keep_max``), each only for a while, and it is parked there (``Target.park``): a stage that
needs the place for a new session evicts it, and the conversation's next turn then starts afresh. On this
agent, a kept session whose state a stage evicted, else the oldest, gives its place up at once when the
agent needs one for a chat or a ring session (``give_up_place``).
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
from agent.sampling.params import SamplingParams
from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)


@dataclass
class KeptConversation:
    """A finished answer's session, kept for the conversation's next turn."""

    target: ResumableTarget
    prompt: tuple[int, ...]
    """The prompt of the answer it keeps: a request that begins with it continues the conversation."""
    turn: Any
    """The head's turn its steps take (``RingClient.turn``; None for an in-process pipeline)."""
    expiry: asyncio.Task[None] | None = None


def _same_sampling(a: SamplingParams, b: SamplingParams) -> bool:
    """The stages sample (and read out log-probabilities) with the parameters a session was opened with; the seed
    is the head's alone."""
    return a.on_stages() == b.on_stages()


class KeptConversations:
    """At most ``keep_max`` kept sessions, each closed after ``keep_seconds`` unless taken over.

    ``release`` gives up the place a session holds on this agent (each kept one holds one)."""

    def __init__(self, node: str, keep_seconds: float, keep_max: int, release: Callable[[], None]) -> None:
        self.node = node
        self._release = release
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
        """The kept session of the conversation ``prompt_ids`` continues (with the same sampling; of several,
        the one that can reuse the most of it), no longer kept; its target is set to resume. None: start afresh."""
        best: KeptConversation | None = None
        best_common = -1
        for kept in list(self._kept):
            if not kept.target.usable():  # a stage evicted it, or its ring was lost: its state is gone
                log.info("node=%s a kept chat session is gone (evicted or its ring lost)", self.node)
                self._drop(kept)
                continue
            if tuple(prompt_ids[: len(kept.prompt)]) != kept.prompt or not _same_sampling(kept.target.params, params):
                continue
            common = kept.target.reusable(prompt_ids)
            if common > best_common:
                best, best_common = kept, common
        if best is None:
            return None
        self._kept.remove(best)
        if best.expiry is not None:
            best.expiry.cancel()
        best.target.resume()
        self.resumed += 1
        self.reused_tokens += best_common
        log.info(
            "node=%s chat resumes a kept session: %d of %d prompt tokens held, %d reused (%d computed as a fresh "
            "prompt would, chunks of %d)",
            self.node,
            best.target.common_prefix(prompt_ids),
            len(prompt_ids),
            best_common,
            best.target.settled,
            best.target.grid,
        )
        return best

    async def keep(self, kept: KeptConversation, prompt_ids: Sequence[int]) -> bool:
        """Keep a finished answer's session, the answer to ``prompt_ids``, parked on the stages; False
        (nothing kept: close it) when keeping is off or the session cannot be parked."""
        if self.keep_max == 0 or not kept.target.usable():
            return False
        try:
            await kept.target.park()
        except RingError:
            return False
        kept.prompt = tuple(prompt_ids)
        while len(self._kept) >= self.keep_max:
            self.evict_oldest()
        kept.expiry = self._closing.spawn(self._expire(kept))
        self._kept.append(kept)
        return True

    def give_up_place(self) -> bool:
        """Free the place of one kept session on this agent: one that a stage evicted (it is of no use any
        more), else the oldest. False: none is kept."""
        for kept in self._kept:
            if not kept.target.usable():
                self._drop(kept)
                return True
        return self.evict_oldest() is not None

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
            self._release()
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
        self._release()
        return self._closing.spawn(self._close(kept.target))

    async def _close(self, target: ResumableTarget) -> None:
        with contextlib.suppress(RingError):
            await target.close()
