"""``python -m tests.support.heap_idle EXPORT STAGE``: one stage compiled as a stage agent compiles it, a burst of
conversations of 40 prompt lengths, then idle under the agent's ``HeapTrim`` (1 s idle time, real clock and
``malloc_trim``): the process's resident memory after the burst and after the trim, as one JSON line.

Its own process, so that nothing else allocates or frees between the samples. ``tests/integration/test_heap_idle.py``
reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from agent.node.heap_trim import HeapTrim
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest
from tests.support.stage_memory import conversation, rss_mb

IDLE_AFTER_S = 1.0


async def burst_then_idle(stage: CompiledStage, hidden: int, lengths: list[int]) -> dict[str, object]:
    done = {"conversations": 0}
    part = HeapTrim("stage", lambda: done["conversations"], idle_after=IDLE_AFTER_S, check_every=0.1)
    rng = np.random.default_rng(46)

    def burst() -> None:
        for length in lengths:
            conversation(stage, hidden, length, rng)
            done["conversations"] += 1

    await part.start(("127.0.0.1", 0))
    try:
        await asyncio.get_running_loop().run_in_executor(None, burst)
        trims, busy_mb, idle_began = part.trims, rss_mb(), time.monotonic()
        while part.trims == trims and time.monotonic() - idle_began < 10 * IDLE_AFTER_S:
            await asyncio.sleep(0.1)
        return {
            "busy_mb": round(busy_mb, 1),
            "idle_mb": round(rss_mb(), 1),
            "trimmed_after_s": round(time.monotonic() - idle_began, 2) if part.trims > trims else None,
        }
    finally:
        await part.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("export", type=Path)
    parser.add_argument("stage", type=int)
    parser.add_argument("--cache-dir", type=Path, default=None, help="OpenVINO's compiled-model cache")
    args = parser.parse_args()
    manifest = Manifest.load(args.export)
    config = RuntimeConfig(device="CPU", threads=1, cache_dir=args.cache_dir)  # as a stage agent compiles
    stage = CompiledStage(args.export, manifest.stages[args.stage], manifest.weights, config)
    lengths = [int(n) for n in np.random.default_rng(1).integers(8, 400, 40)]
    print(json.dumps(asyncio.run(burst_then_idle(stage, manifest.arch.hidden_size, lengths))))


if __name__ == "__main__":
    main()
