"""All stages of an export chained in one process: the head's reference pipeline (``LocalPipeline`` in
``agent.runtime.stage`` compiles them)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent.runtime.protocol import KVSession


def run_stages(
    sessions: Sequence[KVSession], inputs: np.ndarray, position: int, *, rewind: int = 0, last_only: bool = False
) -> np.ndarray:
    """One step through consecutive stages: each of ``sessions`` forgets its last ``rewind`` positions, then
    ``inputs`` (``[1, n]`` token ids, or hidden states) goes through them in order at positions ``position`` ..
    ``position + n - 1``; returns what the last one gives (hidden states, or logits: ``last_only``, the last
    position only). The head's own stages, a stage server's and the in-process pipeline all step this way."""
    positions = np.arange(position, position + inputs.shape[1], dtype=np.int64)[None]
    for session in sessions:
        session.rewind(rewind)
    x = inputs
    for session in sessions:
        x = session.step(x, positions, last_only=last_only)
    return x


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
        return run_stages(self.stages, token_ids, self.logical_length, last_only=last_only)

    def rewind(self, n: int) -> None:
        for stage in self.stages:
            stage.rewind(n)

    def reset(self) -> None:
        for stage in self.stages:
            stage.reset()
