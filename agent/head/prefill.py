"""Pipelined prefill: a long prompt cut into chunks that travel the ring back to back.

A ring's stages run one session's steps in order, each stage on its own PC. Sent as one step, a prompt
keeps every stage but one idle: the first token comes after the sum of the stages' times. Cut into
chunks sent without waiting, stage 1 computes chunk 1 while stage 0 computes chunk 2, and the first token
comes after about one stage's share plus the pipeline's fill. Every chunk but the last carries
``StepFlags.PART``: the last stage reads nothing out for it and answers with an empty RESULT, which tells
the head how far the prompt has gone (its progress).

The KV state a chunked prompt leaves on each stage is the state one step would leave: a position attends
to the positions before it, whichever step they came in. But below f32 the numbers of a position depend on
how the positions were grouped into steps (measured on one thread in the int4 default precision: a
40-position prompt's last logits move by up to 0.45 when it goes as 39 + 1), so the cut is fixed by
absolute positions: chunks end at multiples of the chunk size, whatever the step starts at, and never on
timing. A prompt is thus computed the same way whether it starts at 0 or resumes a kept session at a
chunk boundary (``agent.head.resumable``), and a replay of a lost ring sends the same steps again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

DEFAULT_PREFILL_CHUNK = 512
"""Positions per chunk when the agent is not told otherwise (``--prefill-chunk``). Each chunk costs one
step's fixed overhead (reading the stage's weights once, a hop); at 512 positions that is a few percent of
its compute on a CPU, and a 2,000-token prompt still fills a ring of three (docs/benchmarks.md). A kept
session is reused only up to a multiple of it (``agent.head.resumable``)."""


PrefillWatcher = Callable[[int, int], None]
"""Told (positions done, positions in all) each time a chunk of a prompt has gone through the whole ring."""


def prefill_chunks(start: int, positions: int, chunk: int) -> list[int]:
    """The sizes of the steps a prompt of ``positions`` starting at absolute position ``start`` is sent in:
    one step when ``chunk`` is 0; otherwise cut at every multiple of ``chunk`` (so the first step ends at the
    first boundary after ``start``, the last one where the prompt ends)."""
    if positions < 1:
        raise ValueError("a prompt has at least one position")
    if chunk < 0:
        raise ValueError(f"a chunk size is a number of positions, not {chunk}")
    if start < 0:
        raise ValueError(f"a prompt starts at a position, not at {start}")
    if chunk == 0:
        return [positions]
    end = start + positions
    cuts = [start, *range(chunk_floor(start, chunk) + chunk, end, chunk), end]
    return [b - a for a, b in itertools.pairwise(cuts)]


def chunk_floor(position: int, chunk: int) -> int:
    """The last chunk boundary at or before ``position`` (0 when prompts go as one step, ``chunk`` 0): the
    positions before it are computed in whole chunks, as any longer prompt computes them."""
    return position - position % chunk if chunk else 0
