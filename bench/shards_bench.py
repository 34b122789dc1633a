"""``python -m bench shards``: the monolithic openvino_genai baseline against 1, 2 and 3 in-process stages.

Method (docs/benchmarks.md, DESIGN.md "Measuring"):

- same machine, same int4 weights (shoal's exports and an optimum-intel export of the same
  checkpoint, both int4 symmetric, group size 128), same prompt token ids on both sides;
- every configuration gets one "PC": its own process pinned to one core with
  ``INFERENCE_NUM_THREADS=1``, so compilation and caches of one never help another; each run
  gets a fresh process, whose timed generation directly follows an untimed warm-up generation
  (``--warmup-tokens``). ``--resident-workers`` keeps one process per configuration for all its
  runs instead: shorter, but measured here the long-lived LLMPipeline process then ran 5-10 %
  slower than in a fresh process, so it is not the default;
- runs interleave the configurations to spread machine noise, each round in a rotated order
  (mono 1 2 3, 1 2 3 mono, 2 3 mono 1, ...), and each run generates exactly ``--tokens`` greedy
  tokens (stop tokens ignored);
- decode tok/s excludes the first token (time to first token is reported apart); results are
  the median and range over runs, and ratios are taken within this one invocation;
- a run during which another process took the core (its CPU time / wall time below
  ``--min-cpu-share``) is repeated, up to three times, and the repeats are counted in the report;
  the other cores share caches and memory bandwidth with it, so each run records how busy they
  were, and ``--quiet-wait`` makes every run first wait for them to fall idle.

Exports are cached under ``CACHE/bench/<model>/`` and reused by later runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import BenchError, select_configs
from bench.baseline import PreparedExport, optimum_export, recorded_steps, shoal_export
from bench.report import BASELINE, build_report, render_markdown, render_table
from bench.worker import RunResult, RunSpec, WorkerProcess

log = logging.getLogger(__name__)

CONFIGS = ("mono", "1-stage", "2-stage", "3-stage")
DEFAULT_PROMPT = (
    "Write a Python function that merges two sorted lists into one sorted list without using sort(), "
    "then explain step by step how it works and what its time complexity is."
)
DEFAULT_MIN_CPU_SHARE = 0.95
"""A run whose process got less of its core than this (another process ran there) is repeated..."""
DISTURBED_RETRIES = 3
"""...at most this many times; the last attempt counts whatever its share."""
QUIET_BUSY = 0.10
"""With ``--quiet-wait``, a run starts once the other cores were at most this busy over a second."""
QUIET_POLL_S = 5.0
SETTLE_S = 0.2
"""Pause before each run, so that the previous worker's threads are asleep."""
MARKDOWN_TITLE = "# Benchmarks\n\nSections are appended by `python -m bench shards --markdown docs/benchmarks.md`.\n\n"


@dataclass(frozen=True)
class BenchSettings:
    """What ``python -m bench shards`` was asked to measure, validated."""

    model: str
    configs: tuple[str, ...]
    runs: int
    tokens: int
    warmup_tokens: int
    core: int
    prompt: str
    min_cpu_share: float
    quiet_wait: float
    resident_workers: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchSettings:
        if args.runs < 1 or args.tokens < 2:
            raise BenchError("--runs must be at least 1 and --tokens at least 2")
        warmup = getattr(args, "warmup_tokens", None)
        min_share = getattr(args, "min_cpu_share", None)
        return cls(
            model=args.model,
            configs=select_configs(getattr(args, "configs", None), CONFIGS),
            runs=args.runs,
            tokens=args.tokens,
            warmup_tokens=args.tokens if warmup is None else max(1, warmup),
            core=_core(getattr(args, "core", None)),
            prompt=getattr(args, "prompt", None) or DEFAULT_PROMPT,
            min_cpu_share=DEFAULT_MIN_CPU_SHARE if min_share is None else min_share,
            quiet_wait=max(0.0, getattr(args, "quiet_wait", None) or 0.0),
            resident_workers=bool(getattr(args, "resident_workers", False)),
        )


