"""Drafting ahead: the head drafts the next step while a step is answered on other PCs.

A draft model's session is scripted to hold the tokens fed to it (as a stage session does), so a loop
that leaves the drafter's cache out of step with the conversation is caught by the cache itself, not
only by slower decoding: outputs are verified, and stay plain greedy's whatever the drafter does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, _DraftAhead, decode
from agent.head.drafters import Draft
from agent.head.model_drafter import ModelDrafter
from agent.head.turn import HeadTurn
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import VOCAB, ScriptedTarget, next_greedy, plain_greedy


class NoisyDraftSession:
    """A draft model's cache: the tokens fed so far. It predicts the scripted target's next token,
    wrong at every ninth position, so drafts are mostly, not always, kept."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def step(self, inputs: np.ndarray, last_only: bool = False) -> np.ndarray:
        self.held.extend(int(t) for t in inputs[0])
        guess = (next_greedy(self.held) + (1 if len(self.held) % 9 == 4 else 0)) % VOCAB
        logits = np.full(VOCAB, -4.0, dtype=np.float32)
        logits[guess] = 4.0
        return logits[None, None, :]

    def rewind(self, n: int) -> None:
        assert 0 <= n <= len(self.held)
        del self.held[len(self.held) - n :]

    def reset(self) -> None:
        self.held.clear()


class NoisyDraftStage:
    def __init__(self) -> None:
        self.session = NoisyDraftSession()

    def new_session(self) -> NoisyDraftSession:
        return self.session


class CheckedModelDrafter(ModelDrafter):
    """``ModelDrafter`` whose cache is checked against every context it is asked to continue, and
    which records whether each proposal came while a step was waiting for its answer."""

    def __init__(self, target: ScriptedTarget) -> None:
        self.stage = NoisyDraftStage()
        super().__init__(self.stage, SamplingParams())  # type: ignore[arg-type]
        self.target = target
        self.while_answered: list[bool] = []
        self.stops: list[bool | None] = []  # per proposal: what its stop() said then (None: no stop given)

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        # While a step is answered the target holds exactly the context drafted from: the step's tokens
        # extend the context with its drafts. After the answer the context ends with the answer's token.
        self.while_answered.append(list(context) == self.target.held)
        self.stops.append(None if stop is None else stop())
        draft = super().propose(context, k, min_belief, stop)
        held = self.stage.session.held
        # The cache holds the context and every drafted token but the last (whose logits were not needed).
        assert held == [*context, *draft.tokens[:-1]], (held, list(context), draft.tokens)
        return draft


def _run(
    target: ScriptedTarget,
    drafter: object,
    n: int,
    *,
    params: SamplingParams | None = None,
    draft_ahead: bool = True,
    stats: DecodeStats | None = None,
    turn: HeadTurn | None = None,
) -> list[int]:
    async def go() -> list[int]:
        return [
            t
            async for t in decode(
                target,
                PROMPT,
                max_tokens=n,
                stop_ids=frozenset(),
                params=params or SamplingParams(),
                context_tokens=4096,
                drafter=drafter,  # type: ignore[arg-type]
                k_policy=AdaptiveK(k_max=6, k_initial=3),
                stats=stats,
                draft_ahead=draft_ahead,
                turn=turn,
            )
        ]

    return asyncio.run(go())


PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]


@pytest.mark.parametrize("shared_turn", [False, True])
def test_drafting_ahead_keeps_greedy_tokens_and_the_drafters_cache_in_step(shared_turn: bool) -> None:
    target = ScriptedTarget(elsewhere=True)
    drafter = CheckedModelDrafter(target)
    stats = DecodeStats()
    out = _run(target, drafter, 150, stats=stats, turn=HeadTurn() if shared_turn else None)
    assert out == plain_greedy(PROMPT, 150)
    assert 0 < stats.accepted < stats.drafted  # drafts were both kept and rejected
    # Drafts were made ahead, some sent as made and some dropped (the draft model is wrong now and then).
    assert 0 < stats.ahead_used < stats.drafted_ahead
    assert stats.drafted_ahead == drafter.while_answered.count(True)
    # Each step's draft was made after the answer before it, or ahead and confirmed, or not at all (K = 0):
    # a confirmed draft made ahead is one proposal fewer between an answer and the next step.
    after_answers = drafter.while_answered.count(False)
    assert after_answers + stats.ahead_used + stats.k_chosen.count(0) == stats.steps
    # With the head's turn shared, only drafts made ahead get a stop(), tied to the turn being wanted
    # (nobody else waits for the head here); without it, nothing can ask them to stop.
    ahead = [stop for stop, early in zip(drafter.stops, drafter.while_answered, strict=True) if early]
    after = [stop for stop, early in zip(drafter.stops, drafter.while_answered, strict=True) if not early]
    assert all(stop is (False if shared_turn else None) for stop in ahead)
    assert after and all(stop is None for stop in after)


@pytest.mark.parametrize("case", ["off", "local target", "sampling"])
def test_no_drafting_ahead_where_it_cannot_pay_or_is_turned_off(case: str) -> None:
    target = ScriptedTarget(elsewhere=case != "local target")
    drafter = CheckedModelDrafter(target)
    stats = DecodeStats()
    params = SamplingParams(temperature=1.0, seed=3) if case == "sampling" else SamplingParams()
    out = _run(target, drafter, 60, params=params, draft_ahead=case != "off", stats=stats)
    assert stats.drafted_ahead == 0 and not any(drafter.while_answered)
    if case != "sampling":
        assert out == plain_greedy(PROMPT, 60)


def test_a_draft_ahead_that_has_not_got_the_turn_is_called_off() -> None:
    """Another session holds the head's turn until after the answer: the draft is never made."""

    async def go() -> tuple[object, bool]:
        turn = asyncio.Lock()
        made = False

        async def drafting() -> tuple[Draft, int | None]:
            nonlocal made
            made = True
            return Draft([1, 2]), 1

        await turn.acquire()
        ahead = _DraftAhead.start(turn, time.perf_counter, drafting)
        await asyncio.sleep(0)
        result = await ahead.finish()
        turn.release()
        await asyncio.sleep(0)
        return result, made

    assert asyncio.run(go()) == (None, False)


def test_a_draft_ahead_that_has_the_turn_is_waited_for() -> None:
    async def go() -> object:
        async def drafting() -> tuple[Draft, int | None]:
            await asyncio.sleep(0.01)
            return Draft([1, 2]), 1

        ahead = _DraftAhead.start(asyncio.Lock(), time.perf_counter, drafting)
        await asyncio.sleep(0)
        return await ahead.finish()

    assert asyncio.run(go()) == (Draft([1, 2]), 1)
