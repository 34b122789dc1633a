"""Sessions whose KV lives only in the stage's paged block pool, and packed inference over several of them.

In this mode (``RuntimeConfig.kv = "paged"``) a stage compiles its graph once, after OpenVINO's SDPA-to-
PagedAttention transformation (``agent.runtime.paged_prefill.paged_graph``), and binds one pool of KV blocks per
layer to one infer request, once (as openvino.genai's ``KVCacheManager`` does). A session owns no request and no
state: only a block table (``agent.runtime.kv_blocks``) and its length. Every step, a prompt's or a decode's, is an
inference on that request; the steps of several sessions go through it together, their new positions one after
another with each one's ``past_lens``, ``subsequence_begins`` and block table (``PagedKV.run``), and the output is
split back per session. A rewind truncates the session's length: the rejected positions' slots are written over
by its next step. Nothing is copied between a state and the blocks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

from agent.errors import FleetBusyError, RuntimeStageError
from agent.runtime.hidden_precision import Widener
from agent.runtime.kv_blocks import BlockAllocator, BlockTable
from agent.runtime.paged_prefill import PagedPrefill, sequences_feed


@dataclass(frozen=True)
class PagedRow:
    """One session's new positions in a packed inference."""

    session: PagedKVSession
    inputs: np.ndarray
    """``[1, n]`` token ids or ``[1, n, hidden]`` hidden states."""
    positions: np.ndarray | None = None
    """``[1, n]`` logical positions; None: continuing the session's length."""
    last_only: bool = False
    """Only the last position's logits are wanted (a head reads that row alone)."""


