"""Compacting rewinds (``RuntimeConfig.rewind``, the default on the CPU for int4 in the default precision,
where activations are quantized on the fly): rejected drafts must leave no trace, and speculative greedy
decoding must equal plain decoding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.head.decode import DecodeStats
from agent.head.drafters import NGramDrafter
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from shards.manifest import Manifest
from tests.conftest import REFERENCE_PROMPTS
from tests.integration.local_decode import greedy_tokens


def _default_pipeline(folder: Path, cache_dir: Path) -> LocalPipeline:
    """Every setting at its default but the device and threads: the stages must choose to compact."""
    pipeline = LocalPipeline(
        folder, Manifest.load(folder), RuntimeConfig(device="CPU", threads=1, cache_dir=cache_dir / "ov")
    )
    assert all(stage.compact_rewind for stage in pipeline.stages)
    return pipeline


def test_rejected_drafts_leave_no_trace(exported: Callable[..., Path], cache_dir: Path) -> None:
    pipeline = _default_pipeline(exported(3, "int4"), cache_dir)
    rng = np.random.default_rng(0)
    for _ in range(3):
        prompt, kept, rejected = (rng.integers(100, 40000, size=(1, n)) for n in (60, 1, 4))
        follow = rng.integers(100, 40000, size=(1, 1))
        session = pipeline.new_session()
        session.step(prompt)
        session.step(np.concatenate([kept, rejected], axis=1))
        session.rewind(rejected.shape[1])
        rewound = session.step(follow)[0, -1].copy()
        assert all(s.physical_length == s.logical_length == 62 for s in session.stages)
        assert all(s.kv_cut_seconds > 0 for s in session.stages)  # the cut was done, and timed
        clean = pipeline.new_session()
        clean.step(prompt)
        clean.step(kept)
        never_saw = clean.step(follow)[0, -1].copy()
        # Masked instead of dropped, the rejected positions moved these logits by up to 0.57 (measured on
        # an AMD EPYC, OpenVINO 2026.4): the plugin's on-the-fly quantization sees where positions sit in
        # the cache. Dropped, they leave no trace beyond the rounding of a 2- vs a 1-position step.
        assert float(np.abs(rewound - never_saw).max()) < 1e-3


def test_speculative_greedy_equals_plain_in_the_default_precision(
    exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]
) -> None:
    """Three stages: a first (embeddings), a middle and a last one (the head) each cut the rejected drafts out."""
    pipeline = _default_pipeline(exported(3, "int4"), cache_dir)
    stats = DecodeStats()
    for prompt in chat_ids[:REFERENCE_PROMPTS]:
        plain = greedy_tokens(pipeline, prompt)
        spec = greedy_tokens(pipeline, prompt, NGramDrafter(), stats)
        assert spec == plain
    print(f"\n{stats.accepted} of {stats.drafted} drafts kept")
    assert stats.drafted > 0 and stats.accepted < stats.drafted, "no draft was rejected: nothing was rewound"
