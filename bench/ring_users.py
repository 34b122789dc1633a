"""``python -m bench ring --users N ...``: many users on one ring, its agents packing their steps or not (issue 45).

Rings of the same export are up side by side, their agents configured by a file (``--config``): ``pp`` and
``pp+sd``, agents that keep each session's KV in its own state and compute one step at a time (``pack_budget =
0``); ``packed`` and ``packed+sd``, agents that keep their sessions' KV in one paged pool (``kv = "paged"``) and
pack the ready steps of their sessions (the default budget); ``paged``, paged KV without packing (packing on vs off
on the same KV); ``packed+2ms``, packing agents that, idle, wait 2 ms after a step for others to pack with. Each is
``python -m bench ring`` 's ring (:class:`bench.ring_bench.Ring`): the head holds stage 0 in this process on its
own core, the other stages are ``shoal agent`` processes on the agents' core, a delay proxy (0 ms) in front of
each. Only the agents' stages pack: the head computes each of its users' stage-0 steps on its own, one after
another, so it paces what reaches the agents. With ``--stageless-head`` an agent serves stage 0 too, pinned to the
head's core, and every stage packs.

For each number of users, rounds run every configuration in a rotated order (``mono``: openvino_genai serving
one user on the head's core; ``cb``: openvino_genai's ``ContinuousBatchingPipeline`` serving the N users in one
process on the head's and the agents' cores, :mod:`bench.cb_baseline`). N users each decode the same prompt,
concurrently: the aggregate tok/s (tokens after the last user's first token, over the time from then to the last
token), each user's tok/s, the time to first token, and the p50 / p99 of the time between a user's tokens. The
load average is read before and after each run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import Any

from agent.node.config import AgentConfig
from bench import BenchError, select_configs
from bench.agents import bench_dirs
from bench.cb_baseline import SCHEDULER, CbRun, CbSpec, CbWorker
from bench.ring_bench import (
    WARMUP_PROMPT_TOKENS,
    Ring,
    RingRun,
    RingSettings,
    _mono_run,
    _progress,
    _prompt_ids,
    _settings_json,
    _stop_on_sigterm,
    prepare_exports,
    publish,
)
from bench.shards_bench import command_line, describe_machine, rotation, slug

USER_CONFIGS = ("mono", "cb", "pp", "pp+sd", "paged", "packed", "packed+sd", "packed+2ms")
DEFAULT_USER_CONFIGS = "pp,pp+sd,packed"
AGENT_SETTINGS = {
    "state": "pack_budget = 0\n",
    "paged": 'kv = "paged"\npack_budget = 0\n',
    "packed": 'kv = "paged"\n',
    "packed+2ms": 'kv = "paged"\npack_window = 0.002\n',
}
"""The agent config file of each ring."""

HEAD_SETTINGS = {
    "state": ("state", False),
    "paged": ("paged", False),
    "packed": ("paged", True),
    "packed+2ms": ("paged", True),
}
"""Each ring's head, when it holds stage 0: where that stage keeps its sessions' KV, and whether the head packs its
users' steps there (``agent.head.local_packer``), as the ring's agents do."""
RING_OF = {
    "pp": "state",
    "pp+sd": "state",
    "paged": "paged",
    "packed": "packed",
    "packed+sd": "packed",
    "packed+2ms": "packed+2ms",
}
SPECULATES = frozenset({"pp+sd", "packed+sd"})


def run_users(args: argparse.Namespace, cache_dir: Path) -> int:
    """Bring both rings up, measure every number of users, report."""
    users = sorted(set(args.users))
    if users[0] < 1:
        raise BenchError("--users counts users: 1 or more")
    configs = select_configs(args.configs or DEFAULT_USER_CONFIGS, USER_CONFIGS)
    baseline = "mono" in configs or "cb" in configs  # both run the optimum-intel export
    ring_configs = ",".join(["mono"] * baseline + ["pp"] + ["pp+sd"] * any(c in SPECULATES for c in configs))
    settings = RingSettings.from_args(argparse.Namespace(**{**vars(args), "configs": ring_configs}))
    if len(settings.setups) != 1:
        raise BenchError("--users measures one setup: give --model and one --stages")
    if settings.drafter == "best":
        settings = dataclasses.replace(settings, drafter="ngram")  # no pilot: one drafter for every user count
    setup = settings.setups[0]
    _stop_on_sigterm()
    exports = prepare_exports(settings, cache_dir)[setup]
    os.sched_setaffinity(0, {settings.head_core})  # before OpenVINO is loaded here
    fleet_dir, log_dir = bench_dirs(cache_dir, "ring-users-logs")
    prompt_ids = _prompt_ids(exports.ring, settings.prompt, settings.tokens)
    cb_cores = sorted({settings.head_core, *settings.agent_cores})
    baselines = Baselines(exports.mono, cache_dir / "bench" / slug(setup.model) / "ov-cache")
    rings: dict[str, Ring] = {}
    for name, text in AGENT_SETTINGS.items():
        if any(RING_OF.get(c) == name for c in configs):
            folder = log_dir / name
            folder.mkdir()
            # every user is a session on every agent: room for the most users of any run (the agents' default 8)
            (folder / "agent.toml").write_text(text + f"max_sessions = {max(AgentConfig.max_sessions, *users)}\n")
            extra = ("--config", str(folder / "agent.toml"))
            rings[name] = Ring(
                setup,
                exports,
                settings,
                cache_dir,
                fleet_dir,
                folder,
                extra,
                users=max(users),
                head_stage=not args.stageless_head,
                head_kv=HEAD_SETTINGS[name][0],
                head_packs=HEAD_SETTINGS[name][1],
            )
    raw: dict[str, Any] = {
        "settings": {
            **_settings_json(settings),
            "users": users,
            "configs": list(configs),
            "stageless_head": args.stageless_head,
            **({"cb": {"scheduler": SCHEDULER, "cores": cb_cores}} if "cb" in configs else {}),
        },
        "machine": describe_machine(settings.head_core),
        "prompt_tokens": len(prompt_ids),
        "runs": {},
    }
    _progress(f"logs and results in {log_dir}")
    try:
        for ring in rings.values():
            ring.start_processes()
        if "cb" in configs:
            if exports.mono is None:
                raise BenchError("cb needs the optimum-intel export")
            _progress(f"cb: loading ContinuousBatchingPipeline on cores {cb_cores}")
            spec = CbSpec(
                model_dir=str(exports.mono),
                prompt_ids=prompt_ids,
                tokens=settings.tokens,
                warmup_tokens=settings.warmup_tokens,
                cores=cb_cores,
                warmup_prompt_tokens=WARMUP_PROMPT_TOKENS,
                ov_cache_dir=str(baselines.ov_cache),
            )
            baselines = dataclasses.replace(baselines, cb=CbWorker(spec))
        asyncio.run(_measure(rings, baselines, settings, configs, users, prompt_ids, raw, log_dir / "results.json"))
    finally:
        for ring in rings.values():
            ring.stop_processes()
        if baselines.cb is not None:
            baselines.cb.close()
    report = build_users_report(raw)
    return publish(args, log_dir, report, render_users_table(report), render_users_markdown(report, command_line()))


@dataclasses.dataclass(frozen=True)
class Baselines:
    """What the rings are compared with: ``mono``'s export (a fresh process per run) and ``cb``'s process."""

    mono: Path | None
    ov_cache: Path
    cb: CbWorker | None = None


async def _measure(
    rings: dict[str, Ring],
    baselines: Baselines,
    settings: RingSettings,
    configs: tuple[str, ...],
    users: list[int],
    prompt_ids: list[int],
    raw: dict[str, Any],
    partial: Path,
) -> None:
    loop = asyncio.get_running_loop()
    try:
        for ring in rings.values():
            await ring.connect()
        for count in users:
            chosen = tuple(c for c in configs if c != "mono" or count == 1)
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in chosen}
            raw["runs"][str(count)] = runs
            for round_index in range(settings.runs):
                for config in rotation(chosen, round_index):
                    load_before = os.getloadavg()[0]
                    packing: dict[str, float] = {}
                    if config == "mono":
                        if baselines.mono is None:
                            raise BenchError("mono needs the optimum-intel export")
                        done: RingRun = await loop.run_in_executor(
                            None, _mono_run, baselines.mono, prompt_ids, settings.tokens, settings, baselines.ov_cache
                        )
                    elif config == "cb":
                        assert baselines.cb is not None  # run_users started it: cb is among the configurations
                        cb_run = await loop.run_in_executor(None, baselines.cb.run, count)
                        done = cb_ring_run(cb_run)
                        packing = {"cb_steps": float(cb_run.steps), "cb_max_cache_usage": cb_run.max_cache_usage}
                    else:
                        ring = rings[RING_OF[config]]
                        kind = settings.drafter if config in SPECULATES else None
                        name = "pp+sd" if kind else "pp"
                        warm = prompt_ids[:WARMUP_PROMPT_TOKENS]
                        await ring.generate(name, 0.0, settings.warmup_tokens, kind, warm, users=count)
                        before = await _packing(ring)
                        done = await ring.generate(name, 0.0, settings.tokens, kind, prompt_ids, users=count)
                        after = await _packing(ring)
                        packing = {k: after[k] - before[k] for k in after}
                        done.config = config
                    run = {
                        **dataclasses.asdict(done),
                        **packing,
                        "load_before": load_before,
                        "load_after": os.getloadavg()[0],
                    }
                    runs[config].append(run)
                    partial.write_text(json.dumps(raw, default=str))
                    _progress(
                        f"{count} user(s) round {round_index + 1}/{settings.runs} {config:<9} "
                        f"{done.tok_s:7.2f} tok/s, per user {_text(done.per_user_tok_s)}, TTFT "
                        f"{statistics.fmean(done.ttft_s):.3f} s, gap p50/p99 {_ms(done.gap_p50_s)}/"
                        f"{_ms(done.gap_p99_s)} ms, {_packed_text(packing)}load {load_before:.1f}-"
                        f"{run['load_after']:.1f}"
                    )
    finally:
        for ring in rings.values():
            with contextlib.suppress(Exception):
                await ring.close()


def cb_ring_run(run: CbRun) -> RingRun:
    """A ``cb`` run as the record of a ring run (its figures measured the same way)."""
    figures = run.figures
    return RingRun(
        config="cb",
        latency_ms=0.0,
        tokens=run.tokens,
        tok_s=figures.tok_s,
        per_user_tok_s=figures.per_user_tok_s,
        ttft_s=figures.ttft_s,
        window_s=figures.window_s,
        window_tokens=figures.window_tokens,
        steps=run.steps,
        drafted=0,
        accepted=0,
        k_chosen=[],
        drafter=None,
        cpu_share=run.cpu_share,
        gap_p50_s=figures.gap_p50_s,
        gap_p99_s=figures.gap_p99_s,
    )


async def _packing(ring: Ring) -> dict[str, float]:
    """The agents' packs and the steps they held, and the head's on its own stage 0, so far (a run's are the
    difference)."""
    statuses = await asyncio.gather(*(link.get() for link in ring.status_links))
    return {
        "agent_packs": float(sum(s.get("packs", 0) for s in statuses)),
        "agent_packed_steps": float(sum(s.get("packed_steps", 0) for s in statuses)),
        "head_packs": float(ring.client.local.packs),
        "head_packed_steps": float(ring.client.local.packed_steps),
    }


def _packed_text(packing: dict[str, float]) -> str:
    text = ""
    if packing.get("head_packs"):
        text += f"head's steps per pack {packing['head_packed_steps'] / packing['head_packs']:.2f}, "
    if packing.get("agent_packs"):
        text += f"agents' steps per pack {packing['agent_packed_steps'] / packing['agent_packs']:.2f}, "
    return text


def _text(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


# -- the report ------------------------------------------------------------------------------------
def users_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of one configuration at one number of users."""

    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {
        "runs": len(runs),
        "tok_s": median("tok_s"),
        "tok_s_runs": [round(r["tok_s"], 2) for r in runs],
        "per_user_tok_s": statistics.median(statistics.fmean(r["per_user_tok_s"]) for r in runs),
        "per_user_min": min(min(r["per_user_tok_s"]) for r in runs),
        "ttft_s": statistics.median(statistics.fmean(r["ttft_s"]) for r in runs),
        "gap_p50_s": median("gap_p50_s"),
        "gap_p99_s": median("gap_p99_s"),
        "load": [min(r["load_before"] for r in runs), max(r["load_after"] for r in runs)],
        "steps_per_pack": (
            sum(r.get("agent_packed_steps", 0) for r in runs) / packs
            if (packs := sum(r.get("agent_packs", 0) for r in runs))
            else None
        ),
        "same_tokens": all(t == runs[0]["tokens"][0] for r in runs for t in r["tokens"]),
    }


