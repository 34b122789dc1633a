"""Several sessions' steps through one node's stages at once: the contract between a stage server's scheduler
(which steps go together) and the runtime (how they are computed).

A stage server gathers the steps of several sessions that are ready at the same moment and hands them here in
one call. Where the stages can pack (their sessions keep their KV in one shared block pool), the steps' new
positions go through each stage in one inference; elsewhere they run one after another, as before. Either way
each step's output is its own array, and each session's numbers are those it would get alone wherever
``packs_alike`` says so (issue 45).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.runtime.pipeline import run_stages
from agent.runtime.protocol import KVSession


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


def run_packed(steps: Sequence[PackedStep]) -> list[np.ndarray]:
    """Run ``steps`` (of distinct sessions) through their stages; returns each step's output in order (hidden
    states, or logits as ``run_stages`` gives them), each an array of its own. Blocking: call it off the loop."""
    return [
        np.array(run_stages(s.sessions, s.inputs, s.position, rewind=s.rewind, last_only=s.last_only)) for s in steps
    ]
