"""The benchmark harness: shoal against the baselines a user would pick instead, results for docs/benchmarks.md.

Run from a checkout with the ``[bench]`` extra: ``python -m bench ring|chat|shards ...``. It is a tool of ours
beside ``tests/``, not part of what a donor PC installs.
"""

from agent.errors import BenchError

__all__ = ["BenchError"]


def select_configs(selected: str | None, known: tuple[str, ...]) -> tuple[str, ...]:
    """The configurations named in a comma-separated ``--configs`` value (all when empty), in ``known`` order."""
    if not selected:
        return known
    names = [n.strip() for n in selected.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise BenchError(f"unknown configuration(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(known)}")
    return tuple(n for n in known if n in names)
