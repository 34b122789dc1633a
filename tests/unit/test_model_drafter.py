"""``ModelDrafter`` over a scripted draft model: its cache bookkeeping and where its own chances stop it."""

from __future__ import annotations

import numpy as np
import pytest

from agent.head.model_drafter import ModelDrafter
from agent.sampling.params import SamplingParams

VOCAB = 8
# The draft's top-1 probability after each number of tokens it holds beyond the context (greedy token: 3).
CHANCES = [0.9, 0.8, 0.5, 0.95, 0.95, 0.95]


def _logits(p_top: float) -> np.ndarray:
    """Logits whose softmax gives token 3 probability ``p_top`` and the rest equal shares."""
    probs = np.full(VOCAB, (1 - p_top) / (VOCAB - 1))
    probs[3] = p_top
    return np.log(probs).astype(np.float32)


class ScriptedDraftSession:
    """Holds fed tokens like a stage session; answers with the chance scripted for its length."""

    def __init__(self, context_len: int) -> None:
        self.context_len = context_len
        self.held: list[int] = []

    def step(self, inputs: np.ndarray, last_only: bool = False) -> np.ndarray:
        self.held.extend(int(t) for t in inputs[0])
        beyond = len(self.held) - self.context_len
        return _logits(CHANCES[beyond])[None, None, :]

    def rewind(self, n: int) -> None:
        del self.held[len(self.held) - n :]

    def reset(self) -> None:
        self.held.clear()


class ScriptedDraftStage:
    def __init__(self, context_len: int) -> None:
        self.session = ScriptedDraftSession(context_len)

    def new_session(self) -> ScriptedDraftSession:
        return self.session


CONTEXT = [1, 2, 5, 6]


@pytest.mark.parametrize(("floor", "expected"), [(0.0, 5), (0.5, 2), (0.7, 2), (0.75, 1), (0.95, 0)])
def test_greedy_drafts_stop_where_the_joint_chance_falls_below_the_floor(floor: float, expected: int) -> None:
    # joint chances of 1, 2, 3... tokens: 0.9, 0.72, 0.36, 0.34, 0.33
    stage = ScriptedDraftStage(len(CONTEXT))
    drafter = ModelDrafter(stage, SamplingParams())  # type: ignore[arg-type]
    draft = drafter.propose(CONTEXT, 5, floor)
    assert draft.tokens == [3] * expected
    # the cache holds the context and every drafted token but the last (whose logits were not needed)
    assert stage.session.held[: len(CONTEXT)] == CONTEXT
    drafter.commit(len(CONTEXT))
    assert stage.session.held == CONTEXT


def test_sampled_drafts_stop_before_drawing_never_because_of_the_draw() -> None:
    """The stop must not depend on the token drawn at a position (that would bias speculative sampling):
    with these chances every draft has the same length however its tokens fell."""
    stage = ScriptedDraftStage(len(CONTEXT))
    lengths, tokens = set(), set()
    for seed in range(40):
        drafter = ModelDrafter(stage, SamplingParams(temperature=1.0, seed=seed))  # type: ignore[arg-type]
        stage.session.reset()
        draft = drafter.propose(CONTEXT, 5, 0.5)
        assert draft.dists is not None and len(draft.dists) == len(draft.tokens)
        lengths.add(len(draft.tokens))
        tokens.update(draft.tokens)
    assert lengths == {2}  # top chances 0.9 x 0.8 = 0.72, then x 0.5 = 0.36 < 0.5
    assert tokens - {3}  # draws off the top were sent too


def test_a_draft_stops_between_tokens_when_asked() -> None:
    """Drafting ahead yields the head's core: ``stop`` is asked before every further model step."""
    stage = ScriptedDraftStage(len(CONTEXT))
    drafter = ModelDrafter(stage, SamplingParams())  # type: ignore[arg-type]
    asked: list[int] = []

    def stop() -> bool:
        asked.append(len(stage.session.held))
        return len(asked) == 2

    draft = drafter.propose(CONTEXT, 5, 0.0, stop)
    assert draft.tokens == [3, 3] and asked == [len(CONTEXT), len(CONTEXT) + 1]
    assert stage.session.held == [*CONTEXT, 3]  # the cache holds what was fed, no more
