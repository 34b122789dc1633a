"""All stages of an export chained in one process: the head's reference pipeline (``LocalPipeline`` in
``agent.runtime.stage`` compiles them)."""

from __future__ import annotations

import numpy as np

from agent.runtime.protocol import KVSession


class PipelineSession:
    """One conversation across every stage: token ids in, last-stage logits out."""

    def __init__(self, sessions: list[KVSession]) -> None:
        self.stages = sessions

    @property
    def logical_length(self) -> int:
        return self.stages[0].logical_length

    def step(self, token_ids: np.ndarray, last_only: bool = False) -> np.ndarray:
        """Feed ``[1, n]`` token ids; returns ``[1, n, vocab]`` logits, or ``[1, 1, vocab]`` for the last
        position only (valid until the next step)."""
        positions = np.arange(self.logical_length, self.logical_length + token_ids.shape[1], dtype=np.int64)[None]
        x = token_ids
        for stage in self.stages:
            x = stage.step(x, positions, last_only=last_only)
        return x

    def rewind(self, n: int) -> None:
        for stage in self.stages:
            stage.rewind(n)

    def reset(self) -> None:
        for stage in self.stages:
            stage.reset()
