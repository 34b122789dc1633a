"""``python -m bench.batch_invariance``: does a session's row come out the same whatever is packed beside it?

On the paged compilation of every stage of a SmolLM2 int4 export (``agent.runtime.paged_kv``), one thread, each
precision setting asked for: session 0 is prefilled alone, then decodes ``--tokens`` steps (the tokens it
chose alone, fed to every arm) alone, beside 3 or 7 other sessions' decode rows, and beside 3 other sessions'
prompt rows; its prompt is also run beside 3 others' prompts. Reported per arm: the largest difference of its
logits from the alone run, and how many of its greedy tokens agree. The time of one packed decode step of 1, 4
and 8 rows through all stages (median CPU time), and of one session's decode and speculative steps on the product's
stages with ``kv = "state"`` (today's default) and ``"paged"``, say what packing costs and saves. The figures
decide what a paged stage may claim (``agent.runtime.paged_kv``: ``paged_packs_alike`` and the rules beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from agent.runtime.config import RuntimeConfig
from agent.runtime.paged_kv import PagedKV, PagedKVSession, PagedRow, paged_pads
from agent.runtime.paged_prefill import compile_paged_prefill
from agent.runtime.stage import CompiledStage, compile_properties, default_inference_precision
from shards.manifest import Manifest

Step = tuple[list[PagedKVSession], np.ndarray, bool]
"""A session per stage, its token ids ``[1, n]``, last_only."""

DRAFTED = 5
"""Positions of session 0 verified in one step (a speculative step's), against as many single steps."""

SETTINGS: dict[str, dict[str, str]] = {
    "f32": {},
    "auto": {},
    "auto-dq0": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"},
    "auto-dq128": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "128"},
    "bf16": {},
}
"""Precision settings tried: a ``RuntimeConfig.precision`` (the name before ``-``) and properties on top."""


@dataclass(frozen=True)
class Arm:
    """Session 0's numbers in one arrangement, against it alone."""

    name: str
    max_abs_diff: float
    tokens_agree: int
    tokens: int


def compile_stages(folder: Path, setting: str, blocks: int, threads: int) -> list[PagedKV]:
    """Every stage of the export at ``folder`` on its paged compilation, in ``setting`` (``SETTINGS``)."""
    manifest = Manifest.load(folder)
    core = ov.Core()
    default = default_inference_precision(core, "CPU")
    config = RuntimeConfig(device="CPU", threads=threads, precision=setting.split("-")[0], rewind="compact")
    stages = []
    for graph in manifest.stages:
        props = compile_properties("CPU", manifest.weights, config, default_precision=default)
        props.update(SETTINGS[setting])
        props.pop("KV_CACHE_PRECISION", None)
        compiled = compile_paged_prefill(core, str(folder / graph.xml), graph.inputs[0], graph.outputs[0], "CPU", props)
        pads = paged_pads(threads, config.precision == "f32" or manifest.weights in ("fp32", "fp16"))
        stages.append(PagedKV(compiled, blocks, graph.name, pads=pads))
    return stages


def run_through(
    stages: Sequence[PagedKV], steps: Sequence[tuple[list[PagedKVSession], np.ndarray, bool]]
) -> list[np.ndarray]:
    """One packed step of ``steps`` (each: a session per stage, its token ids ``[1, n]``, last_only) through every
    stage; each step's last-stage output (copied)."""
    xs = [ids for _, ids, _ in steps]
    for i, kv in enumerate(stages):
        rows = [PagedRow(s[i], x, None, last) for (s, _, last), x in zip(steps, xs, strict=True)]
        xs = [np.array(o) for o in kv.run(rows)]
    return xs


