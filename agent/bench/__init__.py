"""Benchmarks whose results go into docs/benchmarks.md (``shoal bench ...``)."""

from shards.errors import ShoalError


class BenchError(ShoalError):
    """A benchmark step (an export or a measured run) failed."""


__all__ = ["BenchError"]
