"""Which ready steps a stage computes together: a pure packing decision (issue 45), shared by a stage server
(``agent.node.server``) and a head that holds stages itself (``agent.head.local_packer``).

A stage server holds the STEP frames of several sessions that are ready at once. This module chooses the next
packed inference from plain values (what is ready, the clock, who was served lately) and says nothing of
asyncio or OpenVINO: the server applies its decision through ``agent.runtime.packed.run_packed``.

The rules, after openvino.genai's continuous-batching scheduler (decode first, then prompt chunks in a budget):

- **Decode rows first.** A decode or speculative step goes whole (its drafted positions are verified together),
  in turn order, as long as the pack stays within ``budget`` rows (the first always goes).
- **Then prompt chunks.** A prompt step is cut at fixed offsets from its first position (every ``budget``
  positions; a last piece of one position joins the chunk before it, since a stage computes a one-position
  prompt step with other kernels: ``agent.runtime.repeatable.ALIKE_MIN_PROMPT``). A chunk goes in if it fits the
  budget, and the first prompt chunk goes in whatever the decode rows took: a prompt always progresses, and it
  holds the others' decode rows back by at most one budget's worth of rows. Where the stage computes a prompt the
  same however it is cut (``fixed_cuts`` false: ``Stage.alike`` is ``prompts`` or ``all``), a prompt alone goes
  whole (no cost when alone); elsewhere it is always cut at the same offsets, so that its numbers never depend
  on who else was queued.
- **Turns.** Heads take turns (the one served the longest ago first), and within a head its sessions do; one
  step of each head per round, so a head with many sessions cannot starve a head with one.
- **Gathering.** A stage that was busy packs whatever queued meanwhile at once. A stage that sat idle when the
  first step arrived may wait ``window`` seconds after that arrival for others (0 by default: on a LAN ring the
  sessions' steps arrive spread over the ring's cycle, and a wait only delays the first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from agent.errors import ShoalError
from agent.runtime.repeatable import ALIKE_MIN_PROMPT

DEFAULT_BUDGET = 256
"""Rows per packed inference (openvino.genai's ``max_num_batched_tokens`` default for continuous batching)."""

FORGET_AFTER = 1024
"""Packs after which a head or session that was not served again is forgotten by :class:`Turns`."""


@dataclass(frozen=True)
class PackPolicy:
    """How a stage packs: ``budget`` rows per inference, and the ``window`` in seconds an idle stage waits."""

    budget: int = DEFAULT_BUDGET
    window: float = 0.0
    fixed_cuts: bool = True
    """Cut every prompt at the same offsets, alone or not (its numbers depend on the cuts)."""

    def __post_init__(self) -> None:
        if self.budget < ALIKE_MIN_PROMPT:
            raise ShoalError(f"a packing budget is at least {ALIKE_MIN_PROMPT} rows, not {self.budget}")
        if self.window < 0:
            raise ShoalError(f"a gathering window is a duration, not {self.window} s")


@dataclass(frozen=True)
class ReadyStep:
    """The first step a session has queued (its later steps wait behind it)."""

    session: int
    head: int
    count: int
    """The step's positions."""
    prompt: bool
    """A prompt step (its last position read out): it may be cut into chunks. Otherwise decode or speculative."""
    arrived: float
    """When its frame was queued (the clock's seconds)."""
    done: int = 0
    """Positions of it already computed by earlier packs (a prompt cut into chunks)."""

    @property
    def rows(self) -> int:
        """Its positions still to compute."""
        return self.count - self.done


@dataclass(frozen=True)
class Slice:
    """The rows of one session's step that a pack computes: ``rows`` positions from its ``start``-th."""

    session: int
    start: int
    rows: int
    last: bool
    """Whether this finishes the step (its output can go on)."""

    def to_end(self, count: int) -> Slice:
        """This slice run on to the end of its step of ``count`` positions (a prompt's whole rest)."""
        return Slice(self.session, self.start, count - self.start, last=True)


@dataclass(frozen=True)
class Pack:
    """One packed inference: its sessions' slices, decode steps first."""

    slices: tuple[Slice, ...]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.slices)