def _ids(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(100, 40000, size=(1, n)).astype(np.int64)


def measure(stages: Sequence[PagedKV], tokens: int) -> list[Arm]:
    """Session 0 alone against packed beside others, and a step of 5 positions against 5 steps."""

    def fresh(seeds: Sequence[int]) -> list[list[PagedKVSession]]:
        sessions = [[kv.new_session() for kv in stages] for _ in seeds]
        for s, seed in zip(sessions, seeds, strict=True):
            run_through(stages, [(s, _ids(40 + seed % 13, seed), True)])
        return sessions

    prompt0 = _ids(40, 0)

    def decode(others: int, prompts: bool, forced: Sequence[int] | None = None) -> list[np.ndarray]:
        """Session 0's logits: its prompt, then ``tokens`` steps (``forced`` tokens, or its own greedy ones)."""
        sessions = fresh(range(1, others + 1))
        mine = [kv.new_session() for kv in stages]
        out = [run_through(stages, [(mine, prompt0, True)])[0]]
        for t in range(tokens):
            chosen = forced[t] if forced is not None else int(np.argmax(out[-1][0, -1]))
            token = np.array([[chosen]], dtype=np.int64)
            step = [(mine, token, True)]
            for j, s in enumerate(sessions):
                step.append((s, _ids(24, 100 * t + j) if prompts else np.array([[300 + t]], np.int64), True))
            out.append(run_through(stages, step)[0])
        return out

    alone = decode(0, False)
    want_tokens = [int(np.argmax(x[0, -1])) for x in alone]
    arms = []

    def arm(name: str, got: list[np.ndarray]) -> None:
        agree = sum(int(np.argmax(g[0, -1])) == int(np.argmax(w[0, -1])) for g, w in zip(got, alone, strict=True))
        diff = max(float(np.abs(g - w).max()) for g, w in zip(got, alone, strict=True))
        arms.append(Arm(name, diff, agree, len(alone)))

    arm("alone, again", decode(0, False, want_tokens))
    arm("3 decode rows beside", decode(3, False, want_tokens))
    arm("7 decode rows beside", decode(7, False, want_tokens))
    arm("3 prompt rows (24) beside", decode(3, True, want_tokens))
    mine = [kv.new_session() for kv in stages]
    beside: list[Step] = [([kv.new_session() for kv in stages], _ids(30, 50 + j), True) for j in range(3)]
    arm("prompt beside 3 prompts", [run_through(stages, [(mine, prompt0, True), *beside])[0], *alone[1:]])
    mine = [kv.new_session() for kv in stages]
    run_through(stages, [(mine, prompt0, True)])
    drafted = np.array([want_tokens[:DRAFTED]], dtype=np.int64)  # a speculative step's positions, verified at once
    verified = run_through(stages, [(mine, drafted, False)])[0]
    arm(
        f"{DRAFTED} positions in one step",
        [alone[0], *(verified[:, i : i + 1] for i in range(DRAFTED)), *alone[DRAFTED + 1 :]],
    )
    return arms


def timings(stages: Sequence[PagedKV], single: dict[str, Callable[[], float]], rounds: int = 5) -> dict[str, float]:
    """Median CPU ms of one step through every stage: a packed decode step of 1, 4 and 8 rows, and each of
    ``single``'s timings (one session on a stage of the product), in interleaved rounds (the machine is shared)."""
    sessions = {rows: [[kv.new_session() for kv in stages] for _ in range(rows)] for rows in (1, 4, 8)}
    for group in sessions.values():
        run_through(stages, [(s, _ids(40, j), True) for j, s in enumerate(group)])
    cpu: dict[str, list[float]] = {}
    for r in range(rounds):
        for rows, group in sessions.items():
            step = [(s, np.array([[300 + r]], np.int64), True) for s in group]
            started = time.process_time()
            for _ in range(8):
                run_through(stages, step)
            cpu.setdefault(f"paged decode step, {rows} rows (CPU ms)", []).append((time.process_time() - started) / 8)
        for name, timed in single.items():
            cpu.setdefault(f"{name} (CPU ms)", []).append(timed())
    return {k: 1e3 * statistics.median(v) for k, v in cpu.items()}


def single_session(folder: Path, setting: str, threads: int, kv: str) -> dict[str, Callable[[], float]]:
    """Timings of one session on the product's stages (``CompiledStage``, ``kv`` = state or paged) in ``setting``:
    each call, the mean CPU seconds of 8 decode steps, or of 8 speculative steps (4 positions verified, 2 of
    them rewound after), through every stage."""
    manifest = Manifest.load(folder)
    config = RuntimeConfig(device="CPU", threads=threads, precision=setting.split("-")[0], kv=kv)
    stages = [CompiledStage(folder, g, manifest.weights, config) for g in manifest.stages]
    sessions = [s.new_session() for s in stages]

    def through(ids: np.ndarray, last_only: bool = True) -> None:
        x = ids
        for s in sessions:
            x = s.step(x, last_only=last_only)

    through(_ids(40, 0))

    def decode() -> float:
        started = time.process_time()
        for t in range(8):
            through(np.array([[300 + t]], np.int64))
        return (time.process_time() - started) / 8

    def speculate() -> float:
        started = time.process_time()
        for t in range(8):
            through(np.array([[300 + t, 301, 302, 303]], np.int64), last_only=False)
            for s in sessions:
                s.rewind(2)
        return (time.process_time() - started) / 8

    return {f"{kv} decode step, 1 session": decode, f"{kv} speculative step (4 positions, 2 rewound)": speculate}


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_invariance", description=__doc__.splitlines()[0])
    parser.add_argument("--export", type=Path, default=Path.home() / ".cache/shoal/bench/smollm2/shoal-3stage")
    parser.add_argument("--settings", default="f32,auto,bf16", help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.tokens < DRAFTED:
        parser.error(f"--tokens must be at least {DRAFTED}")
    report: dict[str, Any] = {
        "export": str(args.export),
        "cpu": ov.Core().get_property("CPU", "FULL_DEVICE_NAME"),
        "cpu_default_precision": default_inference_precision(ov.Core(), "CPU"),
        "openvino": ov.get_version(),
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "settings": {},
    }
    cpu, default = report["cpu"], report["cpu_default_precision"]
    out(f"{cpu}, default {default}, {args.threads} thread(s), load {report['load_average']}")
    for setting in args.settings.split(","):
        stages = compile_stages(args.export, setting, blocks=256, threads=args.threads)
        arms = measure(stages, args.tokens)
        single = {
            name: timed
            for kv in ("state", "paged")
            for name, timed in single_session(args.export, setting, args.threads, kv).items()
        }
        times = timings(stages, single)
        report["settings"][setting] = {"arms": [a.__dict__ for a in arms], "times": times}
        out(f"\n{setting}:")
        for a in arms:
            out(f"  {a.name:28s} max |logit diff| {a.max_abs_diff:.3g}, tokens agree {a.tokens_agree}/{a.tokens}")
        for k, v in times.items():
            out(f"  {k:56s} {v:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
