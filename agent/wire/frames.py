"""Frame layout: one fixed 48-byte header, then a payload whose size the header declares.

Header (little-endian)::

    offset size field
     0      2   magic  b"SH"
     2      1   version (PROTOCOL_VERSION)
     3      1   type (FrameType)
     4      8   session id (0 = the connection itself)
    12      4   step number within the session
    16      4   position: logical position of the first carried position
    20      2   count: positions carried
    22      2   rewind: positions of earlier steps to forget before this one
    24      2   flags (StepFlags)
    26      1   dtype of the payload (DType)
    27      1   ndim (0..4)
    28     16   shape, 4 x u32 (unused dimensions 0)
    44      4   payload length in bytes

Every size is known from the header, so a receiver checks it against its caps before it
allocates anything for the payload.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import numpy as np

from agent.errors import LocalProtocolError

MAGIC = b"SH"
PROTOCOL_VERSION = 8  # 2: PARK; 3: PING and PONG; 4: MEMBERS; 5: StepFlags.PART; 6: StepFlags.UNREPEATABLE;
# 7: StepFlags.LOGPROBS and SessionOpen.logprobs; 8: StepFlags.UNSETTLED (an older peer's frames are refused,
# naming both versions)
HEADER = struct.Struct("<2sBBQIIHHHBB4II")
HEADER_SIZE = HEADER.size
MAX_NDIM = 4


class FrameType(enum.IntEnum):
    """What a frame is for. Session frames name their session; the others use session 0."""

    HELLO = 1  # first frame on every connection, both ways: who I am (JSON)
    OPEN = 2  # a session starts here (JSON SessionOpen); travels down the ring
    STEP = 3  # positions of one session: token ids or hidden states (tensor)
    RESULT = 4  # the last stage's answer for one step, straight to the head (tensor or bytes)
    CLOSE = 5  # a session ends: free its state; travels down the ring
    ERROR = 6  # a stage failed a session (JSON ErrorReport); travels back up the ring
    STATUS_REQUEST = 7  # ask an agent for its status
    STATUS = 8  # the agent's status (JSON)
    GOODBYE = 9  # the connection closes on purpose; an end of stream without it is a failure
    PARK = 10  # a session waits for its conversation's next turn: a stage short of room may evict it; travels
    # down the ring; its next STEP makes it active again
    PING = 11  # the dialling end of a ring link checks its peer lives (``step``: a sequence number)
    PONG = 12  # the answer, at once, from the other end's event loop (the same ``step``)
    MEMBERS = 13  # fleet membership on a control link (JSON, ``discovery.control``): announcements, gossip


class StepFlags(enum.IntFlag):
    """Per-step options a head sets and every stage passes on."""

    NONE = 0
    LAST_ONLY = 1  # the head needs the result of the last position only (a prompt)
    PART = 2  # one chunk of a prompt that the session's next step continues (pipelined prefill): the last
    # stage reads nothing out and answers with an empty RESULT, which tells the head how far the prompt is
    UNREPEATABLE = 4  # set by a stage that computed this step unlike another grouping of its positions would
    # (``agent.runtime.repeatable``), kept by every stage after it, and returned on the RESULT: the answer
    # it belongs to may differ from the same question asked again
    LOGPROBS = 8  # on a RESULT: its payload begins with the readout's kind and a log-probability block
    # (``agent.wire.result``), for a session opened with ``SessionOpen.logprobs``
    UNSETTLED = 16  # set by a stage that computed this step's positions otherwise than a fresh prompt of the same
    # tokens might (``agent.runtime.repeatable``), kept and returned as UNREPEATABLE is: a kept session's later
    # turn reuses them only where a fresh prompt's steps are cut (``agent.head.resumable``)


class DType(enum.IntEnum):
    """Payload element types. NONE: no payload; BYTES: opaque (JSON or a packed structure)."""

    NONE = 0
    BYTES = 1
    INT32 = 2
    INT64 = 3
    FLOAT16 = 4
    FLOAT32 = 5

    @property
    def numpy(self) -> np.dtype:
        return np.dtype(_NUMPY[self])

    @property
    def itemsize(self) -> int:
        return 0 if self is DType.NONE else self.numpy.itemsize

    @classmethod
    def of(cls, array: np.ndarray) -> DType:
        for dtype, name in _NUMPY.items():
            if array.dtype == np.dtype(name):
                return dtype
        raise LocalProtocolError(f"arrays of {array.dtype} cannot travel on the wire")


_NUMPY = {
    DType.BYTES: "u1",
    DType.INT32: "<i4",
    DType.INT64: "<i8",
    DType.FLOAT16: "<f2",
    DType.FLOAT32: "<f4",
}


class FrameFields(TypedDict, total=False):
    """The header fields :meth:`Frame.tensor` and :meth:`Frame.message` take besides the payload."""

    session: int
    step: int
    position: int
    count: int
    rewind: int
    flags: StepFlags


@dataclass(frozen=True)
class Frame:
    """One message on the wire. ``payload`` is raw bytes; :meth:`array` views it as a tensor."""

    type: FrameType
    session: int = 0
    step: int = 0
    position: int = 0
    count: int = 0
    rewind: int = 0
    flags: StepFlags = StepFlags.NONE
    dtype: DType = DType.NONE
    shape: tuple[int, ...] = ()
    payload: bytes | memoryview = field(default=b"", repr=False)

    @classmethod
    def tensor(cls, type: FrameType, array: np.ndarray, **fields: Unpack[FrameFields]) -> Frame:
        """A frame carrying ``array`` (C-contiguous, little-endian) as its payload."""
        array = np.ascontiguousarray(array)
        dtype = DType.of(array)
        return cls(
            type,
            dtype=dtype,
            shape=tuple(int(d) for d in array.shape),
            # numpy's stubs do not declare ndarray.__buffer__, though every ndarray supports the buffer protocol
            payload=memoryview(array).cast("B"),  # type: ignore[arg-type]
            **fields,
        )

    @classmethod
    def message(cls, type: FrameType, body: bytes, **fields: Unpack[FrameFields]) -> Frame:
        """A frame carrying opaque bytes (a JSON message or a packed structure)."""
        return cls(type, dtype=DType.BYTES, shape=(len(body),), payload=body, **fields)

    def array(self) -> np.ndarray:
        """The payload as a numpy array of ``shape`` (a read-only view, no copy)."""
        if self.dtype is DType.NONE:
            raise LocalProtocolError(f"{self.type.name} frame carries no payload")
        return np.frombuffer(self.payload, dtype=self.dtype.numpy).reshape(self.shape)

    def body(self) -> bytes:
        """The payload as bytes."""
        return bytes(self.payload)
