from __future__ import annotations

import numpy as np
import pytest

from agent.errors import PromptTooLongError
from agent.sampling.params import SamplingParams
from bench.plain_decode import generate


class ScriptedSession:
    """Emits logits that make greedy decoding follow ``script``; records what it was fed."""

    def __init__(self, script: list[int], vocab: int = 10) -> None:
        self.script, self.vocab, self.fed = script, vocab, []  # type: ignore[var-annotated]
        self.last_only: list[bool] = []

    def step(self, ids: np.ndarray, last_only: bool = False) -> np.ndarray:
        self.fed.append(ids.tolist())
        self.last_only.append(last_only)
        logits = np.zeros((1, 1 if last_only else ids.shape[1], self.vocab), dtype=np.float32)
        logits[0, -1, self.script[len(self.fed) - 1]] = 1.0
        return logits


def test_stops_at_a_stop_token_without_yielding_it() -> None:
    session = ScriptedSession([4, 5, 2, 7])
    out = list(generate(session, [1, 1], 10, frozenset({2}), SamplingParams(), 100))
    assert out == [4, 5]
    assert session.fed == [[[1, 1]], [[4]], [[5]]]
    assert session.last_only[0]  # the prompt asks for the last position's logits only


def test_max_tokens_does_not_run_an_extra_step() -> None:
    session = ScriptedSession([3, 3, 3, 3])
    assert list(generate(session, [1], 3, frozenset(), SamplingParams(), 100)) == [3, 3, 3]
    assert len(session.fed) == 3


def test_context_limit_is_checked_before_anything_runs() -> None:
    session = ScriptedSession([3])
    with pytest.raises(PromptTooLongError, match="exceeds the 8-token context"):
        list(generate(session, [1] * 6, 3, frozenset(), SamplingParams(), 8))
    assert session.fed == []
