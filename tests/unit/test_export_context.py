"""The export's context (issue 40 §4): the model's own by default, cut by what a stage's memory holds, or chosen."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from agent.cli.export_cmd import context_line
from agent.errors import ExportError, ManifestError
from shards.architecture import ArchSpec
from shards.export.request import KV_BUDGET_BYTES, ExportRequest, default_context, export_context, reusable
from shards.manifest import Manifest
from tests.support.toy_model import toy_manifest


def _spec(layers: int, kv_heads: int, head_dim: int, positions: int) -> ArchSpec:
    return replace(
        toy_manifest().arch,
        num_layers=layers,
        num_heads=kv_heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=positions,
    )


SMOLLM2 = _spec(30, 3, 64, 8192)
QWEN_CODER_1_5B = _spec(28, 2, 128, 32768)
LLAMA_8B = _spec(32, 8, 128, 131072)


def test_a_model_whose_whole_context_fits_keeps_it() -> None:
    # the two models, capped at 4,096 before
    assert default_context(SMOLLM2, [range(30)]) == 8192
    assert default_context(SMOLLM2, [range(15), range(15, 30)]) == 8192
    assert default_context(QWEN_CODER_1_5B, [range(28)]) == 32768


def test_a_long_context_is_cut_so_one_session_fits_a_stage() -> None:
    assert default_context(LLAMA_8B, [range(32)]) == 8192  # 128 KiB a position on one stage
    assert default_context(LLAMA_8B, [range(16), range(16, 32)]) == 16384
    # the stage holding the most layers decides; the result is a multiple of 1,024 within the budget
    cut = default_context(LLAMA_8B, [range(20), range(20, 32)])
    assert cut % 1024 == 0 and cut * LLAMA_8B.kv_bytes_per_token(20) <= KV_BUDGET_BYTES
    assert (cut + 1024) * LLAMA_8B.kv_bytes_per_token(20) > KV_BUDGET_BYTES


def test_an_attention_window_shorter_than_the_context_bounds_the_default() -> None:
    assert default_context(QWEN_CODER_1_5B, [range(28)], window=4096) == 4096


def test_context_asked_for_is_kept_up_to_the_models_positions() -> None:
    folder = Path("unused")
    assert export_context(ExportRequest("m", folder, 1, context_tokens=2048), SMOLLM2, [range(30)]) == 2048
    assert export_context(ExportRequest("m", folder, 1, context_tokens=8192), SMOLLM2, [range(30)]) == 8192
    with pytest.raises(ExportError, match=r"--context 16384 exceeds the 8192 positions .* choose 8192 or less"):
        export_context(ExportRequest("m", folder, 1, context_tokens=16384), SMOLLM2, [range(30)])
    with pytest.raises(ExportError, match="--context must be a positive number"):
        ExportRequest("m", folder, 1, context_tokens=0)


def test_an_export_that_differs_only_by_its_context_gets_the_new_one_in_its_manifest(tmp_path: Path) -> None:
    old = toy_manifest(stages=2, context_tokens=256)
    old.save(tmp_path)
    request = ExportRequest("toy/decoder", tmp_path, 2, weights="fp32")
    ranges = [stage.layers for stage in old.stages]
    existing, replace_it = reusable(request, old.source.revision, ranges, 128)
    assert existing is not None and not replace_it  # reused: the graphs take any context
    assert existing.context_tokens == 128 and Manifest.load(tmp_path) == existing
    assert [s.memory_bytes for s in existing.stages] == [
        s.weights_bytes + s.kv_bytes_per_token * 128 for s in old.stages
    ]
    assert existing.export_id == old.export_id  # the same graphs: a ring may mix agents of either manifest
    assert json.loads((tmp_path / "manifest.json").read_text())["context_tokens"] == 128


def test_a_manifest_without_room_for_a_prompt_is_refused() -> None:
    data = toy_manifest().to_json()
    data["context_tokens"] = 0
    with pytest.raises(ManifestError, match="context of 0 tokens"):
        Manifest.from_json(data)


def test_the_export_says_its_context_and_why() -> None:
    manifest = replace(toy_manifest(stages=1, layers=30), arch=SMOLLM2)
    stage = replace(manifest.stages[0], kv_bytes_per_token=SMOLLM2.kv_bytes_per_token(30))
    manifest = replace(manifest, stages=(stage,), context_tokens=8192)
    assert context_line(manifest, chosen=False) == (
        "context: 8,192 tokens (the model's own); one session's KV cache: 180 MiB on the largest stage"
    )
    assert "(as --context asked)" in context_line(replace(manifest, context_tokens=2048), chosen=True)
    llama = replace(toy_manifest(stages=1, layers=32), arch=LLAMA_8B, context_tokens=8192)
    llama = replace(llama, stages=(replace(llama.stages[0], kv_bytes_per_token=LLAMA_8B.kv_bytes_per_token(32)),))
    assert context_line(llama, chosen=False) == (
        "context: 8,192 tokens (of the model's 131,072: one session's KV cache kept within 1 GiB a stage; "
        "--context N chooses); one session's KV cache: 1,024 MiB on the largest stage"
    )
