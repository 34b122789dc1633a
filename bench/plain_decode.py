"""A plain generation loop (no drafting, no ring) over any session that maps token ids to logits: what the
benchmark's in-process runs decode with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from agent.head.chat import check_prompt
from agent.sampling.params import Sampler, SamplingParams


class LogitsSession(Protocol):
    def step(self, token_ids: np.ndarray, last_only: bool = False) -> np.ndarray: ...


def generate(
    session: LogitsSession,
    prompt_ids: list[int],
    max_tokens: int,
    stop_ids: frozenset[int],
    params: SamplingParams,
    context_tokens: int,
) -> Iterator[int]:
    """Yield completion token ids one by one; stops at a stop token (not yielded) or ``max_tokens``."""
    check_prompt(prompt_ids, max_tokens, context_tokens)
    sampler = Sampler(params)
    logits = session.step(np.asarray([prompt_ids], dtype=np.int64), last_only=True)
    for produced in range(1, max_tokens + 1):
        token = sampler.pick(logits[0, -1])
        if token in stop_ids:
            return
        yield token
        if produced < max_tokens:
            logits = session.step(np.asarray([[token]], dtype=np.int64))
