"""A RESULT that carries log-probabilities (``agent.wire.result``, ``agent.sampling.logprobs``): the readout and
the block round-trip through the codec for greedy and sampled sessions, a sampled token's log-probability comes
back through the offset, and a malformed block from a peer is refused as a protocol error."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from agent.errors import RemoteProtocolError
from agent.sampling.params import SamplingParams
from agent.sampling.readout import read_out
from agent.wire import Frame, FrameDecoder, FrameType, StepFlags, encode_frame
from agent.wire.messages import SessionOpen, parse
from agent.wire.result import parse_result, result_frame

VOCAB = 50


def _logits(rows: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2.0, (1, rows, VOCAB)).astype(np.float32)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.reshape(-1, VOCAB).astype(np.float64)
    return z - (z.max(-1, keepdims=True) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)))


def _through_the_wire(frame: Frame) -> Frame:
    decoder = FrameDecoder()
    decoder.receive_data(b"".join(bytes(part) for part in encode_frame(frame)))
    received = decoder.next_frame()
    assert received is not None
    return received


@pytest.mark.parametrize("params", [SamplingParams(logprobs=4), SamplingParams(0.7, top_k=20, top_p=0.9, logprobs=2)])
def test_a_readout_with_logprobs_round_trips_and_scores_every_token_its_session_may_choose(
    params: SamplingParams,
) -> None:
    logits = _logits(4)
    output = read_out(logits, params, last_only=False)
    frame = _through_the_wire(result_frame(output, session=7, step=2, flags=StepFlags.UNREPEATABLE))
    assert frame.flags & StepFlags.LOGPROBS and frame.flags & StepFlags.UNREPEATABLE
    back = parse_result(frame, VOCAB, 4)
    expected = _log_softmax(logits)
    if params.greedy:
        assert back.top1 is not None and output.top1 is not None and back.top1.tolist() == output.top1.tolist()
    else:
        assert back.dists is not None and [d.ids.tolist() for d in back.dists] == [
            d.ids.tolist() for d in output.dists or []
        ]
    for row in range(4):
        choices = [int(np.argmax(expected[row]))] if params.greedy else (back.dists or [])[row].ids.tolist()
        for token in choices:  # greedy: the most likely token; sampled: every token of the distribution
            score = back.score(row, token, params)
            assert score is not None and score.logprob == pytest.approx(expected[row][token], abs=1e-5)
            assert len(score.top) == params.logprobs
            best = np.argsort(-expected[row], kind="stable")[: params.logprobs]
            assert [i for i, _ in score.top] == best.tolist()


def test_a_session_asks_the_last_stage_for_logprobs_in_its_open() -> None:
    params = SamplingParams(0.5, logprobs=3, seed=9)
    opened = parse(_through_the_wire(SessionOpen.of(1, params).to_frame(5)), SessionOpen)
    assert opened.sampling == params.on_stages()
    assert SessionOpen.of(1, SamplingParams()).sampling.logprobs is None


def _malformed(body: bytes, count: int = 2) -> Frame:
    return Frame.message(FrameType.RESULT, body, session=1, count=count, flags=StepFlags.LOGPROBS)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x00\x00", "shorter than its header"),
        (struct.pack("<III", 0, 3, 1), "3 positions x 1 for a step of 2"),
        (struct.pack("<III", 0, 2, 21), "at most 20 alternatives"),
        (struct.pack("<III", 0, 2, 1) + b"\x00" * 8, "truncated"),
        (struct.pack("<III", 0, 2, 1) + struct.pack("<ii", 0, 99) + struct.pack("<ffff", -1, -1, 0, 0), "outside"),
        (struct.pack("<III", 0, 2, 1) + struct.pack("<ii", 0, 1) + struct.pack("<ffff", 3, -1, 0, 0), "not finite"),
        (
            struct.pack("<III", 0, 2, 1)
            + struct.pack("<ii", 0, 1)
            + struct.pack("<ffff", -1, -1, 0, 0)
            + struct.pack("<i", 4),
            "of 1 positions says it holds 2",
        ),
        (
            struct.pack("<III", 5, 2, 1) + struct.pack("<ii", 0, 1) + struct.pack("<ffff", -1, -1, 0, 0),
            "unknown kind 5",
        ),
    ],
)
def test_a_malformed_logprob_result_is_a_protocol_error(body: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        parse_result(_malformed(body), VOCAB, 2)
