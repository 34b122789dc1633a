"""A conversation's next turn on a kept session: only the new positions are computed, and the tokens are
those of a fresh session (the scripted target answers from the tokens it holds, so a wrong rewind or a
wrong suffix changes them)."""

from __future__ import annotations

import asyncio

import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import decode
from agent.head.drafters import NGramDrafter
from agent.head.resumable import ResumableTarget
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import ScriptedTarget, plain_greedy

GREEDY = SamplingParams()


def _answer(target: ResumableTarget, prompt: list[int], n: int) -> list[int]:
    async def go() -> list[int]:
        return [
            t
            async for t in decode(
                target,
                prompt,
                max_tokens=n,
                stop_ids=frozenset(),
                params=GREEDY,
                context_tokens=4096,
                drafter=NGramDrafter(),
                k_policy=AdaptiveK(k_max=6, k_initial=3),
            )
        ]

    return asyncio.run(go())


def test_next_turn_computes_only_its_new_positions_and_answers_as_a_fresh_session() -> None:
    inner = ScriptedTarget()
    target = ResumableTarget(inner, GREEDY)
    first_prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    first = _answer(target, first_prompt, 40)
    assert first == plain_greedy(first_prompt, 40)
    assert target.held == inner.held  # what it says the state holds is what the state holds
    # The last step's rejected drafts are part of what is held: the next prompt shares less than all of it.
    shared = first_prompt + first
    assert target.held[: len(shared) - 1] == shared[:-1]

    second_prompt = [*shared, 9, 9, 4]
    before = inner.computed
    target.resume()
    assert _answer(target, second_prompt, 1) == plain_greedy(second_prompt, 1)  # the prompt's step alone
    assert target.reused >= len(shared) - 1
    assert inner.computed - before == len(second_prompt) - target.reused

    target.resume()  # the same turn again, on the state the step above left
    assert _answer(target, second_prompt, 30) == plain_greedy(second_prompt, 30)
    assert target.reused == len(second_prompt) - 1
    assert target.held == inner.held


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], 7),  # exactly what is held: the last position is computed again for its readout
        ([1, 2, 3], 2),  # shorter than what is held
        ([1, 2, 11, 11, 11, 11, 11, 11, 11, 11], 2),  # parts early
        ([5, 5, 5], 0),  # shares nothing
    ],
)
def test_resumed_prompt_gives_the_tokens_of_a_fresh_session(prompt: list[int], expected: int) -> None:
    inner = ScriptedTarget()
    target = ResumableTarget(inner, GREEDY)
    asyncio.run(target.step([1, 2, 3, 4, 5, 6, 7, 8], 0, last_only=True))
    assert target.common_prefix(prompt) == expected
    target.resume()
    assert _answer(target, prompt, 25) == plain_greedy(prompt, 25)
    assert target.reused == expected


def test_a_resumed_prompt_is_sent_whole() -> None:
    target = ResumableTarget(ScriptedTarget(), GREEDY)
    asyncio.run(target.step([1, 2, 3], 0, last_only=True))
    target.resume()
    with pytest.raises(ValueError, match="no rewind"):
        asyncio.run(target.step([1, 2], 1, last_only=True))


class StepRecorder(ScriptedTarget):
    """Records the steps it was sent, as a stage would compute them."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[list[int], int, bool]] = []

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future:  # type: ignore[type-arg]
        self.steps.append((list(ids), rewind, last_only))
        return await super().submit(ids, rewind, last_only)


def test_a_replay_sends_the_answered_steps_as_they_were_and_the_answer_goes_on() -> None:
    async def go() -> None:
        lost = StepRecorder()
        target = ResumableTarget(lost, GREEDY)
        prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
        sent = [
            t
            async for t in decode(
                target,
                prompt,
                max_tokens=25,
                stop_ids=frozenset(),
                params=GREEDY,
                context_tokens=4096,
                drafter=NGramDrafter(),
                k_policy=AdaptiveK(k_max=6, k_initial=3),
            )
        ]
        assert any(rewind for _, rewind, _ in lost.steps)  # rejected drafts were rewound: the log must keep that
        fresh = StepRecorder()
        replayed = await target.replay_into(fresh)
        assert fresh.steps == lost.steps and fresh.held == lost.held and replayed.held == target.held
        replayed.resume()  # the answer goes on from its history: only its last token is fed again
        more = [
            t
            async for t in decode(
                replayed,
                prompt + sent,
                max_tokens=15,
                stop_ids=frozenset(),
                params=GREEDY,
                context_tokens=4096,
                drafter=NGramDrafter(),
            )
        ]
        assert sent + more == plain_greedy(prompt, 40)
        assert fresh.steps[len(lost.steps)][0] == [sent[-1]]

        # a step never answered (the ring was lost under it) is not replayed, nor anything after it
        target._sent.append(type(target._sent[0])([9], 0, False))  # sent, never answered
        target._sent.append(target._sent[0])
        again = StepRecorder()
        await target.replay_into(again)
        assert again.steps == lost.steps

    asyncio.run(go())
