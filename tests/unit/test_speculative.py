"""Acceptance rules (greedy and sampled) and the wire form of sparse distributions."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import RemoteProtocolError
from agent.head import speculative
from agent.head.speculative import Verdict, verify_greedy, verify_sampled
from agent.sampling.distribution import SparseDistribution, decode_many, encode_many
from tests.unit.spec_stats import chi_square_pvalue, emitted_token_histograms

N = 20_000
GOOD = 1e-3  # a correct rule must not look this unlikely
BAD = 1e-6  # a broken rule must look at least this unlikely
N_BROKEN = 2_000
"""Trials against a broken rule: its p-value is below 1e-100 from 1,000 trials on, in every case here."""


# --- greedy -----------------------------------------------------------------------------------------


def test_greedy_all_accepted_emits_the_bonus() -> None:
    assert verify_greedy([5, 6, 7], [5, 6, 7, 8]) == Verdict(3, [5, 6, 7, 8])


def test_greedy_first_rejected_emits_the_correction() -> None:
    assert verify_greedy([5, 6, 7], [4, 6, 7, 8]) == Verdict(0, [4])


def test_greedy_stops_at_the_first_mismatch() -> None:
    assert verify_greedy([5, 6, 7], [5, 9, 7, 8]) == Verdict(1, [5, 9])


def test_greedy_with_nothing_drafted_is_plain_decoding() -> None:
    assert verify_greedy([], [3]) == Verdict(0, [3])


def test_greedy_checks_lengths() -> None:
    with pytest.raises(ValueError, match="need 3 target tokens"):
        verify_greedy([1, 2], [1, 2])


# --- sampled: statistical -------------------------------------------------------------------------


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / x.sum()


def _dirichlet(vocab: int, seed: int, support: int | None = None) -> np.ndarray:
    """A random distribution; with ``support`` only that many (random) tokens get mass, like top-k."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(vocab))
    if support is not None:
        p[rng.permutation(vocab)[support:]] = 0.0
    return _normalised(p)


RISING = _normalised(np.arange(1, 11, dtype=np.float64))
FALLING = RISING[::-1].copy()

# (target p_1..p_3, draft q_1..q_2 or None, fixed drafts for the deterministic drafter)
CASES = {
    "q far from p": ([RISING, _dirichlet(10, 1), _dirichlet(10, 2)], [FALLING, _dirichlet(10, 3)], None),
    "q equal to p": ([RISING, _dirichlet(10, 1), _dirichlet(10, 2)], [RISING, _dirichlet(10, 1)], None),
    "sparse supports": (
        [_dirichlet(50, 4, support=20), _dirichlet(50, 5, support=12), _dirichlet(50, 6)],
        [_dirichlet(50, 7, support=30), _dirichlet(50, 8, support=5)],
        None,
    ),
    "deterministic drafter": ([RISING, _dirichlet(10, 1), _dirichlet(10, 2)], None, [3, 8]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sampled_tokens_follow_the_target(case: str) -> None:
    p, q, drafts = CASES[case]
    first, second = emitted_token_histograms(verify_sampled, p, q, N, seed=11, draft_tokens=drafts)
    assert chi_square_pvalue(first, p[0]) > GOOD
    assert second.sum() > 1000  # enough accepted first drafts for the conditional test to mean something
    assert chi_square_pvalue(second, p[1]) > GOOD


BROKEN = {
    "keep every draft": ("_keeps", lambda draft, drawn, target: True),
    "keep a draft the target gives any chance": ("_keeps", lambda draft, drawn, target: target.prob(draft) > 0),
}


@pytest.mark.parametrize("case", ["q far from p", "sparse supports", "deterministic drafter"])
@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_statistical_test_catches_a_broken_rule(case: str, broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, replacement = BROKEN[broken]
    monkeypatch.setattr(speculative, name, replacement)
    p, q, drafts = CASES[case]
    first, _ = emitted_token_histograms(verify_sampled, p, q, N_BROKEN, seed=11, draft_tokens=drafts)
    assert chi_square_pvalue(first, p[0]) < BAD


def test_the_same_seed_judges_alike_whatever_was_drafted() -> None:
    """The tokens a step emits are the target's keyed draws, whatever the draft: one seed, one text."""
    from agent.sampling.keyed import PositionNoise

    p = [SparseDistribution.from_probs(_dirichlet(10, seed)) for seed in range(4)]
    plain = [PositionNoise(9).sample(p[i], 40 + i) for i in range(4)]
    for draft in ([], plain[:1], plain[:3], [9, 9, 9], [plain[0], 9, 9]):
        verdict = verify_sampled(draft, p[: len(draft) + 1], PositionNoise(9), 40)
        assert verdict.tokens == plain[: len(verdict.tokens)]


def test_chi_square_pools_sparse_bins_and_rejects_impossible_tokens() -> None:
    p = _normalised(np.array([1000.0, 1000.0, 1.0, 1.0, 0.0]))
    assert chi_square_pvalue(np.array([1000, 1000, 1, 1, 0]), p) > 0.9
    assert chi_square_pvalue(np.array([1000, 1000, 1, 1, 1]), p) == 0.0


# --- sampled: unit ----------------------------------------------------------------------------------


def _dist(ids: list[int], probs: list[float]) -> SparseDistribution:
    return SparseDistribution(np.array(ids), np.array(probs))


def test_sampled_certain_target_accepts_and_adds_the_bonus() -> None:
    from agent.sampling.keyed import PositionNoise

    certain = [_dist([2], [1.0]), _dist([4], [1.0]), _dist([9], [1.0])]
    assert verify_sampled([2, 4], certain, PositionNoise(0), 0) == Verdict(2, [2, 4, 9])
    assert verify_sampled([2, 5], certain, PositionNoise(0), 0) == Verdict(1, [2, 4])


def test_sampled_checks_lengths() -> None:
    from agent.sampling.keyed import PositionNoise

    with pytest.raises(ValueError, match="need 2 target distributions"):
        verify_sampled([1], [_dist([1], [1.0])], PositionNoise(0), 0)


# --- SparseDistribution -----------------------------------------------------------------------------


def test_from_probs_keeps_the_support() -> None:
    d = SparseDistribution.from_probs(np.array([0.0, 0.25, 0.0, 0.75]))
    assert d.ids.tolist() == [1, 3] and d.ids.dtype == np.int32 and d.probs.dtype == np.float32
    assert d.prob(3) == 0.75 and d.prob(0) == 0.0 and d.prob(99) == 0.0
    assert d.to_dense(5).tolist() == [0.0, 0.25, 0.0, 0.75, 0.0]


def test_constructor_sorts_and_rejects_duplicates() -> None:
    d = _dist([7, 2], [0.4, 0.6])
    assert d.ids.tolist() == [2, 7] and d.prob(2) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="unique"):
        _dist([2, 2], [0.5, 0.5])


@st.composite
def _distributions(draw: st.DrawFn, vocab: int) -> SparseDistribution:
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=min(vocab, 40), unique=True))
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=len(ids), max_size=len(ids)))
    w = np.array(weights, dtype=np.float64)
    if w.sum() == 0:
        w[0] = 1.0
    return SparseDistribution(np.array(ids), w / w.sum())


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[int, list[SparseDistribution]]:
    vocab = draw(st.integers(1, 300))
    return vocab, draw(st.lists(_distributions(vocab), max_size=6))


