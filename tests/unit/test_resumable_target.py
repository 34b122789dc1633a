"""A conversation's next turn on a kept session: only positions a fresh prompt computes alike are reused (whole
chunks of earlier prompts; prompts' positions where the stages compute prompts alike; every position where they
compute everything alike), the rest is computed, and the tokens are those of a fresh session (the scripted target
answers from the tokens it holds, so a wrong rewind or a wrong suffix changes them)."""

from __future__ import annotations

import asyncio

import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import decode
from agent.head.drafters import NGramDrafter
from agent.head.resumable import ResumableTarget
from agent.runtime.repeatable import stages_alike, step_is_settled
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


def test_next_turn_reuses_the_whole_chunks_of_earlier_prompts_and_answers_as_a_fresh_session() -> None:
    inner = ScriptedTarget()
    target = ResumableTarget(inner, GREEDY, grid=4)
    first_prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    first = _answer(target, first_prompt, 40)
    assert first == plain_greedy(first_prompt, 40)
    assert target.held == inner.held  # what it says the state holds is what the state holds
    # The last step's rejected drafts are part of what is held: the next prompt shares less than all of it.
    shared = first_prompt + first
    assert target.held[: len(shared) - 1] == shared[:-1]
    # the answer's positions were computed a step at a time, not as a prompt's chunks: only 8 are settled
    assert target.settled == 8

    second_prompt = [*shared, 9, 9, 4]
    before = inner.computed
    assert target.reusable(second_prompt) == 8
    target.resume()
    assert _answer(target, second_prompt, 1) == plain_greedy(second_prompt, 1)  # the prompt's step alone
    assert target.reused == 8
    assert inner.computed - before == len(second_prompt) - 8
    assert target.settled == len(second_prompt) - len(second_prompt) % 4

    target.resume()  # the same turn again, on the state the step above left
    assert _answer(target, second_prompt, 30) == plain_greedy(second_prompt, 30)
    assert target.reused == len(second_prompt) - len(second_prompt) % 4
    assert target.held == inner.held


def test_a_resumed_prompt_starts_at_a_chunk_boundary_and_what_is_settled_follows_what_was_computed() -> None:
    target = ResumableTarget(ScriptedTarget(), GREEDY, grid=4)
    asyncio.run(target.step(list(range(1, 11)), 0, last_only=True))  # a prompt of 10: two whole chunks
    assert target.settled == 8
    asyncio.run(target.step([11, 12, 13], 0, last_only=False))  # decoding: computed otherwise than a prompt
    assert target.settled == 8 and target.reusable(list(range(1, 20))) == 8
    asyncio.run(target.step([30], 7, last_only=False))  # a rewind below the settled positions unsettles them
    assert target.settled == 6 and target.reusable(list(range(1, 20))) == 4
    asyncio.run(target.step([7, 8], 0, last_only=True))  # a prompt that starts off a boundary settles nothing
    assert target.settled == 6 and target.reusable(list(range(1, 20))) == 4

    nothing = ResumableTarget(ScriptedTarget(), GREEDY, grid=0)  # prompts as one step: nothing is reusable
    asyncio.run(nothing.step(list(range(1, 11)), 0, last_only=True))
    assert nothing.settled == 0 and nothing.reusable(list(range(1, 20))) == 0

    replay = ResumableTarget(ScriptedTarget(), GREEDY, grid=4)  # after a replay the answer goes on from all it holds
    asyncio.run(replay.step(list(range(1, 11)), 0, last_only=True))
    asyncio.run(replay.step([11, 12], 0, last_only=False))
    replay.resume(whole=True)
    asyncio.run(replay.step(list(range(1, 14)), 0, last_only=True))
    assert replay.reused == 12


def _two_turns(alike: str, grid: int) -> tuple[ScriptedTarget, ResumableTarget, list[int], list[int]]:
    """A first turn (a 10-position prompt, a 40-token answer) on stages that compute ``alike``, and the second
    turn's prompt (the first, the answer but its last token, 3 new positions)."""
    inner = ScriptedTarget(alike=alike)
    target = ResumableTarget(inner, GREEDY, grid=grid)
    first_prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    first = _answer(target, first_prompt, 40)
    assert first == plain_greedy(first_prompt, 40)
    return inner, target, first_prompt, [*first_prompt, *first[:-1], 9, 9, 4]


