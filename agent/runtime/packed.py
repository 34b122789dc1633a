"""Several sessions' steps through one node's stages at once: the contract between a stage server's scheduler
(which steps go together) and the runtime (how they are computed).

A stage server gathers the steps of several sessions that are ready at the same moment and hands them here in
one call. Where the stages can pack (``kv = "paged"``: their sessions keep their KV in one shared block pool,
``agent.runtime.paged_kv``), the steps' new positions go through each stage in one inference; elsewhere they run
one after another, as before. Either way each step's output is its own array, and each session's numbers are
those it would get alone wherever ``packs_alike`` says so (issue 45).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from agent.errors import FleetBusyError
from agent.runtime.kv_blocks import BlockPool, PooledSession
from agent.runtime.paged_kv import PagedKV, PagedKVSession, PagedRow
from agent.runtime.protocol import KVSession, Stage


@dataclass(frozen=True)
class PackedStep:
    """One session's step through the stages this node holds."""

    sessions: Sequence[KVSession]
    """The session's KV state on each of the node's stages, in stage order."""
    inputs: np.ndarray
    """``[1, n]`` token ids (the first stage embeds) or ``[1, n, hidden]`` hidden states."""
    position: int
    """The logical position of the first new one (after the rewind)."""
    rewind: int = 0
    """Kept positions to forget first (rejected drafts)."""
    last_only: bool = False
    """Only the last position's logits are wanted (a prompt, or a step without drafts)."""


@runtime_checkable
class PackingStage(Protocol):
    """What a stage that may pack says of it (``CompiledStage``); a stage without these runs steps one by one."""

    kv: str
    """Where its sessions keep their KV: ``state`` (their own; never packed) or ``paged`` (one shared pool)."""
    packs_alike: bool
    """Whether a session's numbers are those it gets alone, whatever is packed beside it."""

    @property
    def kv_pool(self) -> BlockPool | None:
        """Its sessions' shared pool of KV blocks (None: they keep KV of their own)."""
        ...


def kv_mode(stage: Stage) -> str:
    """Where ``stage``'s sessions keep their KV (``RuntimeConfig.kv``): ``state`` for stages that do not say."""
    return stage.kv if isinstance(stage, PackingStage) else "state"


def kv_blocks(stage: Stage) -> tuple[int, int] | None:
    """The blocks of ``stage`` 's KV pool in use and all told (None: its sessions keep KV of their own)."""
    pool = stage.kv_pool if isinstance(stage, PackingStage) else None
    return None if pool is None else (pool.allocator.blocks - pool.available_blocks(), pool.allocator.blocks)


def packs_alike(stages: Sequence[Stage]) -> bool:
    """Whether packing steps through ``stages`` leaves every session's numbers as they are alone: true of stages
    that never pack (they run steps one by one), measured for paged ones (``agent.runtime.paged_kv``). Where
    false, a packed step is computed otherwise than the session alone would: not repeatable."""
    return all(stage.packs_alike for stage in stages if isinstance(stage, PackingStage))


def run_packed(steps: Sequence[PackedStep]) -> list[np.ndarray]:
    """Run ``steps`` (of distinct sessions) through their stages; returns each step's output in order (hidden
    states, or logits as ``run_stages`` gives them), each an array of its own. Blocking: call it off the loop.

    On each stage the rows of sessions of one paged pool go through one inference; others step one by one.
    Raises ``FleetBusyError`` when a paged stage has too few free KV blocks for all the steps' new positions,
    before anything was computed (the rewinds are done): run the steps one at a time to learn which has no room.
    """
    for step in steps:
        for session in step.sessions:
            session.rewind(step.rewind)
    _reserve(steps)
    xs = [step.inputs for step in steps]
    depth = max((len(step.sessions) for step in steps), default=0)
    for i in range(depth):
        pools: dict[int, tuple[PagedKV, list[int]]] = {}
        for j, step in enumerate(steps):
            if i >= len(step.sessions):
                continue
            session = step.sessions[i]
            if isinstance(session, PagedKVSession):
                pools.setdefault(id(session.kv), (session.kv, []))[1].append(j)
            else:
                xs[j] = session.step(xs[j], _positions(step), last_only=step.last_only)
        for kv, members in pools.values():
            rows = [_row(steps[j], steps[j].sessions[i], xs[j]) for j in members]
            for j, out in zip(members, kv.run(rows), strict=True):
                xs[j] = out
    return [np.array(x) for x in xs]


def _positions(step: PackedStep) -> np.ndarray:
    return np.arange(step.position, step.position + step.inputs.shape[1], dtype=np.int64)[None]


def _row(step: PackedStep, session: KVSession, x: np.ndarray) -> PagedRow:
    if not isinstance(session, PagedKVSession):
        raise TypeError(f"{type(session).__name__} is not a paged session")
    return PagedRow(session, x, _positions(step), step.last_only)


def _reserve(steps: Sequence[PackedStep]) -> None:
    """Reserve on every paged stage the blocks all the steps need, or none (``FleetBusyError``)."""
    pools: dict[int, tuple[PagedKV, list[PagedRow]]] = {}
    for step in steps:
        for session in step.sessions:
            if isinstance(session, PagedKVSession):
                pools.setdefault(id(session.kv), (session.kv, []))[1].append(_row(step, session, step.inputs))
    reserved: list[tuple[PagedKV, list[PagedRow]]] = []
    try:
        for kv, rows in pools.values():
            kv.reserve(rows)
            reserved.append((kv, rows))
    except FleetBusyError:
        for kv, rows in reserved:
            kv.unreserve(rows)
        raise


def block_needs(steps: Sequence[PackedStep]) -> tuple[list[dict[Hashable, int]], dict[Hashable, int]]:
    """What ``steps`` ask of the KV block pools of their stages: each step's new blocks in each pool (after its
    rewind), and the blocks each pool has free (with those the rewinds give back). Stages whose sessions keep KV of
    their own are not counted."""
    needs: list[dict[Hashable, int]] = []
    free: dict[Hashable, int] = {}
    for step in steps:
        need: dict[Hashable, int] = {}
        for session in step.sessions:
            if not isinstance(session, PooledSession):
                continue
            pool, table = session.pool, session.table
            if id(pool) not in free:
                free[id(pool)] = pool.available_blocks()
            allocator = pool.allocator
            kept = min(len(table.blocks), allocator.blocks_for(step.position))
            free[id(pool)] += len(table.blocks) - kept
            need[id(pool)] = allocator.blocks_for(step.position + step.inputs.shape[1]) - kept
        needs.append(need)
    return needs, free


def held_blocks(sessions: Sequence[KVSession]) -> dict[Hashable, int]:
    """The KV blocks ``sessions`` (one conversation's, on a node's stages) hold in each pool."""
    return {id(s.pool): len(s.table.blocks) for s in sessions if isinstance(s, PooledSession)}


def run_packed_or_each(steps: Sequence[PackedStep]) -> list[np.ndarray | FleetBusyError]:
    """``run_packed``, or where a stage's KV pool has no room for all the steps' positions, each step alone (its
    rewind done already): a step that has no room even alone gets its ``FleetBusyError``, not the others."""
    try:
        return list(run_packed(steps))
    except FleetBusyError as exc:
        if len(steps) == 1:
            return [exc]
    outputs: list[np.ndarray | FleetBusyError] = []
    for step in steps:
        try:
            outputs += run_packed([dataclasses.replace(step, rewind=0)])
        except FleetBusyError as exc:
            outputs.append(exc)
    return outputs
