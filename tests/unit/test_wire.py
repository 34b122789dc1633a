"""The sans-IO frame codec: round trips, caps checked from the header, garbage never escapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import LocalProtocolError, RemoteProtocolError
from agent.wire import HEADER_SIZE, DType, Frame, FrameDecoder, FrameType, StepFlags, encode_frame
from agent.wire.frames import HEADER, MAGIC, PROTOCOL_VERSION
from agent.wire.messages import ErrorReport, Hello, SessionOpen, parse


def _bytes(frame: Frame) -> bytes:
    return b"".join(bytes(part) for part in encode_frame(frame))


def test_header_is_48_bytes() -> None:
    assert HEADER_SIZE == 48
    assert len(_bytes(Frame(FrameType.GOODBYE))) == 48


def test_tensor_round_trip_in_pieces() -> None:
    hidden = np.random.default_rng(0).standard_normal((1, 3, 8)).astype(np.float32)
    frame = Frame.tensor(
        FrameType.STEP, hidden, session=7, step=2, position=40, count=3, rewind=1, flags=StepFlags.LAST_ONLY
    )
    data = _bytes(frame) + _bytes(Frame(FrameType.PARK, session=7)) + _bytes(Frame(FrameType.CLOSE, session=7))
    decoder = FrameDecoder()
    frames = []
    for i in range(0, len(data), 5):  # arrives in 5-byte pieces
        decoder.receive_data(data[i : i + 5])
        while (got := decoder.next_frame()) is not None:
            frames.append(got)
    assert [f.type for f in frames] == [FrameType.STEP, FrameType.PARK, FrameType.CLOSE]
    assert frames[1].session == 7
    step = frames[0]
    assert (step.session, step.step, step.position, step.count, step.rewind) == (7, 2, 40, 3, 1)
    assert step.flags & StepFlags.LAST_ONLY
    np.testing.assert_array_equal(step.array(), hidden)
    assert decoder.buffered == 0


def test_cap_is_checked_from_the_header_alone() -> None:
    decoder = FrameDecoder(max_payload=1024)
    big = HEADER.pack(
        MAGIC, PROTOCOL_VERSION, FrameType.STEP, 1, 0, 0, 1, 0, 0, DType.FLOAT32, 1, 1 << 20, 0, 0, 0, 4 << 20
    )
    decoder.receive_data(big)  # no payload follows: the header must be enough to refuse
    with pytest.raises(RemoteProtocolError, match="exceeds the 1024-byte cap"):
        decoder.next_frame()
    assert decoder.buffered == 0
    with pytest.raises(RemoteProtocolError):
        decoder.receive_data(b"more")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"version": 9}, "version 9"),
        ({"version": 1}, "version 1"),  # before PARK: an agent that could not follow a parked session
        ({"type_": 99}, "unknown frame type"),
        ({"dtype": 42}, "unknown payload dtype"),
        ({"ndim": 5}, "bad payload shape"),
        ({"dtype": int(DType.FLOAT32), "ndim": 1, "dims": (3, 0, 0, 0), "size": 8}, "does not match shape"),
        ({"size": 4}, "without dtype"),
    ],
)
def test_bad_headers_are_refused(fields: dict[str, object], message: str) -> None:
    values = {
        "version": PROTOCOL_VERSION,
        "type_": int(FrameType.STEP),
        "dtype": 0,
        "ndim": 0,
        "dims": (0, 0, 0, 0),
        "size": 0,
    } | fields
    raw = HEADER.pack(
        MAGIC,
        values["version"],
        values["type_"],
        1,
        0,
        0,
        0,
        0,
        0,
        values["dtype"],
        values["ndim"],
        *values["dims"],
        values["size"],
    )  # type: ignore[misc]
    decoder = FrameDecoder()
    decoder.receive_data(raw)
    with pytest.raises(RemoteProtocolError, match=message):
        decoder.next_frame()


def test_encoder_refuses_inconsistent_frames() -> None:
    with pytest.raises(LocalProtocolError, match="does not match"):
        encode_frame(Frame(FrameType.STEP, dtype=DType.FLOAT32, shape=(4,), payload=b"abc"))
    with pytest.raises(LocalProtocolError, match="out of range"):
        encode_frame(Frame(FrameType.STEP, count=1 << 20))
    with pytest.raises(LocalProtocolError, match="cannot travel"):
        Frame.tensor(FrameType.STEP, np.zeros(2, dtype=np.complex64))


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_garbage_raises_only_remote_protocol_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_payload=256)
    try:
        decoder.receive_data(data)
        while decoder.next_frame() is not None:
            pass
    except RemoteProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**16 - 1),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50),
)
def test_any_valid_frame_round_trips(session: int, step: int, rewind: int, ids: list[int]) -> None:
    frame = Frame.tensor(
        FrameType.RESULT, np.asarray(ids, dtype=np.int32), session=session, step=step, rewind=rewind, count=len(ids)
    )
    decoder = FrameDecoder()
    decoder.receive_data(_bytes(frame))
    got = decoder.next_frame()
    assert got is not None
    assert (got.session, got.step, got.rewind, got.count) == (session, step, rewind, len(ids))
    assert got.array().tolist() == ids


def test_messages_round_trip_and_are_validated() -> None:
    hello = Hello(node="a", role="stage", export_id="x", layer_start=3, layer_stop=9, is_last=True)
    assert parse(hello.to_frame(), Hello) == hello
    opened = SessionOpen(head_id=5, temperature=0.7, top_k=40, top_p=0.9)
    assert parse(opened.to_frame(1), SessionOpen) == opened
    with pytest.raises(RemoteProtocolError, match="unknown fields"):
        Hello.from_json(b'{"node": "a", "role": "stage", "evil": 1}')
    with pytest.raises(RemoteProtocolError, match="must be int"):
        SessionOpen.from_json(b'{"head_id": "5"}')
    with pytest.raises(RemoteProtocolError, match="role"):
        Hello.from_json(b'{"node": "a", "role": "king"}')
    with pytest.raises(RemoteProtocolError, match="temperature"):
        SessionOpen.from_json(b'{"head_id": 1, "temperature": -1}')
    with pytest.raises(RemoteProtocolError, match="not JSON"):
        ErrorReport.from_json(b"\xff")


def test_an_evicted_session_fails_at_its_head_as_evicted() -> None:
    from agent.errors import SessionEvictedError
    from agent.head.ring_client import _error

    frame = ErrorReport("evicted", "s1 gave the place of this session to a new session", "s1").to_frame(5)
    assert isinstance(_error(parse(_decoded(frame), ErrorReport)), SessionEvictedError)
    with pytest.raises(RemoteProtocolError):
        parse(Frame.message(FrameType.ERROR, b'{"code": "gone", "message": "x"}'), ErrorReport)


def _decoded(frame: Frame) -> Frame:
    decoder = FrameDecoder()
    decoder.receive_data(_bytes(frame))
    got = decoder.next_frame()
    assert got is not None
    return got
