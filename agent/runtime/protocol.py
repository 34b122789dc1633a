"""What the ring's code needs of a compiled stage and of one session's KV state, without OpenVINO.

The stage server, the ring client and the chat service step stages through these two protocols only.
``agent.runtime.stage.CompiledStage`` and ``agent.runtime.session.StageSession`` are the real ones
(OpenVINO); the middle test tier puts deterministic numpy stages in their place, so the session rules
(open, step, park, evict, replay) are tested without compiling anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from shards.manifest import GraphEntry


class KVSession(Protocol):
    """One conversation's KV state on one stage (see ``StageSession`` for the real one)."""

    @property
    def logical_length(self) -> int:
        """Tokens the model currently attends to (kept positions)."""
        ...

    kv_cut_seconds: float
    """Time spent cutting rejected positions out of the KV state, all told."""

    def step(self, inputs: np.ndarray, positions: np.ndarray | None = None, last_only: bool = False) -> np.ndarray:
        """Run new positions through the stage: token ids ``[1, n]`` or hidden states ``[1, n, hidden]`` in,
        hidden states or logits out (a view valid until the next call)."""
        ...

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` kept positions."""
        ...

    def reset(self) -> None:
        """Drop the whole KV state."""
        ...


class Stage(Protocol):
    """One stage graph ready to serve on this PC (see ``CompiledStage`` for the real one)."""

    graph: GraphEntry
    device: str
    compact_rewind: bool
    """Rewinds cut positions out of the state (a copy) rather than masking them."""
    exact_speculation: bool | None
    """Whether speculative greedy decoding here equals plain greedy decoding (None: not measured)."""
    wire_dtype: str
    """What this stage's hidden states cross the wire in when not told: ``f32`` or ``f16``."""
    decode_precision: str
    """The precision it decodes in (a ``RuntimeConfig.precision`` value; chosen by timing where ``auto`` had a
    choice, ``agent.runtime.tuning``)."""

    @property
    def alike(self) -> str:
        """What it computes the same however positions are grouped into steps: ``all``, ``prompts`` or ``none``
        (``agent.runtime.repeatable``)."""
        ...

    def new_session(self) -> KVSession:
        """A fresh KV state for one conversation."""
        ...


def new_sessions(stages: Sequence[Stage]) -> list[KVSession]:
    """One fresh session (its own KV state) on each of ``stages``; blocking: infer requests are made here."""
    return [stage.new_session() for stage in stages]


def wire_numpy_dtype(choice: str, stage: Stage) -> type[np.floating]:
    """The numpy dtype of hidden states that ``stage`` sends on: ``auto`` (its ``wire_dtype``), ``f32``, ``f16``."""
    name = stage.wire_dtype if choice == "auto" else choice
    if name not in ("f32", "f16"):
        raise ValueError(f"wire dtype must be auto, f32 or f16, not {choice!r}")
    return np.float16 if name == "f16" else np.float32