@dataclass(frozen=True)
class Wait:
    """Nothing yet: ask again at ``until`` (or when another step arrives)."""

    until: float


@dataclass(frozen=True)
class Turns:
    """Who was served when: the number of the last pack each head and session had rows in."""

    packs: int = 0
    heads: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    sessions: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def after(self, pack: Pack, ready: Iterable[ReadyStep]) -> Turns:
        """The turns once ``pack`` (made of ``ready``) has run; entries unserved for ``FORGET_AFTER`` packs go."""
        heads_of = {r.session: r.head for r in ready}
        number = self.packs + 1
        heads = {h: n for h, n in self.heads.items() if number - n < FORGET_AFTER}
        sessions = {s: n for s, n in self.sessions.items() if number - n < FORGET_AFTER}
        for piece in pack.slices:
            sessions[piece.session] = number
            heads[heads_of[piece.session]] = number
        return Turns(number, MappingProxyType(heads), MappingProxyType(sessions))


def next_chunk(step: ReadyStep, budget: int) -> int:
    """The rows of ``step`` its next slice computes: all of a decode step; a prompt's next chunk, cut every
    ``budget`` positions from the step's start, a last piece of one position joined to the chunk before it."""
    if not step.prompt:
        return step.rows
    rows = min(budget, step.rows)
    return step.rows if step.rows - rows < ALIKE_MIN_PROMPT else rows


def in_turn(ready: Sequence[ReadyStep], turns: Turns) -> list[ReadyStep]:
    """``ready`` in turn order: one step of each head per round, the heads served the longest ago first (then
    the one waiting the longest), and within a head its sessions likewise."""
    by_head: dict[int, list[ReadyStep]] = {}
    for step in ready:
        by_head.setdefault(step.head, []).append(step)
    for steps in by_head.values():
        steps.sort(key=lambda s: (turns.sessions.get(s.session, -1), s.arrived, s.session))
    heads = sorted(by_head, key=lambda h: (turns.heads.get(h, -1), by_head[h][0].arrived, h))
    order: list[ReadyStep] = []
    for round_ in range(max((len(s) for s in by_head.values()), default=0)):
        order += [by_head[h][round_] for h in heads if round_ < len(by_head[h])]
    return order


def plan(
    ready: Sequence[ReadyStep], now: float, idle_since: float | None, policy: PackPolicy, turns: Turns
) -> Pack | Wait | None:
    """The next packed inference of ``ready`` (one step per session), or a :class:`Wait` to gather more, or None
    when nothing is ready. ``idle_since``: when the stage finished its last pack, if it has been idle since
    (None: it is busy, or was when these steps arrived)."""
    if not ready:
        return None
    if len({r.session for r in ready}) != len(ready):
        raise ShoalError("a session's steps go one after another: at most one ready step per session")
    first = min(r.arrived for r in ready)
    rows = sum(next_chunk(r, policy.budget) for r in ready)
    if idle_since is not None and first >= idle_since and rows < policy.budget and now < first + policy.window:
        return Wait(first + policy.window)
    order = in_turn(ready, turns)
    whole = len(ready) == 1 and not policy.fixed_cuts
    slices: list[Slice] = []
    taken = 0
    for step in (s for s in order if not s.prompt):
        if not slices or taken + step.rows <= policy.budget:
            slices.append(Slice(step.session, step.done, step.rows, last=True))
            taken += step.rows
    prompted = False
    for step in (s for s in order if s.prompt):
        chunk = step.rows if whole else next_chunk(step, policy.budget)
        if not prompted or taken + chunk <= policy.budget:
            slices.append(Slice(step.session, step.done, chunk, last=step.done + chunk == step.count))
            taken += chunk
            prompted = True
    return Pack(tuple(slices))
