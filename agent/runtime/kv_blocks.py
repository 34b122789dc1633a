"""Which KV blocks of a stage's pool each session holds: a fixed pool of blocks, a block table per session.

A stage that keeps its sessions' KV in paged blocks (``agent.runtime.paged_kv``) has one pool of ``blocks``
blocks of ``block_size`` positions per layer; every layer uses the same block numbers, so one table per
session serves them all. Pure Python: the pool's arrays live with the stage, this only does the bookkeeping
(as openvino.genai's ``BlockManager`` does for its ``KVCacheManager``).

Running out of blocks is an outcome, never a crash: ``reserve`` says False and changes nothing, and the stage
answers the session as the stage server answers a full table (``FleetBusyError``, "fleet busy"). Before that, a
stage server gives the blocks of the sessions parked the longest ago to the steps that need them (``evictions``),
as it gives their places in its session table to new sessions.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class BlockTable:
    """The blocks one session's positions live in, in order: position ``p`` is slot ``p % block_size`` of
    block ``blocks[p // block_size]``."""

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.length = 0
        """Positions the session holds (its logical length: rejected drafts are truncated away)."""

    def __repr__(self) -> str:
        return f"BlockTable(length={self.length}, blocks={self.blocks})"


class BlockAllocator:
    """A fixed pool of ``blocks`` KV blocks of ``block_size`` positions, lent to sessions' block tables.

    Free blocks are handed out lowest number first, so a pool mostly idle keeps touching the same few blocks
    (the pages of a pool never used are never made resident).
    """

    def __init__(self, blocks: int, block_size: int) -> None:
        if blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs at least one block of at least one position, not {blocks} x {block_size}")
        self.blocks = blocks
        self.block_size = block_size
        self._free = list(range(blocks))  # a heap (sorted is one)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def used_blocks(self) -> int:
        return self.blocks - len(self._free)

    def blocks_for(self, positions: int) -> int:
        """Blocks that ``positions`` positions fill."""
        return -(-positions // self.block_size)

    def fits(self, tables: list[tuple[BlockTable, int]]) -> bool:
        """Whether every ``(table, positions)`` could be reserved at once from the free blocks."""
        wanted = sum(max(0, self.blocks_for(n) - len(t.blocks)) for t, n in tables)
        return wanted <= len(self._free)

    def reserve(self, table: BlockTable, positions: int) -> bool:
        """Make ``table`` hold blocks for ``positions`` positions (its length is not changed: the caller sets it
        once the positions are written). False, and nothing changed, where the pool has too few free blocks."""
        missing = self.blocks_for(positions) - len(table.blocks)
        if missing <= 0:
            return True
        if missing > len(self._free):
            return False
        table.blocks.extend(heapq.heappop(self._free) for _ in range(missing))
        return True

    def truncate(self, table: BlockTable, length: int) -> None:
        """Shorten ``table`` to its first ``length`` positions; blocks left empty (or reserved for a step that never
        ran) go back to the pool. The positions after ``length`` in its last block are overwritten by the next step."""
        if length < 0 or length > table.length:
            raise ValueError(f"cannot truncate {table.length} positions to {length}")
        table.length = length
        keep = self.blocks_for(length)
        for block in table.blocks[keep:]:
            heapq.heappush(self._free, block)
        del table.blocks[keep:]

    def free(self, table: BlockTable) -> None:
        """Give every block of ``table`` back (those reserved beyond its length too); it then holds nothing."""
        self.truncate(table, 0)


class BlockPool(Protocol):
    """A stage's pool of KV blocks as the sessions' scheduler sees it (``PagedKV``)."""

    allocator: BlockAllocator

    def available_blocks(self) -> int:
        """Blocks free now, with those of sessions gone whose blocks go back at the pool's next step."""
        ...


@runtime_checkable
class PooledSession(Protocol):
    """A session whose KV lives in a shared pool's blocks (``PagedKVSession``)."""

    table: BlockTable

    @property
    def pool(self) -> BlockPool: ...

    def release(self) -> None:
        """End the session: its blocks go back to the pool (at once, or at the pool's next step)."""
        ...


@dataclass(frozen=True)
class Holder:
    """A parked session as eviction sees it: when it was parked, and the blocks it holds in each pool."""

    session: int
    parked_at: float
    blocks: Mapping[Hashable, int]


def evictions(
    needs: Sequence[Mapping[Hashable, int]], free: Mapping[Hashable, int], parked: Sequence[Holder]
) -> tuple[int, ...]:
    """The parked sessions to evict so that a pack's steps get the KV blocks they need, those parked the longest
    ago first, and no more of them than needed.

    ``needs``: each step's new blocks in each pool, in the pack's order; ``free``: the blocks each pool has free.
    As many of the first steps as can get blocks do (a step that could not, even with every parked session gone,
    is answered "fleet busy" with the steps after it, and evicts nobody): none where every step fits already."""
    oldest = sorted(parked, key=lambda h: (h.parked_at, h.session))
    for count in range(len(needs), 0, -1):
        short = _added(needs[:count])
        for pool, blocks in free.items():
            short[pool] = short.get(pool, 0) - blocks
        if not _covers(_added([h.blocks for h in oldest]), short):
            continue
        victims: list[int] = []
        gained: dict[Hashable, int] = {}
        for holder in oldest:
            if _covers(gained, short):
                break
            victims.append(holder.session)
            gained = _added([gained, holder.blocks])
        return tuple(victims)
    return ()


def _added(counts: Sequence[Mapping[Hashable, int]]) -> dict[Hashable, int]:
    total: dict[Hashable, int] = {}
    for count in counts:
        for pool, blocks in count.items():
            total[pool] = total.get(pool, 0) + blocks
    return total


def _covers(gained: Mapping[Hashable, int], short: Mapping[Hashable, int]) -> bool:
    return all(gained.get(pool, 0) >= missing for pool, missing in short.items())