def run_bench_shards(args: argparse.Namespace, cache_dir: Path) -> int:
    """Prepare (or reuse) the exports, run every configuration ``--runs`` times, report."""
    settings = BenchSettings.from_args(args)
    work = cache_dir / "bench" / slug(settings.model)
    work.mkdir(parents=True, exist_ok=True)
    exports = _prepare_exports(settings.model, settings.configs, work, cache_dir)
    prompt_ids = _prompt_ids(exports, settings.prompt, settings.tokens)
    results, repeated = _measure(settings, exports, prompt_ids, work / "ov-cache")

    extra: dict[str, Any] = {
        "prompt": settings.prompt,
        "prompt_tokens": len(prompt_ids),
        "warmup_tokens": settings.warmup_tokens,
        "workers": "one process per configuration" if settings.resident_workers else "a fresh process per run",
        "min_cpu_share": settings.min_cpu_share,
        "repeated_runs": repeated,
        "exports": {name: _export_json(export) for name, export in exports.items()},
    }
    report = build_report(
        settings.model, settings.tokens, settings.runs, results, describe_machine(settings.core), extra
    )
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        print(render_table(report))
    if args.markdown is not None:
        append_markdown(args.markdown, render_markdown(report, command_line()))
        print(f"bench: results appended to {args.markdown}", file=sys.stderr)
    return 0


def _measure(
    settings: BenchSettings, exports: dict[str, PreparedExport], prompt_ids: list[int], ov_cache: Path
) -> tuple[dict[str, list[RunResult]], dict[str, int]]:
    """Every configuration once per round, ``runs`` rounds; returns the runs and the repeats per config."""
    specs = {
        name: RunSpec(
            kind="mono" if name == BASELINE else "shoal",
            model_dir=str(exports[name].path),
            prompt_ids=prompt_ids,
            tokens=settings.tokens,
            warmup_tokens=settings.warmup_tokens,
            core=settings.core,
            ov_cache_dir=str(ov_cache),
        )
        for name in settings.configs
    }
    results: dict[str, list[RunResult]] = {name: [] for name in settings.configs}
    repeated = dict.fromkeys(settings.configs, 0)
    with contextlib.ExitStack() as stack:
        workers: dict[str, WorkerProcess] = {}
        if settings.resident_workers:
            for name in settings.configs:
                print(f"bench: starting the {name} worker (load + compile)", file=sys.stderr)
                workers[name] = stack.enter_context(contextlib.closing(WorkerProcess(name, specs[name])))
        for run in range(settings.runs):
            for name in rotation(settings.configs, run):
                for attempt in range(1 + DISTURBED_RETRIES):
                    result = _one_run(name, specs[name], workers.get(name), settings)
                    print(
                        f"bench: run {run + 1}/{settings.runs} {name:<8} {result.tok_s:7.2f} tok/s, "
                        f"TTFT {result.ttft_s:.3f} s, CPU share {result.cpu_share:.2f}, "
                        f"other cores {100 * result.others_busy:.0f} % busy",
                        file=sys.stderr,
                    )
                    if result.cpu_share >= settings.min_cpu_share or attempt == DISTURBED_RETRIES:
                        break
                    repeated[name] += 1
                    print(
                        f"bench: another process took core {settings.core} during that run, repeating it",
                        file=sys.stderr,
                    )
                results[name].append(result)
    return results, repeated


def rotation(configs: tuple[str, ...], run: int) -> tuple[str, ...]:
    """The order of round ``run``: every round starts one configuration later (A B C D, B C D A, ...),
    so that no configuration always runs first (measured here: the first of a round ran slowest)."""
    shift = run % len(configs)
    return configs[shift:] + configs[:shift]


def _one_run(name: str, spec: RunSpec, worker: WorkerProcess | None, settings: BenchSettings) -> RunResult:
    """One timed run: on a fresh worker, or on the configuration's resident one (--resident-workers)."""
    _wait_for_quiet(settings.core, settings.quiet_wait)
    if worker is None:
        with contextlib.closing(WorkerProcess(name, spec)) as fresh:
            return fresh.run()
    time.sleep(SETTLE_S)
    return worker.run()


