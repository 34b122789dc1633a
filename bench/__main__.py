"""``python -m bench``: the benchmark harness (results for docs/benchmarks.md).

Run from a checkout with the ``[bench]`` extra installed. ``shoal bench stages`` (one PC's stage timings,
for choosing a split) is part of the product; everything here compares shoal with other systems.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from agent.cli.main import configure_logging, default_cache_dir, run_reporting_errors
from bench import add_report_arguments


def build_parser() -> argparse.ArgumentParser:
    """The harness's command line: one subcommand per benchmark."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache folder (default: platform cache)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    bench = parser.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("shards", help="openvino_genai baseline vs 1/2/3 in-process stages, one thread each")
    b.add_argument("--model", default="smollm2", help="SOURCE to benchmark (default smollm2)")
    b.add_argument("--runs", type=int, default=5)
    b.add_argument("--tokens", type=int, default=128)
    add_report_arguments(b)
    b.add_argument("--configs", default=None, help="comma-separated subset of mono,1-stage,2-stage,3-stage")
    b.add_argument("--core", type=int, default=None, help="CPU core every run is pinned to (default: the last)")
    b.add_argument("--prompt", default=None, help="user message (default: a fixed coding question)")
    b.add_argument(
        "--warmup-tokens", type=int, default=None, help="untimed tokens right before each run (default: --tokens)"
    )
    b.add_argument(
        "--min-cpu-share",
        type=float,
        default=None,
        help="repeat a run whose CPU time / wall time falls below this (default 0.95; 0 never)",
    )
    b.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="before each run, wait up to SECONDS for the other cores to be idle (default 0)",
    )
    b.add_argument(
        "--resident-workers",
        action="store_true",
        help="one process per configuration serving all its runs, instead of a fresh one per run",
    )
    b = bench.add_parser(
        "ring", help="the ring of one-thread agents (pp, speculation, 2 users, added latency) vs openvino_genai"
    )
    from bench.ring_bench import add_arguments

    add_arguments(b)
    b = bench.add_parser(
        "chat",
        help="a conversation through a chat agent that keeps sessions between turns, "
        "beside one that starts every turn afresh",
    )
    from bench.chat_bench import add_arguments as add_chat_arguments

    add_chat_arguments(b)
    b = bench.add_parser("fleet", help="a fleet forming and noticing losses, in a lab of network namespaces (root)")
    from bench.fleet_bench import add_arguments as add_fleet_arguments

    add_fleet_arguments(b)
    b = bench.add_parser("plan", help="a fleet forming its ring from an office mirror, in a lab of namespaces (root)")
    from bench.plan_bench import add_arguments as add_plan_arguments

    add_plan_arguments(b)
    b = bench.add_parser("tui", help="an answer through the TUI beside shoal ask: tokens/s, key latency, CPU")
    from bench.tui_bench import add_arguments as add_tui_arguments

    add_tui_arguments(b)
    b = bench.add_parser(
        "prefill", help="time to the first token of long prompts: shoal (1 stage, rings) vs openvino_genai and torch"
    )
    from bench.prefill_bench import add_arguments as add_prefill_arguments

    add_prefill_arguments(b)
    b = bench.add_parser(
        "donor", help="a CPU-bound task alone and beside an agent serving chats as a donor's (nice 19, SCHED_IDLE)"
    )
    from bench.donor_bench import add_arguments as add_donor_arguments

    add_donor_arguments(b)
    b = bench.add_parser(
        "soak", help="a fleet of real agents serving many requests of three clients, leaks measured; --chaos: faults"
    )
    from bench.soak_bench import add_arguments as add_soak_arguments

    add_soak_arguments(b)
    b = bench.add_parser(
        "plot-users", help="the curve of aggregate tok/s against users of a `ring --users` run, as an image"
    )
    from bench.users_plot import add_arguments as add_plot_arguments

    add_plot_arguments(b)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark; a :class:`ShoalError` ends in one line and exit status 1."""
    args = build_parser().parse_args(argv)
    configure_logging(logging.DEBUG if args.verbose else logging.WARNING)
    cache_dir = args.cache_dir or default_cache_dir()
    return run_reporting_errors("bench", lambda: _run_bench(args, cache_dir))


def _run_bench(args: argparse.Namespace, cache_dir: Path) -> int:
    if args.bench == "ring":
        from bench.ring_bench import run_bench_ring

        return run_bench_ring(args, cache_dir)
    if args.bench == "fleet":
        from bench.fleet_bench import run_fleet_bench

        return run_fleet_bench(args)
    if args.bench == "plan":
        from bench.plan_bench import run_plan_bench

        return run_plan_bench(args, cache_dir)
    if args.bench == "tui":
        from bench.tui_bench import run_tui_bench

        return run_tui_bench(args, cache_dir)
    if args.bench == "donor":
        from bench.donor_bench import run_donor_bench

        return run_donor_bench(args, cache_dir)
    if args.bench == "prefill":
        from bench.prefill_bench import run_bench_prefill

        return run_bench_prefill(args, cache_dir)
    if args.bench == "soak":
        from bench.soak_bench import run_soak_bench

        return run_soak_bench(args, cache_dir)
    if args.bench == "plot-users":
        from bench.users_plot import run_plot_users

        return run_plot_users(args)
    if args.bench == "chat":
        from bench.chat_bench import run_bench_chat

        return run_bench_chat(args, cache_dir)
    from bench.shards_bench import run_bench_shards

    return run_bench_shards(args, cache_dir)


if __name__ == "__main__":
    sys.exit(main())
