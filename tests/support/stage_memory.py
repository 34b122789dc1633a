"""``python -m tests.support.stage_memory EXPORT STAGE WARM ROUNDS``: one stage of an export compiled as a stage
agent compiles it, conversations of a few prompt lengths run on it round after round, and the process's resident
memory after each measured round printed as one JSON line (``{"rss_mb": [...]}``). With ``--new-lengths N``, each
measured round is instead one conversation of each of N prompt lengths never sent before (8, 9, ...), and
``--unbounded`` leaves the CPU plugin's kernel caches at OpenVINO's defaults (``agent.runtime.kernel_caches``).

Its own process, so that nothing else (an export made with torch, the test runner's guards) allocates or frees
memory between the samples. ``tests/integration/test_stage_memory.py`` reads it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import numpy as np
import psutil

from agent.runtime import kernel_caches
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest

LENGTHS = (37, 150, 333)
"""Prompt lengths: a short one (on the SDPA compilation) and long ones (on the paged one)."""


def conversation(stage: CompiledStage, hidden: int, length: int, rng: np.random.Generator) -> None:
    """A prompt, decode steps and speculative steps with rejected drafts, as a ring's middle stage sees them."""

    def states(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal((1, n, hidden))).astype(np.float32)

    session = stage.new_session()
    session.step(states(length), last_only=True)
    for drafts in (0, 3, 0, 2, 0):
        session.step(states(drafts + 1))
        if drafts:
            session.rewind(drafts - 1)


def rss_mb() -> float:
    gc.collect()
    return float(psutil.Process().memory_info().rss / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("export", type=Path)
    parser.add_argument("stage", type=int)
    parser.add_argument("warm", type=int, help="rounds before the first sample (each length seen)")
    parser.add_argument("rounds", type=int, help="measured rounds")
    parser.add_argument("--cache-dir", type=Path, default=None, help="OpenVINO's compiled-model cache")
    parser.add_argument("--new-lengths", type=int, default=0, help="per measured round: N prompt lengths not seen")
    parser.add_argument("--unbounded", action="store_true", help="the CPU plugin's kernel caches at their defaults")
    args = parser.parse_args()
    if args.unbounded:
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = "1024"
        kernel_caches.RUNTIME_CACHE_ENTRIES = 5000
    manifest = Manifest.load(args.export)
    config = RuntimeConfig(device="CPU", threads=1, cache_dir=args.cache_dir)  # as a stage agent compiles
    stage = CompiledStage(args.export, manifest.stages[args.stage], manifest.weights, config)
    hidden = manifest.arch.hidden_size
    rng = np.random.default_rng(46)
    for _ in range(args.warm):
        for length in LENGTHS:
            conversation(stage, hidden, length, rng)
    series = [rss_mb()]
    fresh = iter(range(8, 1 << 20))
    for _ in range(args.rounds):
        lengths = [next(fresh) for _ in range(args.new_lengths)] if args.new_lengths else LENGTHS
        for length in lengths:
            conversation(stage, hidden, length, rng)
        series.append(rss_mb())
    print(json.dumps({"rss_mb": [round(mb, 1) for mb in series]}))


if __name__ == "__main__":
    main()
