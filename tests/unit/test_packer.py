"""The stage's packing decision (agent.runtime.packer): budgets, order, chunking, turns between sessions and heads,
the gathering window; plain values and a fake clock."""

from __future__ import annotations

import pytest

from agent.errors import ShoalError
from agent.runtime.packer import (
    FORGET_AFTER,
    Pack,
    PackPolicy,
    ReadyStep,
    Slice,
    Turns,
    Wait,
    next_chunk,
    plan,
)

POLICY = PackPolicy(budget=16)


def decode(session: int, head: int = 1, count: int = 1, arrived: float = 0.0) -> ReadyStep:
    return ReadyStep(session, head, count, prompt=False, arrived=arrived)


def prompt(session: int, count: int, head: int = 1, arrived: float = 0.0, done: int = 0) -> ReadyStep:
    return ReadyStep(session, head, count, prompt=True, arrived=arrived, done=done)


def packed(decision: Pack | Wait | None) -> list[tuple[int, int, int, bool]]:
    assert isinstance(decision, Pack), decision
    return [(s.session, s.start, s.rows, s.last) for s in decision.slices]


def test_nothing_ready_is_nothing_to_do() -> None:
    assert plan([], 0.0, None, POLICY, Turns()) is None


def test_decode_rows_go_first_then_prompt_rows() -> None:
    ready = [prompt(1, 8, arrived=0.0), decode(2, count=4, arrived=1.0), decode(3, arrived=2.0)]
    assert packed(plan(ready, 3.0, None, POLICY, Turns())) == [(2, 0, 4, True), (3, 0, 1, True), (1, 0, 8, True)]


def test_decode_steps_go_whole_within_the_budget_and_the_rest_wait() -> None:
    ready = [decode(1, count=8, arrived=0.0), decode(2, count=8, arrived=1.0), decode(3, count=4, arrived=2.0)]
    decision = plan(ready, 3.0, None, POLICY, Turns())
    assert packed(decision) == [(1, 0, 8, True), (2, 0, 8, True)]
    assert isinstance(decision, Pack) and decision.rows == POLICY.budget


def test_one_decode_step_larger_than_the_budget_still_goes() -> None:
    assert packed(plan([decode(1, count=40)], 0.0, None, POLICY, Turns())) == [(1, 0, 40, True)]


def test_a_long_prompt_goes_in_chunks_of_the_budget() -> None:
    step = prompt(1, 40)
    assert packed(plan([step], 0.0, None, POLICY, Turns())) == [(1, 0, 16, False)]
    assert packed(plan([prompt(1, 40, done=16)], 0.0, None, POLICY, Turns())) == [(1, 16, 16, False)]
    assert packed(plan([prompt(1, 40, done=32)], 0.0, None, POLICY, Turns())) == [(1, 32, 8, True)]


def test_a_prompt_is_cut_the_same_whoever_else_is_queued() -> None:
    """The cuts are fixed offsets of the prompt, not what the decode rows leave of the budget: a prompt's numbers
    must not depend on the load."""
    alone = packed(plan([prompt(1, 40)], 0.0, None, POLICY, Turns()))
    beside = packed(plan([prompt(1, 40), decode(2, count=5), decode(3, count=5)], 0.0, None, POLICY, Turns()))
    assert beside[-1] == alone[0]


def test_a_prompt_alone_goes_whole_where_cuts_do_not_change_its_numbers() -> None:
    loose = PackPolicy(budget=16, fixed_cuts=False)
    assert packed(plan([prompt(1, 40)], 0.0, None, loose, Turns())) == [(1, 0, 40, True)]
    assert packed(plan([prompt(1, 40, done=16)], 0.0, None, loose, Turns())) == [(1, 16, 24, True)]
    beside = plan([prompt(1, 40), decode(2)], 0.0, None, loose, Turns())
    assert packed(beside) == [(2, 0, 1, True), (1, 0, 16, False)]


def test_a_last_piece_of_one_position_joins_the_chunk_before() -> None:
    assert next_chunk(prompt(1, 17), 16) == 17
    assert next_chunk(prompt(1, 18), 16) == 16
    assert next_chunk(prompt(1, 33, done=16), 16) == 17


def test_a_prompt_stalls_decode_rows_by_at_most_one_budget() -> None:
    """Decode rows that fill the budget still leave room for one prompt chunk (the prompt progresses), never
    more than one."""
    ready = [decode(s, count=8, arrived=s) for s in (1, 2)] + [prompt(3, 64, arrived=3), prompt(4, 64, arrived=4)]
    decision = plan(ready, 5.0, None, POLICY, Turns())
    assert packed(decision) == [(1, 0, 8, True), (2, 0, 8, True), (3, 0, 16, False)]
    assert isinstance(decision, Pack) and decision.rows - 16 <= POLICY.budget


