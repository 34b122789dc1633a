"""Greedy generation through an in-process pipeline, with or without a drafter (shared by the tests)."""

from __future__ import annotations

import asyncio

from agent.head.decode import DecodeStats, decode
from agent.head.drafters import Drafter
from agent.head.targets import LocalTarget
from agent.runtime.stage import LocalPipeline
from agent.sampling.params import SamplingParams
from tests.conftest import REFERENCE_TOKENS

GREEDY = SamplingParams()


def greedy_tokens(
    pipeline: LocalPipeline,
    prompt: list[int],
    drafter: Drafter | None = None,
    stats: DecodeStats | None = None,
    max_tokens: int = REFERENCE_TOKENS,
    stop_ids: frozenset[int] = frozenset(),
) -> list[int]:
    """``max_tokens`` greedy tokens (ending early only at ``stop_ids``) from a fresh session of ``pipeline``."""

    async def run() -> list[int]:
        target = LocalTarget(pipeline.new_session(), GREEDY)
        try:
            return [
                t
                async for t in decode(
                    target,
                    prompt,
                    max_tokens=max_tokens,
                    stop_ids=stop_ids,
                    params=GREEDY,
                    context_tokens=2048,
                    drafter=drafter,
                    stats=stats,
                )
            ]
        finally:
            await target.close()

    return asyncio.run(run())
