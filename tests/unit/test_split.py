from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.errors import ExportError
from shards.architecture import ArchSpec
from shards.export.split import layer_split_from_counts, plan_layer_split


def spec(layers: int, vocab: int = 49152) -> ArchSpec:
    return ArchSpec("llama", "llama", layers, 576, 1536, 9, 3, 64, vocab, 1e-5, False, False, False, True, 8192)


@given(layers=st.integers(1, 80), stages=st.integers(1, 8), weights=st.sampled_from(["int4", "int8", "fp16", "fp32"]))
def test_split_is_contiguous_complete_and_non_empty(layers: int, stages: int, weights: str) -> None:
    if stages > layers:
        with pytest.raises(ExportError):
            plan_layer_split(spec(layers), stages, weights)
        return
    ranges = plan_layer_split(spec(layers), stages, weights)
    assert len(ranges) == stages
    assert ranges[0].start == 0 and ranges[-1].stop == layers
    assert all(len(r) >= 1 for r in ranges)
    assert all(a.stop == b.start for a, b in itertools.pairwise(ranges))


def test_heavy_head_gets_fewer_layers() -> None:
    ranges = plan_layer_split(spec(30), 2, "int4")
    assert len(ranges[1]) < len(ranges[0])  # the LM head weighs as much as several layers


def test_without_head_weight_later_stages_are_even() -> None:
    ranges = plan_layer_split(spec(30, vocab=1), 3, "fp32")
    assert abs(len(ranges[1]) - len(ranges[2])) <= 1


def test_first_stage_leaves_room_for_the_heads_loop() -> None:
    ranges = plan_layer_split(spec(30, vocab=1), 3, "int4")
    assert len(ranges[0]) < min(len(ranges[1]), len(ranges[2]))


def test_small_layers_pay_their_fixed_cost() -> None:
    # SmolLM2-sized layers: weight bytes alone would price the LM head at ~15 layers; measured ~8
    ranges = plan_layer_split(spec(30), 2, "int4")
    assert 10 <= len(ranges[1]) <= 14


def test_zero_stages_refused() -> None:
    with pytest.raises(ExportError, match="at least 1"):
        plan_layer_split(spec(4), 0, "int4")


def test_pinned_cut_is_taken_as_given() -> None:
    assert layer_split_from_counts(spec(28), (18, 10)) == [range(0, 18), range(18, 28)]
    assert layer_split_from_counts(spec(30), (11, 14, 5)) == [range(0, 11), range(11, 25), range(25, 30)]


@pytest.mark.parametrize(("counts", "message"), [((18, 11), "adds up to 29"), ((28, 0), "positive"), ((), "positive")])
def test_pinned_cut_must_cover_every_layer_once(counts: tuple[int, ...], message: str) -> None:
    with pytest.raises(ExportError, match=message):
        layer_split_from_counts(spec(28), counts)
