"""The KV block allocator (``agent.runtime.kv_blocks``): tables grow, shrink and free without ever sharing a block,
and a full pool says so without changing anything."""

from __future__ import annotations

import random

import pytest

from agent.runtime.kv_blocks import BlockAllocator, BlockTable


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
