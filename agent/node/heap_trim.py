"""An agent whose stages have gone idle gives back the memory its C heap keeps (``agent.runtime.heap``).

Not after every step: trimming walks the heap under its locks, and a busy stage would only take the memory back
for its next prompt. Once no step has been computed for ``idle_after`` seconds, the heap is trimmed once, off the
event loop; the next step arms it again. The decision is a pure function over an immutable watch (:func:`watched`),
so tests drive it with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.runtime.heap import give_back_heap

log = logging.getLogger(__name__)

IDLE_AFTER_S = 5.0
"""Seconds without a step after which the heap is trimmed: longer than a conversation's pause between turns
of one answer (a ring's step takes well under a second), short enough that a donor gets its memory back soon."""
CHECK_EVERY_S = 1.0


@dataclass(frozen=True)
class IdleWatch:
    """The step count last seen, since when it has not changed, and whether the heap was trimmed since."""

    steps: int
    since: float
    trimmed: bool = False


def watched(watch: IdleWatch, steps: int, now: float, idle_after: float) -> tuple[IdleWatch, bool]:
    """The watch after seeing ``steps`` steps at ``now``, and whether to trim the heap now: once per idle period,
    when no step was computed for ``idle_after`` seconds."""
    if steps != watch.steps:
        return IdleWatch(steps, now), False
    if not watch.trimmed and now - watch.since >= idle_after:
        return IdleWatch(steps, watch.since, trimmed=True), True
    return watch, False


class HeapTrim:
    """A daemon part: trims the heap once the agent's stages have computed no step for ``idle_after`` seconds.

    ``steps``: the agent's steps computed so far (ring and local); ``trim`` runs in the default executor."""

    name = "heap"

    def __init__(
        self,
        node: str,
        steps: Callable[[], int],
        *,
        idle_after: float = IDLE_AFTER_S,
        check_every: float = CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        trim: Callable[[], bool] = give_back_heap,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.node, self._steps, self._clock, self._trim, self._sleep = node, steps, clock, trim, sleep
        self.idle_after, self.check_every = idle_after, check_every
        self.trims = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def roles(self) -> Mapping[str, Any]:
        return {}

    async def start(self, ring: tuple[str, int]) -> None:
        """Begin watching (the first trim follows the stages' compilation, which frees much of what it used)."""
        self._task = asyncio.create_task(self._watch(), name=f"heap-trim-{self.node}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def status(self) -> dict[str, Any]:
        return {"trims": self.trims, "idle_after_s": self.idle_after}

    async def _watch(self) -> None:
        watch = IdleWatch(self._steps(), self._clock())
        loop = asyncio.get_running_loop()
        while True:
            await self._sleep(self.check_every)
            try:
                watch, due = watched(watch, self._steps(), self._clock(), self.idle_after)
                if due:
                    began = self._clock()
                    released = await loop.run_in_executor(None, self._trim)
                    self.trims += 1
                    log.info(
                        "node=%s idle %.0f s: heap trimmed in %.3f s (memory returned: %s)",
                        self.node,
                        self.idle_after,
                        self._clock() - began,
                        "yes" if released else "none",
                    )
            except Exception:  # the watch must outlive a failed trim; the agent serves on without it
                log.exception("node=%s trimming the heap failed", self.node)
