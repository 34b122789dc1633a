"""A scripted target for the generation loop: it holds tokens as a stage holds its cache and answers
from them, rewinds included, so a loop that feeds or rewinds the wrong positions produces other tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from agent.runtime.repeatable import step_is_settled
from agent.sampling.distribution import SparseDistribution
from agent.sampling.readout import StepOutput

VOCAB = 12


def next_greedy(prefix: Sequence[int]) -> int:
    """A model that mostly repeats itself with period 7 and breaks the pattern now and then."""
    n = len(prefix)
    if n < 7:
        return (3 * n + 1) % VOCAB
    return (prefix[-7] + (1 if n % 11 == 0 or n % 17 == 3 else 0)) % VOCAB


def dist_at(position: int) -> np.ndarray:
    """A context-free sampling target that alternates between two distributions by position parity."""
    base = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = base if position % 2 == 0 else base[::-1].copy()
    return p / p.sum()


class ScriptedTarget:
    """Holds a token list like a stage holds its cache: rewinds drop the tail, steps append."""

    def __init__(self, sampled: bool = False, *, elsewhere: bool = False, alike: str = "none") -> None:
        """``elsewhere``: claim to answer on other PCs (``Target.answers_elsewhere``); ``alike``: answer as stages
        that compute that alike however positions are grouped (``StepOutput.settled``, ``agent.runtime.repeatable``)."""
        self.held: list[int] = []
        self.alike = alike
        self.sampled = sampled
        self.elsewhere = elsewhere
        self.submitted = 0
        self.computed = 0
        """Positions fed, all told (what a stage would have computed)."""
        self.closed = False
        self.evicted = False
        """Set by a test: a stage gave the session's place away while it was parked."""
        self.parked = 0
        self.max_in_flight = 0
        self._in_flight = 0

    def _answer(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        if rewind > len(self.held):
            raise AssertionError(f"rewind {rewind} past {len(self.held)} held tokens")
        del self.held[len(self.held) - rewind :]
        start = len(self.held)
        self.held.extend(ids)
        self.computed += len(ids)
        positions = range(start, len(self.held))
        if last_only:
            positions = positions[-1:]
        settled = step_is_settled(self.alike, len(ids), last_only)
        if self.sampled:
            dists = [SparseDistribution.from_probs(dist_at(p + 1)) for p in positions]
            return StepOutput(dists=dists, settled=settled)
        top1 = np.array([next_greedy(self.held[: p + 1]) for p in positions], dtype=np.int32)
        return StepOutput(top1=top1, settled=settled)

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        return await (await self.submit(ids, rewind, last_only))

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future[StepOutput]:
        answer = self._answer(ids, rewind, last_only)  # steps run in submission order, as on the stages
        self.submitted += 1
        self._in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[StepOutput] = loop.create_future()

        def deliver() -> None:
            self._in_flight -= 1
            future.set_result(answer)

        loop.call_soon(deliver)
        return future

    def useful_depth(self) -> int:
        return 8

    def answers_elsewhere(self) -> bool:
        return self.elsewhere

    def usable(self) -> bool:
        return not self.closed and not self.evicted

    def repeatable(self) -> bool:
        return True

    def watch_prefill(self, watcher: object) -> None:
        """Its prompts are one step: nothing to tell."""

    async def park(self) -> None:
        self.parked += 1

    async def close(self) -> None:
        self.closed = True


def plain_greedy(prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(next_greedy(context))
    return context[len(prompt) :]