def build_users_report(raw: dict[str, Any]) -> dict[str, Any]:
    cells = {
        count: {config: users_figures(runs) for config, runs in by_config.items() if runs}
        for count, by_config in raw["runs"].items()
    }
    ratios: dict[str, dict[str, float | None]] = {}
    for count, figures in cells.items():
        ratio = {}
        for packed, plain in (
            ("packed", "pp"),
            ("packed+sd", "pp+sd"),
            ("packed", "paged"),
            ("packed+2ms", "packed"),
            ("packed", "cb"),
            ("packed+sd", "cb"),
            ("pp", "cb"),
        ):
            if packed in figures and plain in figures and figures[plain]["tok_s"]:
                ratio[f"{packed}/{plain}"] = figures[packed]["tok_s"] / figures[plain]["tok_s"]
        mono = cells.get("1", {}).get("mono")
        for config, cell in figures.items():
            if mono and mono["tok_s"] and config != "mono":
                ratio[f"{config}/mono(1 user)"] = cell["tok_s"] / mono["tok_s"]
        ratios[count] = ratio
    return {
        "settings": raw["settings"],
        "machine": raw["machine"],
        "cells": cells,
        "ratios": ratios,
        "goals": users_goals(cells),
    }


GOALS_X_MONO = {"8": 4.0, "16": 6.0}
"""Issue 45: N users on the ring at least this many times ``mono`` serving one user on one core."""
PACKING_PAIRS = (("packed", "pp"), ("packed+sd", "pp+sd"))
"""Packing on against off on the same kind of steps."""
PACKING_GAIN_8 = 2.5
PACKING_ALONE = 0.97
GAP_P99_GROWTH_8 = 3.0
"""p99 time between tokens with 8 users at most this many times the 1-user figure."""


