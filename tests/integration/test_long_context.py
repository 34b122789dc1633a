"""A context beyond 4,096 tokens (issue 40 §4): SmolLM2 exports with its own 8,192 positions, and positions past
4,096 compute as transformers computes them (the rotary phases come from ``position_ids`` inside the graph)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from shards.manifest import Manifest

PROMPT_TOKENS = 5117
"""The issue's prompt, refused before: longer than 4,096, within 8,192."""
AROUND = (4090, 4100)
"""Positions checked one by one, either side of 4,096 (those before in one step, those after in another)."""


def test_positions_beyond_4096_match_transformers(
    exported: Callable[..., Path],
    cache_dir: Path,
    hf_model: Any,
    record_property: Callable[[str, object], None],
) -> None:
    import torch

    folder = exported(1, "fp32")
    manifest = Manifest.load(folder)
    assert manifest.context_tokens == 8192  # the model's own max_position_embeddings, no longer cut to 4,096
    ids = np.random.default_rng(40).integers(100, manifest.arch.vocab_size, PROMPT_TOKENS, dtype=np.int64)[None]
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision="f32")
    session = LocalPipeline(folder, manifest, config).new_session()
    # three steps, as a prompt goes in chunks: its long parts on the paged graph, the few around 4,096 on SDPA
    first, middle, last = np.split(ids, AROUND, axis=1)
    ours = [session.step(first, last_only=True)[0, -1].copy()]
    ours += list(session.step(middle)[0].copy())
    ours.append(session.step(last, last_only=True)[0, -1].copy())
    positions = [AROUND[0] - 1, *range(*AROUND), PROMPT_TOKENS - 1]
    with torch.no_grad():
        hidden = hf_model.model(torch.from_numpy(ids)).last_hidden_state[0, positions]
        theirs = hf_model.lm_head(hidden).numpy()
    worst = float(np.abs(np.stack(ours) - theirs).max())
    record_property("max_abs_logit_diff", worst)
    print(f"\npositions {positions[0]}-{positions[-1]} of a {PROMPT_TOKENS}-token prompt: max |logit diff| {worst:.2e}")
    assert [int(row.argmax()) for row in ours] == [int(row.argmax()) for row in theirs]
    assert worst < 2e-2