def test_prompts_share_what_the_budget_leaves() -> None:
    ready = [decode(1, count=2), prompt(2, 6, arrived=1), prompt(3, 6, arrived=2), prompt(4, 6, arrived=3)]
    assert packed(plan(ready, 4.0, None, POLICY, Turns())) == [(1, 0, 2, True), (2, 0, 6, True), (3, 0, 6, True)]


def test_the_oldest_step_goes_first_among_sessions_never_served() -> None:
    ready = [decode(1, count=10, arrived=5.0), decode(2, count=10, arrived=1.0)]
    assert packed(plan(ready, 6.0, None, POLICY, Turns()))[0][0] == 2


def test_sessions_take_turns_when_the_budget_is_short() -> None:
    """Two sessions each of a full budget: they alternate, whatever their arrival."""
    turns = Turns()
    served = []
    for now in range(6):
        ready = [decode(1, count=16, arrived=0.0), decode(2, count=16, arrived=1.0)]
        decision = plan(ready, float(now), None, POLICY, turns)
        assert isinstance(decision, Pack)
        served.append(decision.slices[0].session)
        turns = turns.after(decision, ready)
    assert served == [1, 2, 1, 2, 1, 2]


def test_a_head_with_many_sessions_does_not_starve_a_head_with_one() -> None:
    """Head 7 has five sessions queued before head 9's one; the budget holds two steps: head 9 goes in the very
    first pack, and in every pack after, one round of heads at a time."""
    ready = [decode(s, head=7, count=8, arrived=float(s)) for s in range(1, 6)]
    ready.append(decode(9, head=9, count=8, arrived=9.0))
    turns = Turns()
    heads_served = []
    for now in range(4):
        decision = plan(ready, 10.0 + now, None, POLICY, turns)
        assert isinstance(decision, Pack)
        heads_served.append(sorted(7 if s.session < 9 else 9 for s in decision.slices))
        turns = turns.after(decision, ready)
    assert heads_served == [[7, 9]] * 4


def test_a_head_served_last_waits_behind_one_not_served_yet() -> None:
    turns = Turns().after(Pack((Slice(1, 0, 1, True),)), [decode(1, head=7)])
    ready = [decode(1, head=7, count=16, arrived=0.0), decode(2, head=8, count=16, arrived=5.0)]
    assert packed(plan(ready, 6.0, None, POLICY, turns))[0][0] == 2


def test_turns_forget_the_long_unserved() -> None:
    turns = Turns().after(Pack((Slice(1, 0, 1, True),)), [decode(1, head=7)])
    for _ in range(FORGET_AFTER):
        turns = turns.after(Pack((Slice(2, 0, 1, True),)), [decode(2, head=8)])
    assert 1 not in turns.sessions and 7 not in turns.heads
    assert turns.sessions[2] == turns.packs and turns.heads[8] == turns.packs


def test_a_busy_stage_packs_what_is_queued_at_once() -> None:
    policy = PackPolicy(budget=16, window=0.002)
    assert isinstance(plan([decode(1, arrived=10.0)], 10.0, None, policy, Turns()), Pack)


def test_an_idle_stage_waits_the_window_for_others() -> None:
    policy = PackPolicy(budget=16, window=0.002)
    assert plan([decode(1, arrived=10.0)], 10.0005, 9.0, policy, Turns()) == Wait(10.002)
    assert isinstance(plan([decode(1, arrived=10.0)], 10.002, 9.0, policy, Turns()), Pack)


def test_an_idle_stage_waits_no_longer_once_the_budget_is_full() -> None:
    policy = PackPolicy(budget=16, window=0.002)
    ready = [decode(1, count=8, arrived=10.0), decode(2, count=8, arrived=10.0001)]
    assert isinstance(plan(ready, 10.0002, 9.0, policy, Turns()), Pack)


def test_no_window_means_no_wait() -> None:
    assert isinstance(plan([decode(1, arrived=10.0)], 10.0, 9.0, POLICY, Turns()), Pack)


def test_two_steps_of_one_session_are_refused() -> None:
    with pytest.raises(ShoalError, match="one after another"):
        plan([decode(1), decode(1)], 0.0, None, POLICY, Turns())


@pytest.mark.parametrize(("budget", "window"), [(1, 0.0), (16, -0.1)])
def test_policy_is_checked(budget: int, window: float) -> None:
    with pytest.raises(ShoalError):
        PackPolicy(budget=budget, window=window)
