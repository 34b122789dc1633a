"""Small things several subcommands share."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeAlias

from agent.errors import FleetError, MissingExtraError

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns: each command's module adds its parser to it (``add_parser(sub)``)."""

REWIND_HELP = (
    "how stages forget rejected drafts: mask them out (free; exact in f32) or cut them out of the KV "
    "cache (a copy; exact on one thread in every precision); auto: cut where that makes speculative "
    "greedy equal plain greedy (default)"
)
PREFILL_ATTENTION_HELP = (
    "what prompts attend through on the CPU: paged (a PagedAttention compilation, about twice as fast on long "
    "prompts, a second copy of the stage's weights in memory; default) or sdpa (the decode compilation)"
)
FAST_PREFILL_HELP = (
    "int4/int8 on a CPU computing in bf16: prompts in its default precision on their paged compilation (on a "
    "Xeon with AMX several times faster than the decode's f32 activations; default), or, with --no-fast-prefill, "
    "in f32 activations like decoding"
)


def identity_dir(explicit: Path | None, data_dir: Path) -> Path:
    """The node identity folder: the one given, or the only one issued under the data dir."""
    if explicit is not None:
        return explicit
    found = sorted((data_dir / "fleet" / "nodes").glob("*/cert.pem"))
    if len(found) != 1:
        raise FleetError("pass --identity DIR (the node folder made by `shoal fleet issue NODE`)")
    return found[0].parent


def layer_counts(text: str) -> tuple[int, ...]:
    """An argparse type: ``18,10`` is 18 layers on stage 0 and 10 on stage 1."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer counts such as 18,10, not {text!r}") from None


def core_list(text: str) -> list[int]:
    """``N[,N...]`` -> CPU core numbers (argparse type)."""
    try:
        cores = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of core numbers") from exc
    if not cores or any(core < 0 for core in cores):
        raise argparse.ArgumentTypeError(f"{text!r} names no core")
    return cores


EXPORT_MODULES = ("torch", "transformers", "nncf", "optimum.intel", "gguf")
"""What ``shoal export`` imports beyond a donor's install (the ``export`` extra)."""


def require_extra(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """Raise :class:`MissingExtraError` naming the extra to install when one of ``modules`` is missing."""
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a missing parent package of a dotted name
            found = False
        if not found:
            raise MissingExtraError(what, extra, name)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[threading.Event]:
    """While it lasts, SIGTERM ends the process as Ctrl-C does, through an exception, so that cleanup runs
    (an export's unfinished ``OUT.incomplete`` folder is removed) instead of the process dying where it is.

    Yields an event that is set once SIGTERM came: a handler that runs inside a finalizer (a ``__del__`` during
    a garbage collection) has its exception swallowed by Python, so long work checks the event as well."""
    terminated = threading.Event()

    def stop(signum: int, frame: object) -> None:
        terminated.set()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous)
