"""The benchmark harness: shoal against the baselines a user would pick instead, results for docs/benchmarks.md.

Run from a checkout with the ``[bench]`` extra: ``python -m bench ring|chat|shards ...``. It is a tool of ours
beside ``tests/``, not part of what a donor PC installs.
"""

import argparse
from pathlib import Path

from agent.errors import BenchError

__all__ = ["BenchError"]


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` (the report as one JSON object on stdout) and ``--markdown FILE`` (its section appended there)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--markdown", type=Path, default=None, help="append a results section to this file")


def select_configs(selected: str | None, known: tuple[str, ...]) -> tuple[str, ...]:
    """The configurations named in a comma-separated ``--configs`` value (all when empty), in ``known`` order."""
    if not selected:
        return known
    names = [n.strip() for n in selected.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(known)}")
    return tuple(n for n in known if n in names)
