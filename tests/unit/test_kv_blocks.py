"""The KV block allocator (``agent.runtime.kv_blocks``): tables grow, shrink and free without ever sharing a block,
and a full pool says so without changing anything."""

from __future__ import annotations

import random

import pytest

from agent.runtime.kv_blocks import BlockAllocator, BlockTable, Holder, evictions


def test_a_table_grows_block_by_block_and_shrinks_back() -> None:
    pool = BlockAllocator(blocks=8, block_size=4)
    table = BlockTable()
    assert pool.reserve(table, 1) and table.blocks == [0]
    table.length = 1
    assert pool.reserve(table, 4) and table.blocks == [0], "four positions fit one block"
    assert pool.reserve(table, 9) and table.blocks == [0, 1, 2]
    table.length = 9
    pool.truncate(table, 5)
    assert (table.length, table.blocks, pool.free_blocks) == (5, [0, 1], 6)
    pool.truncate(table, 4)
    assert (table.blocks, pool.free_blocks) == ([0], 7)


def test_a_full_pool_refuses_and_changes_nothing() -> None:
    pool = BlockAllocator(blocks=3, block_size=2)
    a, b = BlockTable(), BlockTable()
    assert pool.reserve(a, 4)
    a.length = 4
    assert not pool.reserve(b, 3), "needs 2 blocks, 1 is free"
    assert (b.blocks, pool.free_blocks) == ([], 1)
    assert not pool.fits([(a, 6), (b, 1)])
    assert pool.fits([(a, 6)]) and pool.fits([(b, 2)])
    pool.free(a)
    assert a.blocks == [] and a.length == 0 and pool.free_blocks == 3
    assert pool.reserve(b, 6) and sorted(b.blocks) == [0, 1, 2]


def test_blocks_reserved_for_a_step_that_never_ran_go_back() -> None:
    pool = BlockAllocator(blocks=4, block_size=2)
    table = BlockTable()
    assert pool.reserve(table, 2)
    table.length = 2
    assert pool.reserve(table, 7) and len(table.blocks) == 4
    pool.truncate(table, table.length)  # the step failed: its length never grew
    assert table.blocks == [0] and pool.free_blocks == 3


def test_freed_blocks_are_lent_lowest_first() -> None:
    pool = BlockAllocator(blocks=6, block_size=1)
    a, b = BlockTable(), BlockTable()
    pool.reserve(a, 3)
    pool.reserve(b, 2)
    a.length = 3
    pool.free(a)
    c = BlockTable()
    pool.reserve(c, 2)
    assert c.blocks == [0, 1]


