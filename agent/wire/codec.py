"""Encoding frames to bytes and decoding a byte stream into frames, with caps checked first."""

from __future__ import annotations

import math

from agent.errors import LocalProtocolError, RemoteProtocolError
from agent.wire.frames import HEADER, HEADER_SIZE, MAGIC, MAX_NDIM, PROTOCOL_VERSION, DType, Frame, FrameType, StepFlags

DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
"""Largest payload accepted: a few thousand positions of a 8192-wide hidden state in f32."""

_FRAME_TYPES = {int(t) for t in FrameType}
_DTYPES = {int(d) for d in DType}


def encode_frame(frame: Frame) -> list[bytes | memoryview]:
    """The frame as buffers to write in order (the payload is not copied)."""
    if len(frame.shape) > MAX_NDIM:
        raise LocalProtocolError(f"a payload has at most {MAX_NDIM} dimensions, not {len(frame.shape)}")
    size = len(frame.payload) if isinstance(frame.payload, bytes) else frame.payload.nbytes
    if frame.dtype not in (DType.NONE, DType.BYTES) and math.prod(frame.shape) * frame.dtype.itemsize != size:
        raise LocalProtocolError(f"{frame.type.name}: payload of {size} bytes does not match shape {frame.shape}")
    shape = (*frame.shape, *(0,) * (MAX_NDIM - len(frame.shape)))
    try:
        header = HEADER.pack(
            MAGIC,
            PROTOCOL_VERSION,
            frame.type,
            frame.session,
            frame.step,
            frame.position,
            frame.count,
            frame.rewind,
            frame.flags,
            frame.dtype,
            len(frame.shape),
            *shape,
            size,
        )
    except Exception as exc:  # struct.error: a field out of its range
        raise LocalProtocolError(f"{frame.type.name}: a header field is out of range: {exc}") from exc
    return [header, frame.payload] if size else [header]


class FrameDecoder:
    """Turns received bytes into frames (sans-IO).

    ``receive_data(bytes)`` then ``next_frame()`` until it returns None. A header that breaks
    the protocol (magic, version, type, dtype, shape, or a payload over ``max_payload``) raises
    :class:`RemoteProtocolError` as soon as its 48 bytes have arrived, before the payload is
    buffered: the caller then drops the connection. The decoder is unusable after an error.
    """

    def __init__(self, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()
        self._header: tuple[Frame, int] | None = None
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        if self._failed:
            raise RemoteProtocolError("the stream already broke the protocol")
        self._buffer += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more bytes are needed."""
        if self._header is None:
            if len(self._buffer) < HEADER_SIZE:
                return None
            try:
                self._header = self._parse_header(bytes(self._buffer[:HEADER_SIZE]))
            except RemoteProtocolError:
                self._failed = True
                self._buffer.clear()
                raise
            del self._buffer[:HEADER_SIZE]
        partial, size = self._header
        if len(self._buffer) < size:
            return None
        payload = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._header = None
        return Frame(
            partial.type,
            partial.session,
            partial.step,
            partial.position,
            partial.count,
            partial.rewind,
            partial.flags,
            partial.dtype,
            partial.shape,
            payload,
        )

    def _parse_header(self, raw: bytes) -> tuple[Frame, int]:
        (magic, version, type_, session, step, position, count, rewind, flags, dtype, ndim, *dims, size) = (
            HEADER.unpack(raw)
        )
        if magic != MAGIC:
            raise RemoteProtocolError(f"not a shoal frame (magic {magic!r})")
        if version != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                f"protocol version {version} is not supported (this agent speaks {PROTOCOL_VERSION})"
            )
        if type_ not in _FRAME_TYPES:
            raise RemoteProtocolError(f"unknown frame type {type_}")
        if dtype not in _DTYPES:
            raise RemoteProtocolError(f"unknown payload dtype {dtype}")
        if ndim > MAX_NDIM or any(dims[ndim:]):
            raise RemoteProtocolError(f"bad payload shape (ndim {ndim}, dims {dims})")
        if size > self.max_payload:
            raise RemoteProtocolError(f"payload of {size} bytes exceeds the {self.max_payload}-byte cap")
        shape = tuple(dims[:ndim])
        kind = DType(dtype)
        if kind is DType.NONE and (size or ndim):
            raise RemoteProtocolError("a frame without dtype carries a payload")
        if kind not in (DType.NONE,) and math.prod(shape) * max(kind.itemsize, 1) != size:
            raise RemoteProtocolError(f"payload of {size} bytes does not match shape {shape} of {kind.name}")
        return Frame(FrameType(type_), session, step, position, count, rewind, StepFlags(flags), kind, shape), size