class PagedKV:
    """A stage's paged compilation, its block pool (one array per layer, bound to one request once) and the
    allocator lending the pool's blocks to the sessions it makes."""

    def __init__(self, compiled: PagedPrefill, blocks: int, name: str = "stage", *, pads: bool = False) -> None:
        """``blocks``: the pool's size in blocks of ``compiled.block_size`` positions. The arrays are zeroed
        lazily by the OS: blocks never used cost no memory. ``pads``: an inference of one position gets a second,
        unread one (in a block of its own), and a head reads at least two rows, so that no matmul ever takes one
        row (on two threads below f32 the plugin rounds one row otherwise than two or more: ``paged_pads``)."""
        self.compiled = compiled
        self._widen = Widener() if compiled.widens else None
        self.name = name
        self.allocator = BlockAllocator(blocks + pads, compiled.block_size)
        self._scratch: list[int] | None = None
        if pads:
            scratch = BlockTable()
            self.allocator.reserve(scratch, 1)
            self._scratch = scratch.blocks
        self._lock = threading.Lock()
        self._released: list[BlockTable] = []  # tables of sessions collected: freed at the next run
        shape = (blocks, compiled.kv_heads, compiled.block_size, compiled.head_size)
        self._arrays = {cache: np.zeros(shape, compiled.blocks.dtype) for cache in compiled.graph.caches}
        self.request = compiled.compiled.create_infer_request()
        for cache, array in self._arrays.items():
            self.request.set_tensor(cache, compiled.blocks.tensor(array))
        # Inputs go in by port as tensors over the arrays themselves: the binding's feed dict (a name lookup, a
        # dtype check and a conversion per input) cost 0.1-0.4 ms of CPU per inference of a SmolLM2 stage, 3-10 %
        self._inputs = {
            name: (i, port.get_element_type().to_dtype())
            for i, port in enumerate(self.request.model_inputs)
            for name in port.get_names()
        }
        self._fed: list[ov.Tensor] = []
        self.inferences = 0
        """Inferences run, all told (one per packed step, more for steps longer than ``inference_positions``)."""

    @property
    def block_size(self) -> int:
        return self.compiled.block_size

    def available_blocks(self) -> int:
        """Blocks free now, with those of sessions released or collected (they go back to the pool at the next
        run). A snapshot taken without the lock, which a run holds for its whole inference: the event loop asks."""
        return self.allocator.free_blocks + sum(len(table.blocks) for table in list(self._released))

    def release(self, table: BlockTable) -> None:
        """Give a session's blocks back at the next run, from any thread and without waiting for the lock (the
        session is never stepped again; its collection releasing it once more frees nothing)."""
        self._released.append(table)

    def new_session(self) -> PagedKVSession:
        """A session holding no blocks yet; its blocks return to the pool when it is reset or collected."""
        session = PagedKVSession(self)
        weakref.finalize(session, self._released.append, session.table)
        return session

    def truncate(self, table: BlockTable, length: int) -> None:
        """Shorten a session's table to ``length`` positions (a rewind, or 0: a reset)."""
        with self._lock:
            self.allocator.truncate(table, length)

    def run(self, rows: Sequence[PagedRow]) -> list[np.ndarray]:
        """One step of each row's session (distinct sessions of this stage), packed into as few inferences as
        ``inference_positions`` allows (one, but for a pack longer than that, whose rows then run one by one).
        Returns each row's output: ``[1, n, hidden]`` hidden states, or a head's logits, ``[1, 1, vocab]`` for a
        ``last_only`` row; views of the request's output, valid until the next run. Raises ``FleetBusyError``
        (nothing changed) where the pool has too few free blocks for the rows' new positions."""
        if not rows:
            return []
        if len({id(r.session) for r in rows}) != len(rows):
            raise RuntimeStageError("a packed step holds each session once")
        for row in rows:
            if row.session.kv is not self:
                raise RuntimeStageError(f"a session of another stage was packed on {self.name}")
            if row.inputs.shape[1] < 1:
                raise RuntimeStageError("step needs at least one position")
        with self._lock:
            self._free_released()
            self._reserve(rows)
            total = sum(r.inputs.shape[1] for r in rows)
            try:
                if len(rows) > 1 and total > self.compiled.inference_positions:
                    outs = [np.array(self._run_chunked(r)) for r in rows]  # each reuses the output buffer
                elif len(rows) == 1:
                    outs = [self._run_chunked(rows[0])]
                else:
                    outs = self._infer(rows)
            except BaseException:
                for row in rows:  # the step did not happen: its sessions hold what they held
                    self.allocator.truncate(row.session.table, row.session.table.length)
                raise
            for row in rows:
                row.session.table.length += row.inputs.shape[1]
            return outs

    def _free_released(self) -> None:
        while self._released:
            self.allocator.free(self._released.pop())

    def reserve(self, rows: Sequence[PagedRow]) -> None:
        """Reserve the blocks ``rows``' new positions need, for all of them or none (``FleetBusyError``)."""
        with self._lock:
            self._free_released()
            self._reserve(rows)

    def unreserve(self, rows: Sequence[PagedRow]) -> None:
        """Give back blocks reserved for ``rows`` beyond what their sessions hold (a step that will not run)."""
        with self._lock:
            for row in rows:
                self.allocator.truncate(row.session.table, row.session.table.length)

    def _reserve(self, rows: Sequence[PagedRow]) -> None:
        wanted = [(r.session.table, r.session.table.length + r.inputs.shape[1]) for r in rows]
        if not self.allocator.fits(wanted):
            need = sum(self.allocator.blocks_for(n) - len(t.blocks) for t, n in wanted)
            raise FleetBusyError(
                f"fleet busy: {self.name} has {self.allocator.free_blocks} free KV blocks of "
                f"{self.allocator.blocks} and this step needs {need}; try again later"
            )
        for table, positions in wanted:
            self.allocator.reserve(table, positions)

    def _run_chunked(self, row: PagedRow) -> np.ndarray:
        """One row alone, in inferences of at most ``inference_positions`` (a long prompt)."""
        step, n = self.compiled.inference_positions, row.inputs.shape[1]
        if n <= step:
            return self._infer([row])[0]
        positions = _positions(row)
        parts = []
        table = row.session.table
        start = table.length
        try:
            for begin in range(0, n, step):
                end = min(n, begin + step)
                part = PagedRow(row.session, row.inputs[:, begin:end], positions[:, begin:end], row.last_only)
                if row.last_only and end < n and row.session.holds_head:  # logits of a prompt's last position only
                    self._infer([part], read=False)
                else:
                    parts.append(np.array(self._infer([part])[0]))
                table.length += end - begin
        finally:
            table.length = start  # the caller counts the whole row
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)

    def _infer(self, rows: Sequence[PagedRow], read: bool = True) -> list[np.ndarray]:
        """One inference over ``rows`` (blocks reserved); each row's output, in order."""
        c = self.compiled
        counts = [r.inputs.shape[1] for r in rows]
        past: list[int] = []
        tables: list[list[int]] = []
        sequences: list[int] = []
        for row, n in zip(rows, counts, strict=True):
            # a row whose every position is read (drafts to verify) goes in as one sequence per position, each
            # attending to the ones before it through the shared blocks: computed as single steps would be
            length, table = row.session.table.length, row.session.table.blocks
            for begin in range(n) if not row.last_only else (0,):
                size = 1 if not row.last_only else n
                past.append(length + begin)
                tables.append(table[: self.allocator.blocks_for(length + begin + size)])
                sequences.append(size)
        inputs = [r.inputs[0] for r in rows]
        positions = [_positions(r)[0] for r in rows]
        if self._scratch is not None and sum(counts) == 1:  # a position of its own beside it, never read
            inputs.append(inputs[0])
            positions.append(np.zeros(1, np.int64))
            past.append(0)
            tables.append(self._scratch)
            sequences.append(1)
        rows_in = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
        feed = sequences_feed(c.graph.token_input, rows_in, np.concatenate(positions), past, sequences, tables)
        if c.selects_positions:
            # a head computes the rows asked for only: each row's last position, or all of its positions
            ends = np.cumsum(counts)
            index = np.concatenate(
                [
                    np.arange(e - 1 if r.last_only or not read else e - n, e)
                    for r, e, n in zip(rows, ends, counts, strict=True)
                ]
            ).astype(np.int64)
            feed["logits_index"] = np.repeat(index, 2) if self._scratch is not None and len(index) == 1 else index
        try:
            fed = []
            for name, array in feed.items():
                port, dtype = self._inputs[name]
                fed.append(ov.Tensor(np.require(array, dtype, "C"), shared_memory=True))
                self.request.set_input_tensor(port, fed[-1])
            # the request reads the arrays, not the tensors' references to them: held until the next inference
            # (a converted copy referenced by its tensor alone could be freed before this one ran)
            self._fed = fed
            self.request.infer()
        except RuntimeError as exc:
            raise RuntimeStageError(f"{self.name}: packed inference of {len(rows)} steps failed: {exc}") from exc
        self.inferences += 1
        out = self.request.get_tensor(c.output).data
        if self._widen is not None:
            out = self._widen(out)
        out = out.reshape(-1, out.shape[-1])
        outs, begin = [], 0
        for row, n in zip(rows, counts, strict=True):
            taken = 1 if c.selects_positions and (row.last_only or not read) else n
            rows_out = out[begin : begin + taken]
            begin += taken
            if row.last_only and row.session.holds_head and not c.selects_positions:
                rows_out = rows_out[-1:]
            outs.append(rows_out[None])
        return outs


