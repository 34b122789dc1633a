"""``shoal bench shards``: the monolithic openvino_genai baseline against 1, 2 and 3 in-process stages.

Method (docs/benchmarks.md, DESIGN.md "Measuring"):

- same machine, same int4 weights (shoal's exports and an optimum-intel export of the same
  checkpoint, both int4 symmetric, group size 128), same prompt token ids on both sides;
- every configuration gets one "PC": its own process pinned to one core with
  ``INFERENCE_NUM_THREADS=1``, so compilation and caches of one never help another;
- runs interleave the configurations (mono, 1, 2, 3, mono, 1, ...) to spread machine noise, and
  each run generates exactly ``--tokens`` greedy tokens (stop tokens ignored) after a warm-up;
- decode tok/s excludes the first token (time to first token is reported apart); results are
  the median and range over runs, and ratios are taken within this one invocation;
- a run during which another process took the core (its CPU time / wall time below
  ``--min-cpu-share``) is repeated, up to three times, and the repeats are counted in the report.

Exports are cached under ``CACHE/bench/<model>/`` and reused by later runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.bench.baseline import BenchError, PreparedExport, optimum_export, recorded_steps, shoal_export
from agent.bench.report import BASELINE, build_report, render_markdown, render_table
from agent.bench.worker import RunResult, RunSpec

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
MARKDOWN_TITLE = "# Benchmarks\n\nSections are appended by `shoal bench shards --markdown docs/benchmarks.md`.\n\n"


def run_bench_shards(args: argparse.Namespace, cache_dir: Path) -> int:
    """Prepare (or reuse) the exports, run every configuration ``--runs`` times, report."""
    configs = _configs(getattr(args, "configs", None))
    if args.runs < 1 or args.tokens < 2:
        raise BenchError("--runs must be at least 1 and --tokens at least 2")
    core = _core(getattr(args, "core", None))
    warmup = getattr(args, "warmup_tokens", None)
    warmup_tokens = args.tokens if warmup is None else max(1, warmup)
    prompt = getattr(args, "prompt", None) or DEFAULT_PROMPT

    work = cache_dir / "bench" / _slug(args.model)
    work.mkdir(parents=True, exist_ok=True)
    exports = _prepare_exports(args.model, configs, work, cache_dir)
    prompt_ids = _prompt_ids(exports, prompt, args.tokens)

    min_share = getattr(args, "min_cpu_share", None)
    min_share = DEFAULT_MIN_CPU_SHARE if min_share is None else min_share
    results: dict[str, list[RunResult]] = {name: [] for name in configs}
    repeated = dict.fromkeys(configs, 0)
    for run in range(args.runs):
        for name in configs:
            spec = RunSpec(
                kind="mono" if name == BASELINE else "shoal",
                model_dir=str(exports[name].path),
                prompt_ids=prompt_ids,
                tokens=args.tokens,
                warmup_tokens=warmup_tokens,
                core=core,
                ov_cache_dir=str(work / "ov-cache"),
            )
            for attempt in range(1 + DISTURBED_RETRIES):
                result = _run_worker(spec, name)
                print(f"bench: run {run + 1}/{args.runs} {name:<8} {result.tok_s:7.2f} tok/s, "
                      f"TTFT {result.ttft_s:.3f} s, CPU share {result.cpu_share:.2f}", file=sys.stderr)
                if result.cpu_share >= min_share or attempt == DISTURBED_RETRIES:
                    break
                repeated[name] += 1
                print(f"bench: another process took core {core} during that run, repeating it", file=sys.stderr)
            results[name].append(result)

    extra: dict[str, Any] = {
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "warmup_tokens": warmup_tokens,
        "min_cpu_share": min_share,
        "repeated_runs": repeated,
        "exports": {name: _export_json(export) for name, export in exports.items()},
    }
    report = build_report(args.model, args.tokens, args.runs, results, _machine(core), extra)
    if args.json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        print(render_table(report))
    if args.markdown is not None:
        _append_markdown(args.markdown, render_markdown(report, _command_line()))
        print(f"bench: results appended to {args.markdown}", file=sys.stderr)
    return 0


def _configs(selected: str | None) -> list[str]:
    if not selected:
        return list(CONFIGS)
    names = [n.strip() for n in selected.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(CONFIGS)}")
    return [n for n in CONFIGS if n in names]


def _core(requested: int | None) -> int:
    """The core every configuration is pinned to: the requested one, else the last one we may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if requested is None:
        return allowed[-1]
    if requested not in allowed:
        raise BenchError(f"--core {requested} is not among the usable cores {allowed}")
    return requested


def _slug(model: str) -> str:
    """A folder name for a model source (short name, path or Hub id)."""
    name = Path(model).name if os.sep in model and Path(model).exists() else model
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-") or "model"


def _prepare_exports(model: str, configs: list[str], work: Path, cache_dir: Path) -> dict[str, PreparedExport]:
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
            raise BenchError(f"prompt ({len(ids)} tokens) + {tokens} tokens exceeds the "
                             f"{manifest.context_tokens}-token context")
        return ids
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(exports[BASELINE].path))
    encoded: Any = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=True)
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def _run_worker(spec: RunSpec, name: str) -> RunResult:
    """One measured run in a fresh process (``python -m agent.bench.worker``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-m", "agent.bench.worker"], input=json.dumps(spec.__dict__),
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise BenchError(f"{name} run failed (exit {proc.returncode}):\n{tail}")
    if proc.stderr.strip():
        log.debug("%s worker stderr:\n%s", name, proc.stderr.strip())
    try:
        return RunResult.from_json(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, json.JSONDecodeError, TypeError) as exc:
        raise BenchError(f"{name} run printed no result ({exc}): {proc.stdout[-500:]!r}") from exc


def _export_json(export: PreparedExport) -> dict[str, Any]:
    data = export.to_json()
    if export.reused and not export.steps:
        recorded = recorded_steps(export.path)
        if recorded:
            data["recorded_steps"] = {name: m.__dict__ for name, m in recorded.items()}
    data["weights_mb"] = sum(p.stat().st_size for p in export.path.rglob("*.bin")
                             if "tokenizer" not in p.name) / 1e6
    return data


def _machine(core: int) -> dict[str, Any]:
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
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _command_line() -> str:
    return shlex.join(["shoal", *sys.argv[1:]])


def _append_markdown(path: Path, section: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.is_file() else ""
    with path.open("a") as f:
        if not existing:
            f.write(MARKDOWN_TITLE)
        elif not existing.endswith("\n\n"):
            f.write("\n")
        f.write(section)
