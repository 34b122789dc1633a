"""A CPU stage computing in bf16 hands its hidden states on in bf16, so that its residual stream is computed in bf16
(agent.runtime.hidden_precision, issue 47): on SmolLM2's int4 3-stage export, its middle stage."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from agent.runtime.config import RuntimeConfig
from agent.runtime.hidden_precision import narrows_hidden_states
from agent.runtime.paged_prefill import PagedStep
from agent.runtime.session import PAGED_MIN_POSITIONS, StageSession
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest

pytestmark = pytest.mark.openvino


@pytest.fixture
def middle(exported: Callable[..., Path], cache_dir: Path) -> Iterator[Callable[[], CompiledStage]]:
    """``middle()``: the middle stage in bf16, compiled once a test (it holds the export's weight file open: the leak
    check wants it closed when the test ends, so pytest, which keeps a fixture's value, gets a maker)."""
    if not narrows_hidden_states(ov.Core(), "CPU", False, "bf16"):
        pytest.skip("this CPU does not compute in bf16: its stages' hidden states stay f32")
    export = exported(3, "int4")
    manifest = Manifest.load(export)
    config = RuntimeConfig(threads=1, precision="bf16", cache_dir=cache_dir / "ov")
    made: list[CompiledStage] = []

    def make() -> CompiledStage:
        if not made:
            made.append(CompiledStage(export, manifest.stages[1], manifest.weights, config))
        return made[0]

    yield make
    made.clear()
    gc.collect()  # the stage and its sessions hold one another (the fast tier pauses the collector)


def _reorders(compiled: ov.CompiledModel) -> int:
    ops = compiled.get_runtime_model().get_ordered_ops()
    return sum(op.get_rt_info()["layerType"].astype(str) == "Reorder" for op in ops)


def test_a_bf16_stage_keeps_no_f32_residual_stream_and_hands_on_bf16_values_as_f32(
    middle: Callable[[], CompiledStage],
) -> None:
    stage = middle()
    layers = stage.graph.layer_stop - stage.graph.layer_start
    # an f32 output kept the residual adds of every layer in f32: a reorder to and from bf16 around each (2 a layer)
    assert _reorders(stage.compiled) < layers
    assert stage.wire_dtype == "f32"
    session = stage.new_session()
    assert isinstance(session, StageSession)
    hidden = np.random.default_rng(3).standard_normal((1, 12, 576)).astype(np.float32)
    for x in (hidden, hidden[:, -1:]):  # a prompt, then a decode step
        out = session.step(x)
        assert out.dtype == np.float32 and out.shape == x.shape
        assert not np.any(out.view(np.uint32) & 0xFFFF)  # bf16 values, exactly, in f32
        assert np.all(np.isfinite(out)) and 0.1 < float(np.abs(out).mean()) < 1e4


def test_a_long_prompt_on_the_paged_compilation_reads_back_the_same_values(middle: Callable[[], CompiledStage]) -> None:
    """Prompts of PAGED_MIN_POSITIONS or more run on the paged compilation, narrowed alike: its output read wrongly
    (bf16 bits as float16) would be nothing like the decode compilation's."""
    hidden = np.random.default_rng(5).standard_normal((1, PAGED_MIN_POSITIONS + 8, 576)).astype(np.float32)
    stage = middle()
    paged, sdpa = stage.new_session(), stage.new_session()
    assert isinstance(paged, StageSession) and isinstance(sdpa, StageSession)
    long = np.array(paged.step(hidden))
    assert isinstance(paged._paged, PagedStep)  # it ran there
    short = np.concatenate([np.array(sdpa.step(hidden[:, i : i + 64])) for i in range(0, hidden.shape[1], 64)], 1)
    assert not np.any(long.view(np.uint32) & 0xFFFF)
    scale = float(np.abs(short).max())
    assert float(np.abs(long - short).max()) < 0.05 * scale  # two kernels' bf16 rounding apart, no more
