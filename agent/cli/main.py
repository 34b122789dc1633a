"""``shoal``: one entry point, one subcommand per job.

Results go to stdout (the completion text, JSON); progress bars, logs and errors to stderr. Any
:class:`~agent.errors.ShoalError` ends in one line ``shoal: error: ...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from agent.cli.common import (
    EXPORT_MODULES,
    require_extra,
)
from agent.errors import ShoalError

log = logging.getLogger("shoal")


def default_cache_dir() -> Path:
    """Where models, compiled graphs and downloads are cached (``SHOAL_CACHE_DIR`` overrides)."""
    env = os.environ.get("SHOAL_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("shoal"))


def default_data_dir() -> Path:
    """Where fleet identities and agent state live (``SHOAL_DATA_DIR`` overrides)."""
    env = os.environ.get("SHOAL_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("shoal"))


def build_parser() -> argparse.ArgumentParser:
    """shoal's command line: the global options here, each command's parser declared by its own module."""
    parser = argparse.ArgumentParser(prog="shoal", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache folder (default: platform cache)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action=_Version, help="print shoal's version and exit")
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="write the log to this file instead of stderr (and stdout too where there is no console: pythonw)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    from agent.cli import (
        agent_cmd,
        ask_cmd,
        chat_cmd,
        demo_cmd,
        doctor_cmd,
        export_cmd,
        fleet_cmd,
        generate_cmd,
        join_cmd,
        plan_cmd,
        publish_cmd,
        service_cmd,
        status_cmd,
    )

    for command in (export_cmd, generate_cmd, demo_cmd, agent_cmd, ask_cmd, doctor_cmd, status_cmd):
        command.add_parser(sub)
    plan_cmd.add_parser(sub, fleet=fleet_cmd.add_parser(sub))
    for command in (publish_cmd, chat_cmd, service_cmd, join_cmd):
        command.add_parser(sub)
    p = sub.add_parser("bench", help="measure this PC (the benchmark harness is python -m bench, beside tests/)")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("stages", help="each stage's decode time back to back, beside the split planner's estimate")
    from agent.measure.stages import add_arguments as add_stages_arguments

    add_stages_arguments(b)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(
        logging.DEBUG if args.verbose else logging.INFO if args.command == "agent" else logging.WARNING, args.log_file
    )
    cache_dir = args.cache_dir or default_cache_dir()
    return run_reporting_errors("shoal", lambda: _run_command(args, cache_dir))


def _run_command(args: argparse.Namespace, cache_dir: Path) -> int:
    if args.command == "export":
        require_extra("shoal export", "export", EXPORT_MODULES)
        from agent.cli.export_cmd import run_export

        return run_export(args, cache_dir)
    if args.command == "generate":
        from agent.cli.generate_cmd import run_generate

        return run_generate(args, cache_dir, default_data_dir())
    if args.command == "demo":
        require_extra("shoal demo (it exports the demo model)", "export", EXPORT_MODULES)
        from agent.cli.demo_cmd import DEFAULT_PROMPT, run_demo

        args.prompt = args.prompt or DEFAULT_PROMPT
        return run_demo(args, cache_dir, default_data_dir())
    if args.command == "agent":
        from agent.cli.agent_cmd import run_agent

        return run_agent(args, cache_dir, default_data_dir())
    if args.command == "ask":
        from agent.cli.ask_cmd import run_ask

        return run_ask(args, default_data_dir())
    if args.command == "chat":
        from agent.cli.chat_cmd import run_chat

        return run_chat(args, default_data_dir())
    if args.command == "doctor":
        from agent.cli.doctor_cmd import run_doctor

        return run_doctor(args, default_data_dir())
    if args.command == "status":
        from agent.cli.status_cmd import run_status

        return run_status(args, default_data_dir())
    if args.command in ("pin", "unpin", "pins") or (args.command == "fleet" and args.fleet_command == "serve"):
        from agent.cli.plan_cmd import run_plan_command

        return run_plan_command(args, default_data_dir())
    if args.command == "publish":
        from agent.cli.publish_cmd import run_publish

        return run_publish(args)
    if args.command == "fleet":
        from agent.cli.fleet_cmd import run_fleet

        return run_fleet(args, default_data_dir())
    if args.command == "join":
        from agent.cli.join_cmd import run_join

        return run_join(args, default_data_dir())
    if args.command == "service":
        from agent.cli.service_cmd import run_service

        return run_service(args, default_data_dir())
    if args.command == "bench":
        from agent.measure.stages import run_bench_stages

        return run_bench_stages(args, cache_dir)
    return 2


class _Version(argparse.Action):
    """``shoal --version``: the installed distribution's version, read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help")))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version("shoal")
        except importlib.metadata.PackageNotFoundError:
            version = "0+unknown (not installed)"
        print(f"shoal {version}")
        parser.exit()


LOG_ROTATE_BYTES = 10 * 1024 * 1024
"""A log file (``--log-file``) larger than this at start is moved to ``FILE.1`` (the one before is dropped)."""


def configure_logging(level: int, log_file: Path | None = None) -> None:
    """One log line per event on stderr (or ``log_file``), the ML libraries kept quiet."""
    stream = sys.stderr
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        if log_file.exists() and log_file.stat().st_size > LOG_ROTATE_BYTES:
            log_file.replace(log_file.with_name(log_file.name + ".1"))
        stream = open(log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (the process's log, open until exit)
        # pythonw (the Windows service) has no stdout or stderr: prints and tracebacks go to the log as well
        sys.stdout = sys.stdout or stream
        sys.stderr = sys.stderr or stream
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=stream)
    quiet_libraries()


def run_reporting_errors(prog: str, job: Callable[[], int]) -> int:
    """Run ``job``; a :class:`ShoalError` ends in one line ``PROG: error: ...`` and status 1, Ctrl-C in 130."""
    try:
        return job()
    except ShoalError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def quiet_libraries() -> None:
    """Keep the ML libraries' warnings and progress chatter off the terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # nncf sets its logger's level when imported: the export hands that logger to ours (shards/export/convert.py)
    for name in ("transformers", "optimum", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")


if __name__ == "__main__":
    sys.exit(main())
