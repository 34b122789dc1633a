"""``python -m bench plot-users RESULT.json --out docs/benchmarks/users.svg``: the curve of aggregate tok/s against
users, one line per configuration of a ``python -m bench ring --users`` run (issue 45).

RESULT.json is that run's report (what ``--json`` prints, or ``report.json`` in its logs) or its raw, possibly
partial, ``results.json``. ``cb`` (openvino_genai's continuous batching, measured at every number of users) is a
curve like the rings'; ``mono`` (one user on one core) is a horizontal line, with the issue's goals for 8 and 16
users (4x and 6x ``mono``) marked where the run measured them. The image's format follows ``--out``'s suffix
(SVG, PNG, PDF); an SVG keeps its text as text and carries no date, so the same results give the same file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import BenchError
from bench.ring_users import GOALS_X_MONO, build_users_report

BASELINE_STYLE: dict[str, dict[str, Any]] = {"cb": {"linestyle": "--", "color": "black"}}
"""The baselines' curves stand apart from the rings'."""


def users_curves(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Per configuration, (users, median aggregate tok/s) in order of users; cells without a figure are left out."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for count in sorted(report["cells"], key=int):
        for config, figures in report["cells"][count].items():
            if figures.get("tok_s") is not None:
                curves.setdefault(config, []).append((int(count), float(figures["tok_s"])))
    return curves


def load_report(path: Path) -> dict[str, Any]:
    """The users report in ``path``: a report as it is, raw results built into one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot read {path} as JSON ({exc})") from exc
    if not isinstance(data, dict) or not ("cells" in data or "runs" in data):
        raise BenchError(f"{path} holds no `python -m bench ring --users` results (no cells, no runs)")
    return data if "cells" in data else build_users_report(data)


def plot_users(report: dict[str, Any], out: Path) -> None:
    """Draw ``report``'s curves into ``out``."""
    try:
        import matplotlib
    except ImportError as exc:
        raise BenchError("plotting needs matplotlib: pip install 'shoal[bench]'") from exc
    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    curves = users_curves(report)
    if not curves:
        raise BenchError("the results hold no figures to plot")
    mono = dict(curves.pop("mono", [])).get(1)
    counts = sorted({users for points in curves.values() for users, _ in points} | {1})
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "shoal"}):
        figure, axes = plt.subplots(figsize=(8.5, 4.5))
        for config, points in curves.items():
            xs, ys = zip(*points, strict=True)
            axes.plot(xs, ys, marker="o", label=config, **BASELINE_STYLE.get(config, {}))
        if mono is not None:
            axes.axhline(mono, color="grey", linestyle=":", label="mono (1 user, 1 core)")
            goals = [(int(users), share * mono) for users, share in GOALS_X_MONO.items() if int(users) in counts]
            if goals:
                xs, ys = zip(*goals, strict=True)
                axes.plot(xs, ys, linestyle="none", marker="_", markersize=18, color="grey", label="goal (× mono)")
        axes.set_xscale("log", base=2)
        axes.set_xticks(counts, [str(c) for c in counts])
        axes.set_xlabel("users")
        axes.set_ylabel("aggregate tok/s (medians)")
        axes.set_ylim(bottom=0)
        axes.set_title(_title(report))
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves
        figure.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out, metadata={"Date": None} if out.suffix.lower() == ".svg" else None)
        plt.close(figure)


def _title(report: dict[str, Any]) -> str:
    settings = report.get("settings") or {}
    setup = (settings.get("setups") or [{}])[0]
    parts = [str(setup["model"])] if setup.get("model") else []
    if setup.get("stages"):
        parts.append(f"{setup['stages']} stages")
    if settings.get("tokens"):
        parts.append(f"{settings['tokens']} tokens per user")
    return "Many users at once" + (f": {', '.join(parts)}" if parts else "")


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench plot-users``."""
    b.add_argument("results", type=Path, help="the report (--json, report.json) or raw results.json of a --users run")
    b.add_argument("--out", type=Path, required=True, help="the image to write (.svg, .png or .pdf)")


def run_plot_users(args: argparse.Namespace) -> int:
    """Read the results, write the image."""
    plot_users(load_report(args.results), args.out)
    print(args.out)
    return 0