def users_goals(cells: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Issue 45's goals over the cells a run measured (a goal whose cells are missing is left out): each with its
    ratio, its target, whether the ratio must reach it (``at_most`` false) or stay below it, and pass."""
    goals: dict[str, dict[str, Any]] = {}

    def ratio(name: str, top: dict[str, Any] | None, bottom: dict[str, Any] | None, key: str, target: float) -> None:
        if top and bottom and top.get(key) is not None and bottom.get(key):
            value = top[key] / bottom[key]
            at_most = key.startswith("gap")
            goals[name] = {
                "ratio": value,
                "target": target,
                "at_most": at_most,
                "pass": value <= target if at_most else value >= target,
            }

    mono = cells.get("1", {}).get("mono")
    for packed, plain in PACKING_PAIRS:
        for count, target in GOALS_X_MONO.items():
            ratio(f"{packed}, {count} users / mono", cells.get(count, {}).get(packed), mono, "tok_s", target)
        eight, one = cells.get("8", {}), cells.get("1", {})
        ratio(f"{packed}/{plain}, 8 users", eight.get(packed), eight.get(plain), "tok_s", PACKING_GAIN_8)
        ratio(f"{packed}/{plain}, 1 user", one.get(packed), one.get(plain), "tok_s", PACKING_ALONE)
        ratio(f"{packed} p99 gap, 8 users / 1 user", eight.get(packed), one.get(packed), "gap_p99_s", GAP_P99_GROWTH_8)
    return goals


def goal_text(name: str, goal: dict[str, Any]) -> str:
    """``name: 1.23x (>= 2.50x) FAIL``; a ratio that rounds onto its target is shown to three places, so that a
    FAIL never reads as equal."""
    places = 3 if round(goal["ratio"], 2) == round(goal["target"], 2) else 2
    bound = "<=" if goal["at_most"] else ">="
    return f"{name}: {goal['ratio']:.{places}f}x ({bound} {goal['target']:.2f}x) {'pass' if goal['pass'] else 'FAIL'}"


def render_users_table(report: dict[str, Any]) -> str:
    header = (
        f"{'users':>5} {'config':<10} {'tok/s':>7} {'per user':>8} {'TTFT s':>7} {'gap p50':>8} {'gap p99':>8}"
        f" {'load':>9} {'steps/pack':>10}  same tokens"
    )
    lines = [header]
    for count, figures in report["cells"].items():
        for config, f in figures.items():
            lines.append(
                f"{count:>5} {config:<10} {f['tok_s']:7.2f} {f['per_user_tok_s']:8.2f} {f['ttft_s']:7.3f} "
                f"{_ms(f['gap_p50_s']):>8} {_ms(f['gap_p99_s']):>8} {f['load'][0]:4.1f}-{f['load'][1]:<4.1f} "
                f"{'-' if f['steps_per_pack'] is None else format(f['steps_per_pack'], '.2f'):>10}  "
                f"{'yes' if f['same_tokens'] else 'NO'}"
            )
        ratio = report["ratios"].get(count)
        if ratio:
            lines.append("      " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items() if v is not None))
    lines += ["goals: " + goal_text(name, goal) for name, goal in report.get("goals", {}).items()]
    return "\n".join(lines)


def render_users_markdown(report: dict[str, Any], command: str) -> str:
    settings = report["settings"]
    setup = settings["setups"][0]
    return "\n".join(
        [
            f"## Many users on one ring: {setup['model']}, {setup['stages']} stages (issue 45)",
            "",
            f"`{command}` — {settings['tokens']} greedy tokens per user, {settings['runs']} rounds; the head "
            f"({'no stage' if settings['stageless_head'] else 'stage 0'}, all users) on core {settings['head_core']}"
            f"{', with the agent of stage 0' if settings['stageless_head'] else ''}, the other agents on "
            f"{settings['agent_cores']}; "
            + (
                f"cb = openvino_genai's ContinuousBatchingPipeline on cores {cb['cores']}, one thread each, "
                f"SchedulerConfig {', '.join(f'{k}={v}' for k, v in cb['scheduler'].items())} (cache_size in GB); "
                if (cb := settings.get("cb"))
                else ""
            )
            + "gap = time between "
            "a user's consecutive tokens; load = the load average before the first and after the last run.",
            "",
            "```",
            render_users_table(report),
            "```",
            "",
        ]
    )
