"""The RESULT frame: the last stage's readout of one step (``StepOutput``) as it travels to the head.

Greedy sessions get int32 top-1 ids (4 bytes a position); sampling sessions get sparse distributions in
``agent.sampling.distribution``'s layout.
"""

from __future__ import annotations

import numpy as np

from agent.errors import RemoteProtocolError
from agent.sampling.distribution import decode_many, encode_many
from agent.sampling.readout import StepOutput
from agent.wire.frames import DType, Frame, FrameType, StepFlags


def result_frame(output: StepOutput, session: int, step: int, flags: StepFlags = StepFlags.NONE) -> Frame:
    """The RESULT frame carrying ``output`` for step ``step`` of ``session`` (``flags``: what the head is
    told of the step, ``StepFlags.UNREPEATABLE``)."""
    if output.top1 is not None:
        top1 = output.top1.astype(np.int32)
        return Frame.tensor(FrameType.RESULT, top1, session=session, step=step, count=len(top1), flags=flags)
    dists = output.dists or []
    return Frame.message(
        FrameType.RESULT, encode_many(dists), session=session, step=step, count=len(dists), flags=flags
    )


def parse_result(frame: Frame, vocab_size: int, max_positions: int) -> StepOutput:
    """A RESULT frame's readout, validated: ids within the vocabulary, at most ``max_positions`` positions."""
    if frame.dtype is DType.INT32:
        ids = frame.array()
        if ids.ndim != 1 or len(ids) > max_positions or len(ids) == 0:
            raise RemoteProtocolError(f"result of shape {ids.shape} for a step of {max_positions} positions")
        top1 = ids.tolist()  # a handful of ids: Python compares them faster than two numpy reductions
        if min(top1) < 0 or max(top1) >= vocab_size:
            raise RemoteProtocolError("result holds token ids outside the vocabulary")
        return StepOutput(top1=ids.copy())
    if frame.dtype is DType.BYTES:
        return StepOutput(dists=decode_many(frame.body(), vocab_size, max_positions))
    raise RemoteProtocolError(f"result payload of dtype {frame.dtype.name}")