@pytest.mark.parametrize(
    ("alike", "grid", "settled", "reused"),
    [
        ("all", 4, 49, 49),  # every position alike: the answer's too (all but its last token, not fed yet)
        ("all", 0, 49, 49),
        ("prompts", 4, 10, 10),  # a prompt's positions alike: the first prompt, off the grid; the answer again
        ("prompts", 0, 10, 10),
        ("none", 4, 8, 8),  # only the whole chunks of the first prompt
        ("none", 0, 0, 0),
    ],
)
def test_a_next_turn_reuses_what_the_stages_compute_alike(alike: str, grid: int, settled: int, reused: int) -> None:
    inner, target, _, second_prompt = _two_turns(alike, grid)
    assert target.settled == settled
    assert target.reusable(second_prompt) == reused
    before = inner.computed
    target.resume()
    assert _answer(target, second_prompt, 30) == plain_greedy(second_prompt, 30)
    assert target.reused == reused
    assert inner.computed - before >= len(second_prompt) - reused  # the prompt's rest, then decoding


def test_a_resumed_prompt_on_stages_alike_in_prompts_never_starts_with_one_position_off_the_grid() -> None:
    # one-position prompt steps take other kernels: a kept session gives up one more position instead
    target = ResumableTarget(ScriptedTarget(alike="prompts"), GREEDY, grid=4)
    asyncio.run(target.step(list(range(1, 12)), 0, last_only=True))  # 11 positions: [0, 4) [4, 8) [8, 11)
    assert target.settled == 11
    assert target.reusable([*range(1, 12), 20, 21]) == 10  # 11 would leave [11, 12) alone: [10, 12) instead
    assert target.reusable([*range(1, 11), 30, 31]) == 10  # parts at 10, whose step [10, 12) has two positions
    assert target.reusable([*range(1, 9), 20]) == 8  # on a boundary: cut as a fresh prompt is, one position or not
    one_step = ResumableTarget(ScriptedTarget(alike="prompts"), GREEDY, grid=0)
    asyncio.run(one_step.step(list(range(1, 11)), 0, last_only=True))
    assert one_step.reusable([*range(1, 11), 20]) == 9  # a prompt is one step: at least two positions of it

    # a one-position prompt step is not settled, nor a decoding step; a rewind into settled positions cuts them
    target = ResumableTarget(ScriptedTarget(alike="prompts"), GREEDY, grid=4)
    asyncio.run(target.step([1], 0, last_only=True))
    assert target.settled == 0
    asyncio.run(target.step([2, 3, 4, 5, 6], 0, last_only=True))
    assert target.settled == 0  # nothing before it was settled
    asyncio.run(target.step([7, 8, 9], 6, last_only=True))  # everything again: a fresh prompt
    assert target.settled == 3
    asyncio.run(target.step([1, 2, 3, 4, 5, 6], 3, last_only=True))  # 0..5 again, as one prompt
    assert target.settled == 6
    asyncio.run(target.step([7, 8], 0, last_only=False))
    assert target.settled == 6
    asyncio.run(target.step([9], 4, last_only=False))
    assert target.settled == 4


def test_what_a_ring_computes_alike_is_the_least_of_its_stages() -> None:
    class Claim:
        def __init__(self, alike: str) -> None:
            self.alike = alike

    assert stages_alike([Claim("all"), Claim("prompts")]) == "prompts"  # type: ignore[list-item]
    assert stages_alike([Claim("prompts"), Claim("none"), Claim("all")]) == "none"  # type: ignore[list-item]
    assert stages_alike([]) == "all"
    assert step_is_settled("all", 1, last_only=False)
    assert step_is_settled("prompts", 2, last_only=True)
    assert not step_is_settled("prompts", 1, last_only=True)
    assert not step_is_settled("prompts", 5, last_only=False)
    assert not step_is_settled("none", 500, last_only=True)


@pytest.mark.parametrize(
    ("prompt", "common", "expected"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], 7, 6),  # exactly what is held: the last position is computed again, its chunk too
        ([1, 2, 3], 2, 2),  # shorter than what is held
        ([1, 2, 11, 11, 11, 11, 11, 11, 11, 11], 2, 2),  # parts early
        ([1, 2, 3, 11, 11, 11], 3, 2),  # parts within a chunk: from its start
        ([5, 5, 5], 0, 0),  # shares nothing
    ],
)
def test_resumed_prompt_gives_the_tokens_of_a_fresh_session(prompt: list[int], common: int, expected: int) -> None:
    inner = ScriptedTarget()
    target = ResumableTarget(inner, GREEDY, grid=2)
    asyncio.run(target.step([1, 2, 3, 4, 5, 6, 7, 8], 0, last_only=True))
    assert target.common_prefix(prompt) == common
    target.resume()
    assert _answer(target, prompt, 25) == plain_greedy(prompt, 25)
    assert target.reused == expected


def test_a_resumed_prompt_is_sent_whole() -> None:
    target = ResumableTarget(ScriptedTarget(), GREEDY, grid=4)
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
        target = ResumableTarget(lost, GREEDY, grid=4)
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
        replayed.resume(whole=True)  # the answer goes on from its history: only its last token is fed again
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
