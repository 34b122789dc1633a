"""A donor's agent lowers itself: what each platform is asked, and the real thing on this Linux machine."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psutil
import pytest

from agent.node.background import (
    PRIO_DARWIN_BG,
    PRIO_DARWIN_PROCESS,
    System,
    donor_threads,
    lower_priority,
)


class Recorder:
    """Stands in for ``os`` and ``psutil.Process`` and notes every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.niceness = 0

    def nice(self, increment: int) -> int:
        self.calls.append(("nice", increment))
        self.niceness += increment
        return self.niceness

    def process(self) -> Recorder:
        return self

    def ionice(self, ioclass: int) -> None:
        self.calls.append(("ionice", ioclass))

    def setpriority(self, which: int, who: int, priority: int) -> None:
        self.calls.append(("setpriority", (which, who, priority)))


def test_all_but_one_core_infer() -> None:
    assert [donor_threads(n) for n in (None, 1, 2, 8)] == [1, 1, 1, 7]


def test_linux_is_asked_for_nice_19_and_idle_io() -> None:
    r = Recorder()
    r.niceness = 5  # already somewhat nice: raised to 19, not by 19
    done = lower_priority(System(platform="linux", nice=r.nice, process=r.process, setpriority=r.setpriority))
    assert done == ["nice 19", "idle I/O"]
    assert r.calls == [("nice", 0), ("nice", 14), ("ionice", psutil.IOPRIO_CLASS_IDLE)] and r.niceness == 19


def test_macos_is_asked_for_the_background_band_and_windows_for_the_idle_class(monkeypatch: pytest.MonkeyPatch) -> None:
    r = Recorder()
    assert lower_priority(System(platform="darwin", nice=r.nice, setpriority=r.setpriority)) == [
        "nice 19",
        "background band",
    ]
    assert ("setpriority", (PRIO_DARWIN_PROCESS, 0, PRIO_DARWIN_BG)) in r.calls
    # the constant psutil would pass on Windows (0x40, IDLE_PRIORITY_CLASS in winbase.h)
    windows = Recorder()
    monkeypatch.setattr(psutil, "IDLE_PRIORITY_CLASS", 0x40, raising=False)
    calls: list[int] = []
    windows.nice = calls.append  # type: ignore[assignment,method-assign]
    assert lower_priority(System(platform="win32", process=windows.process)) == ["IDLE_PRIORITY_CLASS"]
    assert calls == [0x40]


def test_a_refused_step_is_skipped_not_fatal() -> None:
    def refuse(n: int) -> int:
        raise PermissionError("not allowed")

    assert lower_priority(System(platform="linux", nice=refuse, process=lambda: None)) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and ioprio are Linux's")
def test_on_this_linux_the_process_is_niced_its_io_idle_and_an_inference_thread_sched_idle() -> None:
    # a child process: lowering is for good, and the test process must keep its own priority
    code = """
import os, threading, psutil
from agent.node.background import lower_priority, idle_thread
done = lower_priority()
seen = {}
def infer():
    idle_thread()
    seen["policy"] = os.sched_getscheduler(0)
t = threading.Thread(target=infer); t.start(); t.join()
print(done, os.nice(0), psutil.Process().ionice().ioclass == psutil.IOPRIO_CLASS_IDLE,
      seen["policy"] == os.SCHED_IDLE, os.sched_getscheduler(0) == os.SCHED_OTHER)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("] ")
    assert out[0] == "['nice 19', 'idle I/O'" and out[1].split() == ["19", "True", "True", "True"]
