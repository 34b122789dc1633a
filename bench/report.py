"""Turning the runs of ``python -m bench shards`` into its JSON object, a text table and a Markdown section.

:func:`build_report` is pure: run results in, one JSON-ready dict out. The renderers only read
that dict, so the table, the Markdown and ``--json`` always show the same figures.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from bench.stats import Summary, agreement, paired_ratios
from bench.worker import RunResult

BASELINE = "mono"
SHOAL_CONFIGS = ("1-stage", "2-stage", "3-stage")
GOALS = {"1-stage": 0.97, "2-stage": 0.95, "3-stage": 0.93}
"""Decode speed each shoal configuration should reach, as a fraction of the monolithic baseline."""
BUSY_NEIGHBOURS = 0.10
"""Above this busy fraction of the other cores, a report warns that its figures are disturbed."""


def config_figures(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Median / min / max decode tok/s of one configuration, plus TTFT and the time split per token."""
    speed = Summary.of([r.tok_s for r in runs])
    ttft = Summary.of([r.ttft_s for r in runs])
    figures: dict[str, Any] = {
        "tok_s": speed.median,
        "min": speed.min,
        "max": speed.max,
        "runs": speed.runs,
        "tok_s_runs": [r.tok_s for r in runs],
        "ttft_s": ttft.median,
        "ttft_s_min": ttft.min,
        "ttft_s_max": ttft.max,
        "ms_per_token": Summary.of([1e3 * r.decode_s / (len(r.tokens) - 1) for r in runs]).median,
        "load_s": Summary.of([r.load_s for r in runs]).median,
        "peak_rss_mb": max(r.peak_rss_bytes for r in runs) / 1e6,
        "threads": max(r.threads for r in runs),
        "deterministic": all(r.tokens == runs[0].tokens for r in runs),
        "cpu_share_min": min(r.cpu_share for r in runs),
        "others_busy_max": max(r.others_busy for r in runs),
    }
    if runs[0].precision:
        figures["precision"] = runs[0].precision
    # shoal runs also split each decoded token's time: (decode, infer calls, OpenVINO's own latency)
    split = [
        (r.decode_s, r.infer_s, r.ov_latency_s, len(r.tokens) - 1)
        for r in runs
        if r.infer_s is not None and r.ov_latency_s is not None
    ]
    if split:

        def per_token(values: list[float]) -> float:
            return 1e3 * Summary.of(values).median

        figures["infer_ms_per_token"] = per_token([infer / n for _, infer, _, n in split])
        figures["python_ms_per_token"] = per_token([(decode - infer) / n for decode, infer, _, n in split])
        figures["binding_ms_per_token"] = per_token([(infer - latency) / n for _, infer, latency, n in split])
        figures["python_share"] = Summary.of([(decode - infer) / decode for decode, infer, _, _ in split]).median
        figures["outside_ov_share"] = Summary.of(
            [(decode - latency) / decode for decode, _, latency, _ in split]
        ).median
    return figures


