"""Benchmarks whose results go into docs/benchmarks.md (``shoal bench ...``)."""

from agent.errors import ShoalError


class BenchError(ShoalError):
    """A benchmark step (an export or a measured run) failed."""


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
