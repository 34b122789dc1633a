"""A donor's agent as a background citizen: the lowest CPU priority, idle I/O, and a cap on inference threads.

A donor PC serves while its owner is away, but the owner's own programs (a build left running, a backup, a
sync) must never wait for shoal. So a donor's agent lowers itself once, at start, before any thread exists:

- CPU: ``nice 19`` for the whole process (every thread inherits it); on Linux also ``SCHED_IDLE`` for the threads
  that run OpenVINO (:func:`idle_thread`, the initializer of the executor they run in: the plugin's own worker
  threads, created from those, inherit it), so that inference runs only on CPU time nobody else wants, while
  the event loop (heartbeats, the ring's frames) stays at nice 19, not starved; on Windows
  ``IDLE_PRIORITY_CLASS``; on macOS the background band (``PRIO_DARWIN_BG``, which also throttles I/O);
- I/O: the idle class (Linux ``ioprio``), so a download never slows the owner's disk;
- threads: inference on all cores but one (:func:`donor_threads`), unless the donor set a number.

Every call is made through an injectable ``system`` (the ``os`` module and psutil by default), so tests check what
is asked of each platform without being that platform.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

NICENESS = 19
"""The lowest priority POSIX ``nice`` gives."""
PRIO_DARWIN_PROCESS = 4
"""macOS ``<sys/resource.h>``: ``setpriority(PRIO_DARWIN_PROCESS, 0, PRIO_DARWIN_BG)`` puts a process in the
background band (low CPU and throttled I/O), as ``ProcessType=Background`` does for a launchd job."""
PRIO_DARWIN_BG = 0x1000


def donor_threads(cpus: int | None) -> int:
    """Inference threads for a donor's agent on a PC of ``cpus`` logical CPUs: all but one, at least one."""
    return max(1, (cpus or 1) - 1)


_NICE: Callable[[int], int] = getattr(os, "nice", lambda increment: 0)
_SETSCHEDULER: Callable[..., None] | None = getattr(os, "sched_setscheduler", None)
_SCHED_IDLE: int | None = getattr(os, "SCHED_IDLE", None)
_SETPRIORITY: Callable[[int, int, int], None] | None = getattr(os, "setpriority", None)


@dataclass
class System:
    """The calls that lower a process's priority (the real ones by default; tests give their own)."""

    platform: str = sys.platform
    nice: Callable[[int], int] = _NICE
    sched_setscheduler: Callable[..., None] | None = _SETSCHEDULER
    sched_idle: int | None = _SCHED_IDLE
    process: Callable[[], Any] | None = None
    """``psutil.Process`` (None: imported when needed), for the I/O class and Windows' priority class."""
    setpriority: Callable[[int, int, int], None] | None = _SETPRIORITY


def lower_priority(system: System | None = None) -> list[str]:
    """Lower this process as the module docstring says; returns what was done, for the log and the status (a step
    the platform refuses is logged and skipped: a donor's agent still runs, only less politely)."""
    system = system or System()
    done: list[str] = []
    if system.platform == "win32":
        process = _process(system)
        if process is not None:
            done += _try("IDLE_PRIORITY_CLASS", lambda: process.nice(_psutil_constant("IDLE_PRIORITY_CLASS")))
        return done
    done += _try(f"nice {NICENESS}", lambda: system.nice(NICENESS - system.nice(0)))
    if system.platform == "darwin" and system.setpriority is not None:
        setpriority = system.setpriority
        done += _try("background band", lambda: setpriority(PRIO_DARWIN_PROCESS, 0, PRIO_DARWIN_BG))
    if system.platform.startswith("linux"):
        process = _process(system)
        if process is not None:
            done += _try("idle I/O", lambda: process.ionice(_psutil_constant("IOPRIO_CLASS_IDLE")))
    return done


def idle_thread(system: System | None = None) -> None:
    """Put the calling thread in ``SCHED_IDLE`` where there is one (Linux): the initializer of the executor that
    runs OpenVINO's calls on a donor's agent."""
    system = system or System()
    if system.sched_setscheduler is None or system.sched_idle is None:
        return
    try:
        system.sched_setscheduler(0, system.sched_idle, os.sched_param(0))
    except OSError as exc:  # a container or a policy may forbid it: the thread stays at nice 19
        log.debug("SCHED_IDLE refused for an inference thread: %s", exc)


def _process(system: System) -> Any:
    if system.process is not None:
        return system.process()
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process()


def _psutil_constant(name: str) -> int:
    import psutil

    return int(getattr(psutil, name))


def _try(what: str, call: Callable[[], object]) -> list[str]:
    try:
        call()
    except (OSError, AttributeError, ValueError) as exc:
        log.warning("could not lower this agent's priority (%s): %s", what, exc)
        return []
    return [what]
