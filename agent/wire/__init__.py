"""The ring's wire protocol, sans-IO: bytes in, frames out; frames in, bytes out.

No sockets here (the transport in :mod:`agent.transport` wraps it), so the codec is tested by
feeding it bytes.
"""

from agent.wire.codec import FrameDecoder, encode_frame
from agent.wire.frames import HEADER_SIZE, PROTOCOL_VERSION, DType, Frame, FrameType, StepFlags

__all__ = [
    "HEADER_SIZE",
    "PROTOCOL_VERSION",
    "DType",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "StepFlags",
    "encode_frame",
]