@given(_blocks())
def test_wire_round_trip(block: tuple[int, list[SparseDistribution]]) -> None:
    vocab, dists = block
    back = decode_many(encode_many(dists), vocab_size=vocab, max_positions=6)
    assert len(back) == len(dists)
    for a, b in zip(dists, back, strict=True):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.probs, b.probs)


@given(_blocks(), st.data())
def test_truncated_or_padded_blocks_are_rejected(
    block: tuple[int, list[SparseDistribution]], data: st.DataObject
) -> None:
    vocab, dists = block
    wire = encode_many(dists)
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(RemoteProtocolError):
        decode_many(wire[:cut], vocab_size=vocab, max_positions=6)
    with pytest.raises(RemoteProtocolError):
        decode_many(wire + data.draw(st.binary(min_size=1, max_size=8)), vocab_size=vocab, max_positions=6)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_raise_remote_protocol_error(data: bytes) -> None:
    try:
        dists = decode_many(data, vocab_size=64, max_positions=4)
    except RemoteProtocolError:
        return
    assert len(dists) <= 4


@given(_blocks(), st.data())
def test_corrupted_blocks_decode_or_raise_remote_protocol_error(
    block: tuple[int, list[SparseDistribution]], data: st.DataObject
) -> None:
    vocab, dists = block
    wire = bytearray(encode_many(dists))
    at = data.draw(st.integers(0, len(wire) - 1))
    wire[at] = data.draw(st.integers(0, 255))
    with contextlib.suppress(RemoteProtocolError):
        decode_many(bytes(wire), vocab_size=vocab, max_positions=6)


def _block(count: int, n: int, ids: list[int], probs: list[float]) -> bytes:
    return (
        np.array([count], "<u4").tobytes()
        + np.array([n], "<u4").tobytes()
        + np.array(ids, "<i4").tobytes()
        + np.array(probs, "<f4").tobytes()
    )


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"\x01\x00", "shorter than its 4-byte header"),
        (np.array([5], "<u4").tobytes(), "at most 4 allowed"),
        (np.array([3], "<u4").tobytes() + b"\x00" * 8, "cannot hold 3 positions"),
        (_block(1, 0, [], []), "support size 0"),
        (_block(1, 11, [], []), "support size 11"),
        (_block(1, 2, [1, 2], [1.0]), "truncated in position 0"),
        (_block(1, 1, [10], [1.0]), "out of range"),
        (_block(1, 1, [-1], [1.0]), "out of range"),
        (_block(1, 2, [3, 3], [0.5, 0.5]), "strictly increasing"),
        (_block(1, 2, [3, 1], [0.5, 0.5]), "strictly increasing"),
        (_block(1, 2, [1, 3], [float("nan"), 1.0]), "not finite"),
        (_block(1, 2, [1, 3], [float("inf"), 1.0]), "not finite"),
        (_block(1, 2, [1, 3], [-0.5, 1.5]), "negative"),
        (_block(1, 2, [1, 3], [0.5, 0.49]), "sum to 0.99"),
        (_block(1, 1, [1], [1.0]) + b"\x00", "1 trailing bytes"),
    ],
)
def test_decode_explains_what_is_wrong(wire: bytes, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        decode_many(wire, vocab_size=10, max_positions=4)