def _core(requested: int | None) -> int:
    """The core every configuration is pinned to: the requested one, else the last one we may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if requested is None:
        return allowed[-1]
    if requested not in allowed:
        raise BenchError(f"--core {requested} is not among the usable cores {allowed}")
    return requested


def slug(model: str) -> str:
    """A folder name for a model source (short name, path or Hub id)."""
    name = Path(model).name if os.sep in model and Path(model).exists() else model
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-") or "model"


def _prepare_exports(model: str, configs: tuple[str, ...], work: Path, cache_dir: Path) -> dict[str, PreparedExport]:
    exports: dict[str, PreparedExport] = {}
    for name in configs:
        if name == BASELINE:
            continue
        stages = int(name.split("-")[0])
        print(f"bench: {name} shoal export of {model} (int4)", file=sys.stderr)
        exports[name] = shoal_export(model, stages, work / f"shoal-{stages}stage", cache_dir)
    if BASELINE in configs:
        exports[BASELINE] = optimum_export(model, work / "optimum-int4", cache_dir)
    return {name: exports[name] for name in configs}


def _prompt_ids(exports: dict[str, PreparedExport], prompt: str, tokens: int) -> list[int]:
    """The chat prompt's token ids, from a shoal export's tokenizer (both sides get these ids)."""
    from agent.head.chat import ChatTokenizer
    from shards.manifest import Manifest

    shoal = [e for name, e in exports.items() if name != BASELINE]
    if shoal:
        manifest = Manifest.load(shoal[0].path)
        ids = ChatTokenizer(shoal[0].path / "tokenizer").encode_chat([{"role": "user", "content": prompt}])
        if len(ids) + tokens > manifest.context_tokens:
            raise BenchError(
                f"prompt ({len(ids)} tokens) + {tokens} tokens exceeds the {manifest.context_tokens}-token context"
            )
        return ids
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(exports[BASELINE].path))
    encoded: Any = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def _wait_for_quiet(core: int, patience: float) -> None:
    """Wait (at most ``patience`` seconds) until the cores other than ``core`` are nearly idle.

    They share caches and memory bandwidth with the measured core, so a busy neighbour slows a run
    even though it never takes the core itself.
    """
    if patience <= 0:
        return
    deadline = time.monotonic() + patience
    announced = False
    while True:
        busy = _others_busy(core, interval=1.0)
        if busy <= QUIET_BUSY:
            return
        if time.monotonic() >= deadline:
            print(
                f"bench: other cores still {100 * busy:.0f} % busy after {patience:.0f} s, measuring anyway",
                file=sys.stderr,
            )
            return
        if not announced:
            print(f"bench: other cores {100 * busy:.0f} % busy, waiting for quiet", file=sys.stderr)
            announced = True
        time.sleep(QUIET_POLL_S)


def _others_busy(core: int, interval: float) -> float:
    from bench.worker import cpu_times

    before = cpu_times()
    time.sleep(interval)
    after = cpu_times()
    busy = total = 0
    for cpu, (busy_after, total_after) in after.items():
        if cpu != core and cpu in before:
            busy += busy_after - before[cpu][0]
            total += total_after - before[cpu][1]
    return busy / total if total else 0.0


def _export_json(export: PreparedExport) -> dict[str, Any]:
    data = export.to_json()
    if export.reused and not export.steps:
        recorded = recorded_steps(export.path)
        if recorded:
            data["recorded_steps"] = {name: m.__dict__ for name, m in recorded.items()}
    data["weights_mb"] = sum(p.stat().st_size for p in export.path.rglob("*.bin") if "tokenizer" not in p.name) / 1e6
    return data


def describe_machine(core: int, packages: tuple[str, ...] = ()) -> dict[str, Any]:
    """The machine and the versions that matter (``packages``: further ones, recorded under their names)."""
    from importlib.metadata import PackageNotFoundError, version

    import psutil

    def package(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "pinned_core": core,
        "threads_per_config": 1,
        "memory_gb": psutil.virtual_memory().total / 2**30,
        "load_average": os.getloadavg()[0],
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "openvino": package("openvino"),
        "openvino_genai": package("openvino-genai"),
        "optimum_intel": package("optimum-intel"),
        "nncf": package("nncf"),
        **{name: package(name) for name in packages},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def command_line() -> str:
    """The command that produced a report, as the user typed it (``python -m bench ...``)."""
    return shlex.join(["python", "-m", "bench", *sys.argv[1:]])


def publish(args: argparse.Namespace, report: dict[str, Any], markdown: str, log_dir: Path) -> None:
    """Where a report goes: ``report.json`` in the run's log folder; on stdout, the JSON object (``--json``) or
    the Markdown section; that section appended to ``--markdown FILE``."""
    (log_dir / "report.json").write_text(json.dumps(report, indent=1))
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        print(markdown)
    if args.markdown is not None:
        append_markdown(args.markdown, markdown)
        print(f"bench: results appended to {args.markdown}", file=sys.stderr)


def append_markdown(path: Path, section: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.is_file() else ""
    with path.open("a") as f:
        if not existing:
            f.write(MARKDOWN_TITLE)
        elif not existing.endswith("\n\n"):
            f.write("\n")
        f.write(section)
