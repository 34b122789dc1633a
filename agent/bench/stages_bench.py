"""``shoal bench stages``: each stage's decode time back to back, against what the split planner assumed.

An export's cuts come from :mod:`shards.export.split`, which prices a stage by a cost model. This
benchmark measures what each stage really costs per decoded token on this machine (one thread
by default, every stage in this process, one after the other with no idle gap between them) and
sets it beside the planner's estimate, so a split can be checked before a fleet is built on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.bench import BenchError


@dataclass(frozen=True)
class StageTiming:
    """One stage's decode time per token, and the planner's share of the export's cost for it."""

    name: str
    layers: int
    embeddings: bool
    head: bool
    ms_median: float
    ms_min: float
    planned_share: float
    """The planner's estimate of this stage's share of one token's total cost (0-1)."""

    def measured_share(self, total_ms: float) -> float:
        return self.ms_median / total_ms if total_ms else 0.0


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``shoal bench stages``."""
    b.add_argument("exports", type=Path, nargs="+", metavar="EXPORT_DIR", help="export folders to time")
    b.add_argument("--threads", type=int, default=1, help="OpenVINO inference threads (default 1: one 'PC')")
    b.add_argument("--core", type=int, default=None, help="pin to this core first (default: the last usable)")
    b.add_argument("--prompt-tokens", type=int, default=100, help="positions in the cache before timing")
    b.add_argument("--tokens", type=int, default=50, help="timed decode steps (after 10 untimed ones)")
    b.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_bench_stages(args: argparse.Namespace, cache_dir: Path) -> int:
    """Time every stage of every export given; print a table (or JSON)."""
    if args.tokens < 1 or args.prompt_tokens < 1:
        raise BenchError("--tokens and --prompt-tokens must be at least 1")
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1] if args.core is None else args.core
    if core not in allowed:
        raise BenchError(f"--core must be one of the usable cores {allowed}")
    # pin before OpenVINO builds its thread pool, so that the pool sees one CPU
    os.sched_setaffinity(0, {core})
    results = {str(path): [asdict(t) for t in time_stages(path, args.threads, args.prompt_tokens, args.tokens,
                                                          cache_dir)]
               for path in args.exports}
    if args.json:
        sys.stdout.write(json.dumps({"core": core, "threads": args.threads, "exports": results}) + "\n")
    else:
        for path, timings in results.items():
            print(render_table(path, [StageTiming(**t) for t in timings]))
    return 0


def time_stages(export: Path, threads: int, prompt_tokens: int, tokens: int, cache_dir: Path) -> list[StageTiming]:
    """Decode ``tokens`` steps through all stages of ``export``, timing each stage's ``step``."""
    import numpy as np

    from agent.runtime.stage import CompiledStage, RuntimeConfig
    from shards.export.split import StageCostModel
    from shards.manifest import Manifest

    manifest = Manifest.load(export)
    if prompt_tokens + tokens + 10 > manifest.context_tokens:
        raise BenchError(f"{prompt_tokens + tokens + 10} positions exceed the {manifest.context_tokens}-token context")
    config = RuntimeConfig(device="CPU", threads=threads, cache_dir=cache_dir / "ov-cache")
    stages = [CompiledStage(export, entry, manifest.weights, config) for entry in manifest.stages]
    sessions = [stage.new_session() for stage in stages]
    x: Any = np.arange(100, 100 + prompt_tokens, dtype=np.int64)[None]
    for session in sessions:
        x = session.step(x, last_only=True)
    seconds: list[list[float]] = [[] for _ in stages]
    token = np.array([[300]], dtype=np.int64)  # the cost of a step does not depend on which token it is
    for step in range(10 + tokens):
        x = token
        for index, session in enumerate(sessions):
            started = time.perf_counter()
            x = np.array(session.step(x, last_only=True))
            if step >= 10:
                seconds[index].append(time.perf_counter() - started)
    model = StageCostModel.of(manifest.arch, manifest.weights)
    planned = [model.stage(e.num_layers, e.head) for e in manifest.stages]
    return [StageTiming(name=e.name, layers=e.num_layers, embeddings=e.embeddings, head=e.head,
                        ms_median=1e3 * statistics.median(s), ms_min=1e3 * min(s),
                        planned_share=cost / sum(planned))
            for e, s, cost in zip(manifest.stages, seconds, planned, strict=True)]


def render_table(export: str, timings: list[StageTiming]) -> str:
    """A markdown table: measured and planned share of each stage."""
    total = sum(t.ms_median for t in timings)
    lines = [f"{export}: {total:.2f} ms per token through all stages (sum of medians)", "",
             "| stage | layers | ends | ms/token median (min) | measured share | planned share |",
             "|---|---:|---|---:|---:|---:|"]
    for t in timings:
        ends = "+".join(name for name, held in (("embeddings", t.embeddings), ("LM head", t.head)) if held) or "-"
        lines.append(f"| {t.name} | {t.layers} | {ends} | {t.ms_median:.2f} ({t.ms_min:.2f}) | "
                     f"{100 * t.measured_share(total):.1f} % | {100 * t.planned_share:.1f} % |")
    return "\n".join(lines) + "\n"
