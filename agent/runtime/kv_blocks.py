"""Which KV blocks of a stage's pool each session holds: a fixed pool of blocks, a block table per session.

A stage that keeps its sessions' KV in paged blocks (``agent.runtime.paged_kv``) has one pool of ``blocks``
blocks of ``block_size`` positions per layer; every layer uses the same block numbers, so one table per
session serves them all. Pure Python: the pool's arrays live with the stage, this only does the bookkeeping
(as openvino.genai's ``BlockManager`` does for its ``KVCacheManager``).

Running out of blocks is an outcome, never a crash: ``reserve`` says False and changes nothing, and the stage
answers the session as the stage server answers a full table (``FleetBusyError``, "fleet busy").
"""

from __future__ import annotations

import heapq


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
