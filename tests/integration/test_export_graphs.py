"""The structure of exported stage graphs and of the manifest."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import openvino as ov
import pytest

from shards.manifest import Manifest

pytestmark = pytest.mark.processes


def _kv_reads_through_beam_gather(model: ov.Model) -> tuple[int, int]:
    """(number of ReadValue ops, number whose every consumer is Gather(ReadValue, beam_idx, axis 0))."""
    reads = [op for op in model.get_ops() if op.get_type_name() == "ReadValue"]
    good = 0
    for read in reads:
        consumers = [t.get_node() for t in read.output(0).get_target_inputs()]
        ok = bool(consumers)
        for node in consumers:
            if node.get_type_name() != "Gather":
                ok = False
                continue
            index = node.input_value(1).get_node()
            axis = node.input_value(2).get_node()
            ok &= index.get_type_name() == "Parameter" and index.get_friendly_name() == "beam_idx"
            ok &= axis.get_type_name() == "Constant" and int(axis.get_data().reshape(-1)[0]) == 0
        good += ok
    return len(reads), good


@pytest.mark.parametrize(("stages", "weights"), [(3, "int4"), (2, "fp32")])
def test_every_kv_read_goes_through_beam_idx_gather(stages: int, weights: str, exported: Callable[..., Path]) -> None:
    folder = exported(stages, weights)
    manifest = Manifest.load(folder)
    core = ov.Core()
    for stage in manifest.stages:
        model = core.read_model(str(folder / stage.xml))
        reads, good = _kv_reads_through_beam_gather(model)
        assert reads == 2 * stage.num_layers  # one key and one value state per layer
        assert good == reads
        names = [p.get_any_name() for p in model.inputs]
        assert names == list(stage.inputs)
        assert [p.get_any_name() for p in model.outputs] == list(stage.outputs)
        assert not any(n.startswith("past_key_values") for n in names)  # the cache is internal state


@pytest.mark.parametrize(("stages", "weights"), [(3, "int4"), (2, "fp32")])
def test_attention_takes_an_additive_float_mask(stages: int, weights: str, exported: Callable[..., Path]) -> None:
    """Every layer's attention is one ScaledDotProductAttention fed a float mask, also once compiled: with a
    boolean mask the CPU kernel took 3-22x as long on 2,048 tokens (docs/prefill-profile.md)."""
    folder = exported(stages, weights)
    core = ov.Core()
    for stage in Manifest.load(folder).stages:
        model = core.read_model(str(folder / stage.xml))
        attention = [op for op in model.get_ops() if op.get_type_name() == "ScaledDotProductAttention"]
        assert len(attention) == stage.num_layers
        assert all(op.input_value(3).get_element_type().is_real() for op in attention)
        # f32: float weights in bf16 on one thread crash the CPU plugin's compilation (agent/runtime/stage.py)
        compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": "1", "INFERENCE_PRECISION_HINT": "f32"})
        kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
        assert kinds.count("ScaledDotProductAttention") == stage.num_layers


def test_manifest_describes_the_split(exported: Callable[..., Path]) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    manifest.verify(folder, progress=False)
    assert manifest.stages[0].layer_start == 0
    assert manifest.stages[-1].layer_stop == manifest.arch.num_layers == 30
    assert [s.embeddings for s in manifest.stages] == [True, False, False]
    assert [s.head for s in manifest.stages] == [False, False, True]
    assert manifest.stages[0].inputs[0] == "input_ids" and manifest.stages[1].inputs[0] == "hidden_states"
    assert manifest.stages[-1].outputs == ("logits",)
    assert manifest.source.revision.startswith("sha256:")
    assert {Path(f.path).name for f in manifest.tokenizer_files} >= {"tokenizer.json", "tokenizer_config.json"}
    assert all(s.memory_bytes > s.weights_bytes > 0 for s in manifest.stages)


def test_second_export_is_reused(exported: Callable[..., Path], cache_dir: Path) -> None:
    """``shoal export`` again with the same inputs leaves the export as it is (the command line's ``main`` in this
    process: a new Python would spend seconds importing torch before the check under test)."""
    from agent.cli.main import main

    folder = exported(2, "fp32")
    before = (folder / "manifest.json").stat().st_mtime_ns
    argv = ["--cache-dir", str(cache_dir), "export", "smollm2", "--stages", "2", "--weights", "fp32"]
    assert main([*argv, "--out", str(folder)]) == 0
    assert (folder / "manifest.json").stat().st_mtime_ns == before


def test_self_draft_is_one_stateful_graph(exported: Callable[..., Path]) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    assert manifest.draft is not None and manifest.draft.kind == "self"
    graph = manifest.draft.graph
    assert (graph.layer_start, graph.layer_stop, graph.embeddings, graph.head) == (0, 4, True, True)
    model = ov.Core().read_model(str(folder / graph.xml))
    reads, good = _kv_reads_through_beam_gather(model)
    assert reads == good == 8
    manifest.verify(folder, progress=False)


def test_generate_prints_only_the_completion(exported: Callable[..., Path], cache_dir: Path) -> None:
    folder = exported(3, "fp32")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--cache-dir",
            str(cache_dir),
            "generate",
            str(folder),
            "What is the capital of France?",
            "--max-tokens",
            "24",
        ],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "assistant" not in result.stdout and "<|im" not in result.stdout
    assert "tok/s" in result.stderr and "tok/s" not in result.stdout
