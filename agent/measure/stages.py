"""``shoal bench stages``: each stage's decode time back to back, against what the split planner assumed.

An export's cuts come from :mod:`shards.export.split`, which prices a stage by a cost model. This
benchmark measures what each stage really costs per decoded token on this machine (one thread
by default, every stage in this process, one after the other with no idle gap between them) and
sets it beside the planner's estimate, so a split can be checked before a fleet is built on it.

``--together`` also times the stages running at the same time, each in its own process pinned to
its own core, as they do on a ring busy with several users. Where the "PCs" are cores of one
machine, they share its memory bandwidth, and a stage that streams hundreds of MB of weights per
token slows the others down: that slowdown bounds what interleaving users (micro-batching) can gain
here, and separate PCs would not have it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.errors import BenchError


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
    precision: str = ""
    """What the stage decoded in, and how that was chosen (``PrecisionChoice.describe``)."""

    def measured_share(self, total_ms: float) -> float:
        return self.ms_median / total_ms if total_ms else 0.0


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``shoal bench stages``."""
    b.add_argument("exports", type=Path, nargs="+", metavar="EXPORT_DIR", help="export folders to time")
    b.add_argument("--threads", type=int, default=1, help="OpenVINO inference threads (default 1: one 'PC')")
    b.add_argument("--core", type=int, default=None, help="pin to this core first (default: the last usable)")
    b.add_argument("--prompt-tokens", type=int, default=100, help="positions in the cache before timing")
    b.add_argument("--tokens", type=int, default=50, help="timed decode steps (after 10 untimed ones)")
    b.add_argument(
        "--together",
        action="store_true",
        help="also time the stages all at once, each in a process on its own core (stage i on the "
        "i-th usable core, round robin)",
    )
    b.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_bench_stages(args: argparse.Namespace, cache_dir: Path) -> int:
    """Time every stage of every export given; print a table (or JSON)."""
    if args.tokens < 1 or args.prompt_tokens < 1:
        raise BenchError("--tokens and --prompt-tokens must be at least 1")
    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[-1] if args.core is None else args.core
    if core not in allowed:
        raise BenchError(f"--core must be one of the usable cores {allowed}")
    together: dict[str, list[TogetherTiming]] = {}
    if args.together:  # first, in child processes, before this one pins itself
        together = {
            str(path): time_stages_together(path, allowed, args.threads, args.prompt_tokens, args.tokens, cache_dir)
            for path in args.exports
        }
    # pin before OpenVINO builds its thread pool, so that the pool sees one CPU
    os.sched_setaffinity(0, {core})
    results = {
        str(path): [asdict(t) for t in time_stages(path, args.threads, args.prompt_tokens, args.tokens, cache_dir)]
        for path in args.exports
    }
    if args.json:
        sys.stdout.write(
            json.dumps(
                {
                    "core": core,
                    "threads": args.threads,
                    "exports": results,
                    "together": {path: [asdict(t) for t in timings] for path, timings in together.items()} or None,
                }
            )
            + "\n"
        )
    else:
        for path, timings in results.items():
            print(render_table(path, [StageTiming(**t) for t in timings], together.get(path)))
    return 0


def time_stages(export: Path, threads: int, prompt_tokens: int, tokens: int, cache_dir: Path) -> list[StageTiming]:
    """Decode ``tokens`` steps through all stages of ``export``, timing each stage's ``step``."""
    import numpy as np

    from agent.runtime.config import RuntimeConfig
    from agent.runtime.protocol import new_sessions
    from agent.runtime.stage import CompiledStage
    from shards.export.split import StageCostModel
    from shards.manifest import Manifest

    manifest = Manifest.load(export)
    _check_context(manifest.context_tokens, prompt_tokens, tokens)
    config = RuntimeConfig(device="CPU", threads=threads, cache_dir=cache_dir / "ov-cache")
    stages = [CompiledStage(export, entry, manifest.weights, config) for entry in manifest.stages]
    sessions = new_sessions(stages)
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
    return [
        StageTiming(
            name=e.name,
            layers=e.num_layers,
            embeddings=e.embeddings,
            head=e.head,
            ms_median=1e3 * statistics.median(s),
            ms_min=1e3 * min(s),
            planned_share=cost / sum(planned),
            precision=stage.precision_choice.describe(),
        )
        for e, s, cost, stage in zip(manifest.stages, seconds, planned, stages, strict=True)
    ]


def _check_context(context_tokens: int, prompt_tokens: int, tokens: int) -> None:
    if prompt_tokens + tokens + 10 > context_tokens:
        raise BenchError(f"{prompt_tokens + tokens + 10} positions exceed the {context_tokens}-token context")


ROUNDS_TOGETHER = 3
"""Rounds of (each stage alone in turn, then all at once): alone and together are timed close in time
(this machine's speed drifts by 10-20 % within minutes)."""
EXTRA_STEPS_TOGETHER = 10
"""Bound on a round's steps per timed step, for a stage that waits for much slower ones (its cache grows)."""


@dataclass(frozen=True)
class TogetherTiming:
    """One stage's median ms per step alone and beside the other stages, each in its own process."""

    alone_ms: float
    together_ms: float


