"""Acceptance 1 and 2: stage pipelines reproduce the reference tokens exactly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from shards.manifest import Manifest
from tests.conftest import REFERENCE_PROMPTS, greedy


def _pipeline(folder: Path, cache_dir: Path, precision: str = "auto") -> LocalPipeline:
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision=precision)
    return LocalPipeline(folder, Manifest.load(folder), config)


@pytest.mark.parametrize("stages", [2, 3])
def test_fp32_stages_match_transformers(
    stages: int,
    exported: Callable[..., Path],
    cache_dir: Path,
    chat_ids: list[list[int]],
    hf_reference: list[tuple[list[int], np.ndarray]],
    record_property: Callable[[str, object], None],
) -> None:
    pipeline = _pipeline(exported(stages, "fp32"), cache_dir)
    worst = 0.0
    for ids, (ref_tokens, ref_logits) in zip(chat_ids[:REFERENCE_PROMPTS], hf_reference, strict=True):
        tokens, logits = greedy(pipeline.new_session(), ids)
        assert tokens == ref_tokens
        worst = max(worst, float(np.abs(logits - ref_logits).max()))
    record_property("max_abs_logit_diff", worst)
    print(f"\n{stages}-stage fp32 vs transformers: max |logit diff| = {worst:.2e}")
    assert worst < 1e-2


def test_int4_stages_match_one_stage(exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]) -> None:
    """A first, a middle and a last stage (3 stages) against the whole model in one."""
    # f32 execution: in bf16 the CPU plugin rounds differently at a cut (see RuntimeConfig.precision)
    single = _pipeline(exported(1, "int4"), cache_dir, precision="f32")
    split = _pipeline(exported(3, "int4"), cache_dir, precision="f32")
    for ids in chat_ids[:1]:  # int4 weights in f32 are slow on the CPU: one answer of REFERENCE_TOKENS
        expected, _ = greedy(single.new_session(), ids)
        actual, _ = greedy(split.new_session(), ids)
        assert actual == expected


def test_sessions_do_not_share_state(exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]) -> None:
    """Interleaving two sessions on the same compiled stages gives what each gives alone."""
    pipeline = _pipeline(exported(2, "fp32"), cache_dir)
    alone = [greedy(pipeline.new_session(), ids, n=16)[0] for ids in chat_ids[:2]]
    a, b = pipeline.new_session(), pipeline.new_session()
    la = a.step(np.asarray([chat_ids[0]]))[0, -1].copy()
    lb = b.step(np.asarray([chat_ids[1]]))[0, -1].copy()
    ta, tb = [], []
    for _ in range(16):
        ta.append(int(la.argmax()))
        tb.append(int(lb.argmax()))
        la = a.step(np.asarray([[ta[-1]]]))[0, -1].copy()
        lb = b.step(np.asarray([[tb[-1]]]))[0, -1].copy()
    assert [ta, tb] == alone