def build_report(
    model: str,
    tokens: int,
    runs: int,
    results: Mapping[str, Sequence[RunResult]],
    machine: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The one JSON object ``python -m bench shards --json`` prints."""
    configs = {name: config_figures(r) for name, r in results.items()}
    report: dict[str, Any] = {
        "model": model,
        "tokens": tokens,
        "runs": runs,
        "machine": dict(machine),
        "configs": configs,
    }
    if BASELINE in results:
        base = configs[BASELINE]["tok_s"]
        shoal = [name for name in SHOAL_CONFIGS if name in results]
        report["ratios"] = {f"{name}/{BASELINE}": configs[name]["tok_s"] / base for name in shoal}
        paired: dict[str, Any] = {}
        for name in shoal:
            summary = Summary.of(paired_ratios([r.tok_s for r in results[name]], [r.tok_s for r in results[BASELINE]]))
            paired[f"{name}/{BASELINE}"] = {"median": summary.median, "min": summary.min, "max": summary.max}
        report["paired_ratios"] = paired
        # interference only ever slows a run down, so the best runs estimate the undisturbed speeds
        report["best_ratios"] = {
            f"{name}/{BASELINE}": configs[name]["max"] / configs[BASELINE]["max"] for name in shoal
        }
        report["goals"] = {
            name: {
                "target": GOALS[name],
                "ratio": configs[name]["tok_s"] / base,
                "pass": configs[name]["tok_s"] >= GOALS[name] * base,
            }
            for name in shoal
            if name in GOALS
        }
    report["agreement"] = _agreements(results, tokens)
    if extra:
        report.update(extra)
    return report


def _agreements(results: Mapping[str, Sequence[RunResult]], tokens: int) -> dict[str, Any]:
    """Greedy tokens compared: 1-stage vs mono (same weights, two runtimes), and each split vs 1-stage."""
    pairs = [("1-stage", BASELINE), ("2-stage", "1-stage"), ("3-stage", "1-stage")]
    out: dict[str, Any] = {}
    for name, reference in pairs:
        if name in results and reference in results:
            out[f"{name}/{reference}"] = asdict(agreement(results[name][0].tokens, results[reference][0].tokens))
    return out


# -- rendering -------------------------------------------------------------------------------------
def _speed(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _ratio(report: Mapping[str, Any], name: str) -> float | None:
    value = report.get("ratios", {}).get(f"{name}/{BASELINE}")
    return None if value is None else float(value)


def _goal(report: Mapping[str, Any], name: str) -> str:
    goal = report.get("goals", {}).get(name)
    if goal is None:
        return "-"
    return f"≥ {goal['target']:.2f}: {'pass' if goal['pass'] else 'FAIL'}"


def _share(figures: Mapping[str, Any]) -> str:
    share = figures.get("python_share")
    return "-" if share is None else f"{100 * share:.1f} %"


def _neighbours(report: Mapping[str, Any]) -> str:
    busiest = max(f.get("others_busy_max", 0.0) for f in report["configs"].values())
    text = f"The other cores were at most {100 * busiest:.0f} % busy during a timed run"
    if busiest > BUSY_NEIGHBOURS:
        text += " (they share caches and memory bandwidth: these figures are disturbed, run again on a quiet machine)"
    return text + "."


def render_table(report: Mapping[str, Any]) -> str:
    """A plain-text table for the terminal."""
    machine = report["machine"]
    lines = [
        f"python -m bench shards: {report['model']}, {report['tokens']} greedy tokens, median (min-max) of "
        f"{report['runs']} runs, 1 thread pinned to core {machine.get('pinned_core')}",
        f"{machine.get('cpu', '?')}; OpenVINO {machine.get('openvino', '?')}",
        "",
        f"{'config':<8} {'decode tok/s':>22} {'× mono':>7} {'ms/tok':>7} {'TTFT s':>7} {'python':>7}  goal",
    ]
    for name, figures in report["configs"].items():
        ratio = _ratio(report, name)
        speed = f"{_speed(figures['tok_s'])} ({_speed(figures['min'])}-{_speed(figures['max'])})"
        lines.append(
            f"{name:<8} {speed:>22} {'-' if ratio is None else f'{ratio:.3f}':>7} "
            f"{figures['ms_per_token']:>7.2f} {figures['ttft_s']:>7.3f} {_share(figures):>7}  {_goal(report, name)}"
        )
    precisions = [f"{name} {f['precision']}" for name, f in report["configs"].items() if f.get("precision")]
    if precisions:
        lines.append(f"decode precision (chosen by timing here): {', '.join(precisions)}")
    for pair, agreed in report.get("agreement", {}).items():
        first = agreed["first_difference"]
        lines.append(
            f"tokens {pair}: {agreed['same']}/{agreed['total']} identical"
            + ("" if first is None else f", first difference at token {first}")
        )
    lines.append(_neighbours(report))
    return "\n".join(lines)


def render_markdown(report: Mapping[str, Any], command: str) -> str:
    """A section for docs/benchmarks.md: date, command, machine, results table, goals."""
    machine = report["machine"]
    lines = [
        f"## {report['model']}: shards vs openvino_genai, {machine.get('date', '')}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('memory_gb', 0):.0f} GB RAM; OpenVINO {machine.get('openvino', '?')}, "
        f"openvino-genai {machine.get('openvino_genai', '?')}, optimum-intel {machine.get('optimum_intel', '?')}. "
        f"Every configuration runs in its own process ({report.get('workers', 'one process per run')}) pinned to "
        f"core {machine.get('pinned_core')} with `INFERENCE_NUM_THREADS=1`.",
        f"Prompt: {report.get('prompt_tokens', '?')} tokens, then {report['tokens']} greedy tokens (stop tokens "
        f"ignored), each timed run right after an untimed warm-up of {report.get('warmup_tokens', '?')} tokens; "
        f"{report['runs']} rounds, each running every configuration once, in rotated order. Decode tok/s "
        "excludes the first token; TTFT is reported apart. `mono` = `openvino_genai.LLMPipeline` (prefix "
        "caching off) on an optimum-intel export with the same int4 settings; `N-stage` = shoal stages chained "
        "in one process (`LocalPipeline`).",
        "",
        "| config | decode tok/s median | min | max | × mono | paired × mono (min-max) | best × mono | ms/token "
        "| TTFT s | Python share | goal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, figures in report["configs"].items():
        ratio = _ratio(report, name)
        paired = report.get("paired_ratios", {}).get(f"{name}/{BASELINE}")
        paired_text = "-" if paired is None else f"{paired['median']:.3f} ({paired['min']:.3f}-{paired['max']:.3f})"
        best = report.get("best_ratios", {}).get(f"{name}/{BASELINE}")
        lines.append(
            f"| {name} | {_speed(figures['tok_s'])} | {_speed(figures['min'])} | {_speed(figures['max'])} | "
            f"{'1.000' if name == BASELINE else '-' if ratio is None else f'{ratio:.3f}'} | {paired_text} | "
            f"{'-' if best is None else f'{best:.3f}'} | "
            f"{figures['ms_per_token']:.2f} | {figures['ttft_s']:.3f} | {_share(figures)} | {_goal(report, name)} |"
        )
    lines.append("")
    lines.append(
        "× mono: ratio of medians (what the goals use); paired: median of per-round ratios; best: ratio "
        "of the fastest runs (interference only slows runs down)."
    )
    lines.append("")
    for pair, agreed in report.get("agreement", {}).items():
        first = agreed["first_difference"]
        lines.append(
            f"- Greedy tokens {pair}: {agreed['same']}/{agreed['total']} identical"
            + ("." if first is None else f" (first difference at token {first}).")
        )
    shares = [(name, f) for name, f in report["configs"].items() if "python_share" in f]
    if shares:
        lines.append(
            "- Per decoded token, shoal configs: "
            + "; ".join(
                f"{name} {f['infer_ms_per_token']:.2f} ms in `InferRequest` calls (`set_input_tensor`, `infer`; "
                f"of which {f['binding_ms_per_token']:.2f} ms outside OpenVINO's own `latency`: input binding, "
                f"output dict), {f['python_ms_per_token']:.2f} ms in our Python; everything outside OpenVINO "
                f"{100 * f['outside_ov_share']:.1f} %"
                for name, f in shares
            )
            + "."
        )
    if "repeated_runs" in report:
        repeated = ", ".join(f"{name} {n}" for name, n in report["repeated_runs"].items() if n) or "none"
        lowest = ", ".join(f"{name} {f['cpu_share_min']:.2f}" for name, f in report["configs"].items())
        lines.append(
            f"- Runs repeated because another process took the core (CPU share below "
            f"{report.get('min_cpu_share', 0):.2f}): {repeated}. Lowest CPU share kept: {lowest}."
        )
    lines.append(f"- {_neighbours(report)}")
    lines.append("")
    return "\n".join(lines) + "\n"


def print_figures(report: Mapping[str, Any], as_json: bool) -> None:
    """A lab benchmark's flat figures: one JSON object, or one ``name value`` line each."""
    if as_json:
        print(json.dumps(report))
        return
    width = max(map(len, report), default=0) + 2
    for key, value in report.items():
        print(f"{key:<{width}} {value}")
