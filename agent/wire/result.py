"""The RESULT frame: the last stage's readout of one step (``StepOutput``) as it travels to the head.

Greedy sessions get int32 top-1 ids (4 bytes a position); sampling sessions get sparse distributions in
``agent.sampling.distribution``'s layout. A session that asked for log-probabilities gets a RESULT flagged
``StepFlags.LOGPROBS`` whose bytes are (little-endian)::

    u32 kind                       0: top-1 ids follow the block, 1: distributions do
    log-probability block          ``agent.sampling.logprobs``' layout, one position per readout position
    the readout                    int32 ids to the end, or a distribution block
"""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np

from agent.errors import RemoteProtocolError
from agent.sampling.distribution import decode_many, encode_many
from agent.sampling.logprobs import decode_logprobs, encode_logprobs
from agent.sampling.readout import StepOutput
from agent.wire.frames import DType, Frame, FrameFields, FrameType, StepFlags

_KIND = struct.Struct("<I")
_TOP1, _DISTS = 0, 1


def result_frame(output: StepOutput, session: int, step: int, flags: StepFlags = StepFlags.NONE) -> Frame:
    """The RESULT frame carrying ``output`` for step ``step`` of ``session`` (``flags``: what the head is
    told of the step, ``StepFlags.UNREPEATABLE`` and ``StepFlags.UNSETTLED``)."""
    fields: FrameFields = {"session": session, "step": step, "count": output.positions, "flags": flags}
    if output.logprobs is not None:
        if output.top1 is not None:
            kind, readout = _TOP1, output.top1.astype("<i4").tobytes()
        else:
            kind, readout = _DISTS, encode_many(output.dists or [])
        fields["flags"] = flags | StepFlags.LOGPROBS
        return Frame.message(FrameType.RESULT, _KIND.pack(kind) + encode_logprobs(output.logprobs) + readout, **fields)
    if output.top1 is not None:
        top1 = output.top1.astype(np.int32)
        return Frame.tensor(FrameType.RESULT, top1, **fields)
    return Frame.message(FrameType.RESULT, encode_many(output.dists or []), **fields)


def parse_result(frame: Frame, vocab_size: int, max_positions: int) -> StepOutput:
    """A RESULT frame's readout, validated: ids within the vocabulary, at most ``max_positions`` positions;
    settled unless a stage marked the step ``StepFlags.UNSETTLED``."""
    output = _parse_readout(frame, vocab_size, max_positions)
    return replace(output, settled=not frame.flags & StepFlags.UNSETTLED)


def _parse_readout(frame: Frame, vocab_size: int, max_positions: int) -> StepOutput:
    if frame.flags & StepFlags.LOGPROBS:
        return _parse_with_logprobs(frame, vocab_size, max_positions)
    if frame.dtype is DType.INT32:
        return StepOutput(top1=_top1(frame.array(), vocab_size, max_positions))
    if frame.dtype is DType.BYTES:
        return StepOutput(dists=decode_many(frame.body(), vocab_size, max_positions))
    raise RemoteProtocolError(f"result payload of dtype {frame.dtype.name}")


def _top1(ids: np.ndarray, vocab_size: int, max_positions: int) -> np.ndarray:
    if ids.ndim != 1 or len(ids) > max_positions or len(ids) == 0:
        raise RemoteProtocolError(f"result of shape {ids.shape} for a step of {max_positions} positions")
    top1 = ids.tolist()  # a handful of ids: Python compares them faster than two numpy reductions
    if min(top1) < 0 or max(top1) >= vocab_size:
        raise RemoteProtocolError("result holds token ids outside the vocabulary")
    return ids.copy()


def _parse_with_logprobs(frame: Frame, vocab_size: int, max_positions: int) -> StepOutput:
    if frame.dtype is not DType.BYTES or not 1 <= frame.count <= max_positions:
        raise RemoteProtocolError(
            f"a result with log-probabilities of {frame.count} positions, dtype {frame.dtype.name}"
        )
    data = memoryview(frame.body())
    if data.nbytes < _KIND.size:
        raise RemoteProtocolError("a result with log-probabilities shorter than its header")
    (kind,) = _KIND.unpack_from(data, 0)
    logprobs, size = decode_logprobs(data[_KIND.size :], vocab_size, frame.count)
    rest = data[_KIND.size + size :]
    if kind == _TOP1:
        if rest.nbytes % 4:
            raise RemoteProtocolError("a result's top-1 ids are not whole int32s")
        output = StepOutput(top1=_top1(np.frombuffer(rest, dtype="<i4"), vocab_size, max_positions))
    elif kind == _DISTS:
        output = StepOutput(dists=decode_many(bytes(rest), vocab_size, max_positions))
    else:
        raise RemoteProtocolError(f"a result's readout of unknown kind {kind}")
    if output.positions != frame.count:
        raise RemoteProtocolError(f"a result of {output.positions} positions says it holds {frame.count}")
    return StepOutput(output.top1, output.dists, logprobs)