def time_stages_together(
    export: Path, cores: list[int], threads: int, prompt_tokens: int, tokens: int, cache_dir: Path
) -> list[TogetherTiming]:
    """Each stage of ``export`` in its own process on ``cores[i % len(cores)]``, timed alone (the others
    waiting) and while all of them step at once, in alternating rounds."""
    from shards.manifest import Manifest

    manifest = Manifest.load(export)
    _check_context(manifest.context_tokens, prompt_tokens, (2 + EXTRA_STEPS_TOGETHER) * tokens)
    spawn = multiprocessing.get_context("spawn")  # a fresh OpenVINO per child, pinned before it starts
    count = len(manifest.stages)
    barrier, done, answers = spawn.Barrier(count), spawn.Value("i", 0), spawn.Queue()
    children = [
        spawn.Process(
            target=_time_stage_in_child,
            daemon=True,
            args=(
                export,
                index,
                cores[index % len(cores)],
                threads,
                prompt_tokens,
                tokens,
                cache_dir,
                barrier,
                done,
                answers,
            ),
        )
        for index in range(count)
    ]
    for child in children:
        child.start()
    try:
        timings: dict[int, TogetherTiming] = {}
        while len(timings) < count:
            try:
                index, timing = answers.get(timeout=5)
            except queue.Empty:
                if any(child.exitcode not in (None, 0) for child in children):
                    raise BenchError(f"a stage of {export} failed while timed with the others (see above)") from None
                continue
            timings[index] = timing
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
            child.join()
    return [timings[i] for i in range(count)]


def _time_stage_in_child(
    export: Path,
    index: int,
    core: int,
    threads: int,
    prompt_tokens: int,
    tokens: int,
    cache_dir: Path,
    barrier: Any,
    done: Any,
    answers: Any,
) -> None:
    import numpy as np

    from agent.runtime.config import RuntimeConfig
    from agent.runtime.stage import CompiledStage
    from shards.manifest import Manifest

    os.sched_setaffinity(0, {core})
    manifest = Manifest.load(export)
    entry, count = manifest.stages[index], len(manifest.stages)
    stage = CompiledStage(
        export, entry, manifest.weights, RuntimeConfig(device="CPU", threads=threads, cache_dir=cache_dir / "ov-cache")
    )
    session = stage.new_session()
    rng = np.random.default_rng(index)

    def inputs(n: int) -> Any:
        if entry.embeddings:
            return np.full((1, n), 300, dtype=np.int64)
        return (0.1 * rng.standard_normal((1, n, manifest.arch.hidden_size))).astype(np.float32)

    session.step(inputs(prompt_tokens), last_only=True)
    one = inputs(1)
    for _ in range(10):
        session.step(one, last_only=True)

    def timed_step() -> float:
        started = time.perf_counter()
        session.step(one, last_only=True)
        return time.perf_counter() - started

    alone: list[float] = []
    together: list[float] = []
    for round_ in range(ROUNDS_TOGETHER):
        for turn in range(count):
            barrier.wait()
            if turn == index:
                alone += [timed_step() for _ in range(tokens)]
        barrier.wait()
        # all at once; a stage done early keeps stepping (untimed, up to EXTRA_STEPS_TOGETHER x tokens) so the
        # others stay measured beside it
        timed = steps = 0
        while timed < tokens or (done.value < count * (round_ + 1) and steps < EXTRA_STEPS_TOGETHER * tokens):
            steps += 1
            seconds = timed_step()
            if timed < tokens:
                together.append(seconds)
                timed += 1
                if timed == tokens:
                    with done.get_lock():
                        done.value += 1
        # rewind what this round added, so the cache stays the size it was timed at
        session.rewind(session.logical_length - prompt_tokens - 10)
    answers.put((index, TogetherTiming(1e3 * statistics.median(alone), 1e3 * statistics.median(together))))


def render_table(export: str, timings: list[StageTiming], together: list[TogetherTiming] | None = None) -> str:
    """A markdown table: measured and planned share of each stage (and, if measured, its time alone and
    beside the others running at once, each stage in its own process)."""
    total = sum(t.ms_median for t in timings)
    lines = [
        f"{export}: {total:.2f} ms per token through all stages (sum of medians)",
        "",
        "| stage | layers | ends | precision | ms/token median (min) | measured share | planned share |"
        + (" own process: alone → all at once, ms/token |" if together else ""),
        "|---|---:|---|---|---:|---:|---:|" + ("---:|" if together else ""),
    ]
    for i, t in enumerate(timings):
        ends = "+".join(name for name, held in (("embeddings", t.embeddings), ("LM head", t.head)) if held) or "-"
        lines.append(
            f"| {t.name} | {t.layers} | {ends} | {t.precision or '-'} | {t.ms_median:.2f} ({t.ms_min:.2f}) | "
            f"{100 * t.measured_share(total):.1f} % | {100 * t.planned_share:.1f} % |"
            + (
                f" {together[i].alone_ms:.2f} → {together[i].together_ms:.2f} "
                f"({together[i].together_ms / together[i].alone_ms:.2f}×) |"
                if together
                else ""
            )
        )
    if together:
        alone_total = sum(t.alone_ms for t in together)
        slowest = max(t.together_ms for t in together)
        lines += [
            "",
            f"Users keeping every stage busy would make about {alone_total / slowest:.2f}× the tokens/s "
            f"of one user on this machine (the stages' times alone, summed, over the slowest stage's time "
            f"beside the others; the wire and the head's own work left out).",
        ]
    return "\n".join(lines) + "\n"
