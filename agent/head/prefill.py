"""Pipelined prefill: a long prompt cut into chunks that travel the ring back to back.

A ring's stages run one session's steps in order, each stage on its own PC. Sent as one step, a prompt
keeps every stage but one idle: the first token comes after the sum of the stages' times. Cut into
chunks sent without waiting, stage 1 computes chunk 1 while stage 0 computes chunk 2, and the first token
comes after about one stage's share plus the pipeline's fill. Every chunk but the last carries
``StepFlags.PART``: the last stage reads nothing out for it and answers with an empty RESULT, which tells
the head how far the prompt has gone (its progress).

The KV state a chunked prompt leaves on each stage is the state one step would leave: a position attends
to the positions before it, whichever step they came in. The cut depends only on the prompt's length and
the chunk size, never on timing, so a replay of a lost ring cuts the steps it sends again the same way,
and every position is rounded as it was (it matters below f32).
"""

from __future__ import annotations

import math
from collections.abc import Callable

DEFAULT_PREFILL_CHUNK = 512
"""Positions per chunk when the agent is not told otherwise (``--prefill-chunk``). Each chunk costs one
step's fixed overhead (reading the stage's weights once, a hop); at 512 positions that is a few percent of
its compute on a CPU, and a 2,000-token prompt still fills a ring of three (docs/benchmarks.md)."""


PrefillWatcher = Callable[[int, int], None]
"""Told (positions done, positions in all) each time a chunk of a prompt has gone through the whole ring."""


def prefill_chunks(positions: int, chunk: int) -> list[int]:
    """The sizes of the steps a prompt of ``positions`` is sent in: one step when ``chunk`` is 0 or the
    prompt fits in one chunk; otherwise as few chunks of at most ``chunk`` positions as will hold it, of
    sizes as even as possible (no straggler of a few positions that costs a whole step's overhead)."""
    if positions < 1:
        raise ValueError("a prompt has at least one position")
    if chunk < 0:
        raise ValueError(f"a chunk size is a number of positions, not {chunk}")
    if chunk == 0 or positions <= chunk:
        return [positions]
    count = math.ceil(positions / chunk)
    small, extra = divmod(positions, count)
    return [small + 1] * extra + [small] * (count - extra)
