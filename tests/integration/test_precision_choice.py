"""On SmolLM2's 1-stage int4 export: the decode precision is timed on the first compilation, kept beside the
compiled-model cache, taken from there on a restart, and the one-thread stage stays exact in it (issue 47)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov

from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage, default_inference_precision
from agent.runtime.tuning import CHOICES_FILE
from shards.manifest import Manifest


def test_the_decode_precision_is_timed_once_and_kept(exported: Callable[..., Path], tmp_path: Path) -> None:
    export = exported(1, "int4")
    manifest = Manifest.load(export)
    entry = manifest.stages[0]
    config = RuntimeConfig(device="CPU", threads=1, cache_dir=tmp_path / "ov-cache", tune_precision=True)
    default = default_inference_precision(ov.Core(), "CPU")
    first = CompiledStage(export, entry, manifest.weights, config)
    choice = first.precision_choice
    candidates = {"auto"} if default == "f32" else {"auto", default}
    assert set(choice.ms_per_token) == (candidates if len(candidates) > 1 else set())
    if choice.ms_per_token:
        assert choice.measured_now and all(ms > 0 for ms in choice.ms_per_token.values())
        assert first.decode_precision == min(choice.ms_per_token, key=lambda name: choice.ms_per_token[name])
        assert (tmp_path / "ov-cache" / CHOICES_FILE).exists()
    # one thread below f32: rejected drafts are cut out, so speculation is exact in whichever precision won
    assert (first.compact_rewind, first.exact_speculation, first.alike) == (True, True, "prompts")

    restart = CompiledStage(export, entry, manifest.weights, config)
    assert not restart.precision_choice.measured_now
    assert restart.decode_precision == first.decode_precision
    assert dict(restart.precision_choice.ms_per_token) == dict(choice.ms_per_token)
    # the kept compilation is the chosen one: both decode the same tokens
    tokens = []
    for stage in (first, restart):
        session = stage.new_session()
        logits = session.step(np.arange(100, 120, dtype=np.int64)[None], last_only=True)
        ids = [int(logits[0, -1].argmax())]
        for _ in range(4):
            ids.append(int(session.step(np.array([[ids[-1]]], dtype=np.int64), last_only=True)[0, -1].argmax()))
        tokens.append(ids)
    assert tokens[0] == tokens[1]

    # a precision the user named is never second-guessed
    exact = CompiledStage(export, entry, manifest.weights, replace(config, precision="f32"))
    assert (exact.decode_precision, dict(exact.precision_choice.ms_per_token)) == ("f32", {})
    assert (exact.exact_speculation, exact.alike) == (True, "all")