def _positions(row: PagedRow) -> np.ndarray:
    if row.positions is not None:
        return row.positions
    start = row.session.table.length
    return np.arange(start, start + row.inputs.shape[1], dtype=np.int64)[None]


class PagedKVSession:
    """One conversation's KV on a paged stage: a block table in the stage's pool (``KVSession``)."""

    def __init__(self, kv: PagedKV) -> None:
        self.kv = kv
        self.table = BlockTable()
        self.holds_head = kv.compiled.output.get_any_name() == "logits"
        self.kv_cut_seconds = 0.0
        """Always 0: a rewind copies nothing."""

    @property
    def pool(self) -> PagedKV:
        """The stage's pool its blocks are lent from (``agent.runtime.kv_blocks.PooledSession``)."""
        return self.kv

    @property
    def logical_length(self) -> int:
        return self.table.length

    def step(self, inputs: np.ndarray, positions: np.ndarray | None = None, last_only: bool = False) -> np.ndarray:
        """Run new positions through the stage alone (``PagedKV.run`` packs several sessions' steps)."""
        return self.kv.run([PagedRow(self, inputs, positions, last_only)])[0]

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions: the length shrinks, blocks left empty go back to the pool."""
        if n < 0 or n > self.table.length:
            raise RuntimeStageError(f"cannot rewind {n} of {self.table.length} positions")
        if n:
            self.kv.truncate(self.table, self.table.length - n)

    def reset(self) -> None:
        """Drop the whole KV (every block back to the pool)."""
        self.kv.truncate(self.table, 0)

    def release(self) -> None:
        """End the session: its blocks go back to the pool at its next run (``PagedKV.release``)."""
        self.kv.release(self.table)


def pool_blocks(positions: int, block_size: int) -> int:
    """Blocks of ``block_size`` positions a pool holding ``positions`` positions has."""
    return max(1, -(-positions // block_size))


# What a paged-KV stage may claim, measured by ``python -m bench.batch_invariance`` (SmolLM2 int4, 3 stages, OpenVINO
# 2026.4, a 2-core AMD EPYC whose CPU plugin computes in bf16 by default; session 0 decoding 16 tokens alone, then
# beside 3 or 7 other decode rows or 3 prompt rows of 24 positions, and its 5 next tokens verified in one step):
# - one thread, ``auto`` (f32 activations quantized to int8 on the fly) and bf16: its logits bit-identical whatever
#   is packed beside it. 5 positions as one sequence against 5 steps: up to 0.37 (auto, a token changed), 1.25
#   (bf16): the plugin's PagedAttention takes a sequence of several positions with other kernels than one of one.
#   The same 5 positions as 5 sequences of one (sharing the session's blocks, each attending to those before it):
#   bit-identical to 5 steps, in both; so ``PagedKV`` verifies drafts that way.
# - one thread, f32: packed beside others, up to 9.4e-5 (a step of one row alone takes other matmul kernels than
#   several rows), 5 positions in one step up to 8.0e-5: the rounding f32's exactness lives with already;
# - two threads, ``auto``: packed beside others, up to 0.62; f32, 7.3e-5. But beside 1, 2, 3, 5 or 7 others alike,
#   bit for bit (auto): only a matmul of one row is rounded otherwise, so such a stage pads (``paged_pads``).


def paged_pads(threads: int | None, f32: bool) -> bool:
    """Whether a paged-KV CPU stage's inferences never take one row alone (``PagedKV``'s ``pads``): on two threads
    below f32, where one row is rounded otherwise than two or more, and two or more all alike."""
    return threads == 2 and not f32


def paged_packs_alike(threads: int | None, f32: bool) -> bool:
    """Whether a session's numbers on a paged-KV CPU stage do not depend on the rows packed beside it: on one
    thread, or two with ``paged_pads`` (bit for bit below f32), or in f32 (to its rounding)."""
    return threads in (1, 2) or f32


def paged_speculation_is_exact(threads: int | None, f32: bool) -> bool:
    """Whether verifying drafts in one step equals single steps on a paged-KV CPU stage: in f32, and on one thread
    or two with ``paged_pads`` (drafts go in as sequences of one position, and the rows beside them do not move
    them)."""
    return f32 or threads in (1, 2)


def paged_computes_alike(threads: int | None, f32: bool) -> str:
    """What a paged-KV CPU stage computes alike however positions are grouped (``agent.runtime.repeatable``):
    ``all`` in f32; ``prompts`` (of at least two positions) on one thread, where every step is on the paged
    compilation as the ``prompts`` rule's prompt steps are; else ``none``."""
    if f32:
        return "all"
    return "prompts" if threads == 1 else "none"