@pytest.mark.parametrize("bad", [(0, 4), (4, 0)])
def test_an_empty_pool_is_refused(bad: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        BlockAllocator(*bad)


def test_truncating_beyond_the_length_is_refused() -> None:
    pool = BlockAllocator(blocks=2, block_size=2)
    table = BlockTable()
    with pytest.raises(ValueError):
        pool.truncate(table, 1)


def test_random_sessions_never_share_a_block_nor_lose_one() -> None:
    """Many sessions growing, rewinding, resetting at random: every block is in exactly one place, each table
    holds exactly the blocks its length needs, and a refusal leaves the pool as it was."""
    rng = random.Random(45)
    pool = BlockAllocator(blocks=40, block_size=16)
    tables = [BlockTable() for _ in range(8)]
    refused = 0
    for _ in range(3000):
        table = rng.choice(tables)
        move = rng.random()
        if move < 0.6:
            grow = rng.choice([1, 1, 1, 5, 17, 120])
            free_before = pool.free_blocks
            if pool.reserve(table, table.length + grow):
                table.length += grow
            else:
                refused += 1
                assert pool.free_blocks == free_before
        elif move < 0.9:
            pool.truncate(table, table.length - rng.randint(0, min(table.length, 9)))
        else:
            pool.free(table)
        held = [b for t in tables for b in t.blocks]
        assert len(held) == len(set(held)) and len(held) + pool.free_blocks == pool.blocks
        assert all(len(t.blocks) == pool.blocks_for(t.length) for t in tables)
    assert refused, "the pool never filled: the test asked too little of it"


# -- eviction under pressure: which parked sessions give their blocks to a pack's steps -----------------------------


def _parked(session: int, at: float, **blocks: int) -> Holder:
    return Holder(session, at, blocks)


def test_a_pack_that_fits_evicts_nobody() -> None:
    parked = [_parked(1, 0.0, a=4)]
    assert evictions([{"a": 2}, {"a": 1}], {"a": 3}, parked) == ()
    assert evictions([], {"a": 0}, parked) == ()


def test_the_sessions_parked_longest_ago_go_first_and_no_more_than_needed() -> None:
    parked = [_parked(1, 5.0, a=2), _parked(2, 1.0, a=1), _parked(3, 3.0, a=2), _parked(4, 9.0, a=8)]
    assert evictions([{"a": 3}], {"a": 1}, parked) == (2, 3), "2 short: the one parked at 1 s, then at 3 s"
    assert evictions([{"a": 2}], {"a": 1}, parked) == (2,)
    assert evictions([{"a": 14}], {"a": 1}, parked) == (2, 3, 1, 4)


def test_a_step_no_eviction_could_seat_evicts_nobody_for_it() -> None:
    parked = [_parked(1, 0.0, a=2), _parked(2, 1.0, a=2)]
    assert evictions([{"a": 9}], {"a": 1}, parked) == (), "4 blocks parked, 8 missing: nobody is evicted in vain"
    # the first two steps can be seated, the third not: blocks for the first two only
    assert evictions([{"a": 2}, {"a": 1}, {"a": 9}], {"a": 1}, parked) == (1,)
    assert evictions([{"a": 2}, {"a": 3}, {"a": 9}], {"a": 1}, parked) == (1, 2)


def test_every_pool_of_a_node_must_have_room() -> None:
    """A node holding two stages has two pools: a victim's blocks count in the pool they are in."""
    parked = [_parked(1, 0.0, a=3), _parked(2, 1.0, b=1), _parked(3, 2.0, a=1, b=2)]
    assert evictions([{"a": 1, "b": 2}], {"a": 0, "b": 0}, parked) == (1, 2, 3)
    assert evictions([{"a": 1, "b": 0}], {"a": 0, "b": 0}, parked) == (1,)
    assert evictions([{"b": 2}], {"a": 0, "b": 1}, parked) == (1, 2), "the oldest goes first even if it frees only a"


def test_pools_a_step_does_not_use_are_not_its_concern() -> None:
    parked = [_parked(1, 0.0, b=5)]
    assert evictions([{"a": 1}], {"a": 0}, parked) == ()


@pytest.mark.parametrize("seed", range(20))
def test_random_packs_get_the_longest_prefix_that_can_be_seated(seed: int) -> None:
    """Against a brute force: the victims are the oldest few, and seat the longest prefix of steps possible."""
    rng = random.Random(seed)
    parked = [_parked(i, rng.random(), a=rng.randint(0, 4), b=rng.randint(0, 3)) for i in range(rng.randint(0, 6))]
    needs = [{"a": rng.randint(0, 4), "b": rng.randint(0, 2)} for _ in range(rng.randint(1, 5))]
    free = {"a": rng.randint(0, 3), "b": rng.randint(0, 3)}
    victims = evictions(needs, free, parked)
    oldest = [h.session for h in sorted(parked, key=lambda h: (h.parked_at, h.session))]
    assert list(victims) == oldest[: len(victims)]
    by_id = {h.session: h for h in parked}

    def seated(evicted: list[int]) -> int:
        room = {p: free[p] + sum(by_id[v].blocks[p] for v in evicted) for p in free}
        count = 0
        for need in needs:
            if any(need[p] > room[p] for p in room):
                break
            room = {p: room[p] - need[p] for p in room}
            count += 1
        return count

    best = seated(oldest)
    if seated([]) == len(needs) or best == 0:
        assert victims == ()
    else:
        assert seated(list(victims)) == best
        assert len(victims) == min(k for k in range(len(oldest) + 1) if seated(oldest[:k]) == best)
