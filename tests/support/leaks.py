"""What a test left behind: asyncio tasks still running, threads, open file descriptors.

``tests/conftest.py:_loop_watch`` takes a ``Baseline`` before every test and asks it afterwards what is new; each
thing left is named so that its owner can be found: a task by its coroutine, where it waits and where it was
created, a thread by its name and target, a descriptor by what it points to (a file's path, a socket's ends).

What is legitimately long-lived (made once by the first test that needs it and kept for the session) is allowed
by name in ``THREAD_ALLOWANCES`` and ``FD_ALLOWANCES``, each with the reason.
"""

from __future__ import annotations

import asyncio
import asyncio.runners
import concurrent.futures
import gc
import logging
import os
import re
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

FD_FOLDER = "/proc/self/fd"

THREAD_ALLOWANCES: tuple[tuple[str, str], ...] = (
    ("^tqdm_monitor ", "tqdm's monitor: started with the first progress bar, it runs to the end of the process"),
    (
        "started at .*/openvino_telemetry/",
        "openvino_telemetry sends each event from a thread pool of its own that it never shuts down",
    ),
)
"""(pattern matched against a thread's description, ``describe_thread``: its name, target and where it was
started; why such a thread may outlive the test that started it)."""

FD_ALLOWANCES: tuple[tuple[str, str], ...] = (
    (r"^/dev/shm/pym-\d+-", "multiprocessing's shared-memory heap (a Value, an Array) keeps its arenas for reuse"),
)
"""(pattern matched against what a descriptor points to, why it may outlive the test that opened it)."""


def long_lived_fds() -> frozenset[int]:
    """Descriptors that live to the end of the process by design, told by who holds them rather than by what
    they point to (a pipe is a pipe): multiprocessing's resource tracker, started by the first semaphore or
    shared memory of a spawn context, keeps the write end of its pipe."""
    from multiprocessing import resource_tracker

    fd = getattr(resource_tracker._resource_tracker, "_fd", None)
    return frozenset({fd}) if isinstance(fd, int) else frozenset()


SETTLE_SECONDS = 2.0
"""How long a thread or descriptor may take to go after the test: a worker finishing its last item, a transport
closed by a callback the loop ran as it closed."""

_ASYNCIO_FOLDER = os.path.dirname(asyncio.__file__)
_THREADING_FILES = (threading.__file__, os.path.dirname(concurrent.futures.__file__))


def open_fds() -> dict[int, str]:
    """This process's open descriptors and what each points to (``readlink`` of ``/proc/self/fd/N``)."""
    fds = {}
    for name in os.listdir(FD_FOLDER):
        try:
            fds[int(name)] = os.readlink(f"{FD_FOLDER}/{name}")
        except FileNotFoundError:  # the listing's own descriptor, closed by now
            continue
    return fds


def describe_fd(fd: int, target: str) -> str:
    """``fd 12 -> /tmp/x`` or, for a socket, its family, type and ends (read through a duplicate of it)."""
    if not target.startswith("socket:"):
        return f"fd {fd} -> {target}"
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return f"fd {fd} -> {target}"
    with sock:
        ends = [_address(sock.getsockname)]
        peer = _address(sock.getpeername)
        if peer != "?":  # not listening or unconnected
            ends.append(peer)
        return f"fd {fd} -> {target} {sock.family.name} {sock.type.name} {' -> '.join(ends)}"


def _address(get: Callable[[], Any]) -> str:
    try:
        address = get()
    except OSError:
        return "?"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return repr(address) if address else "(unnamed)"


def describe_thread(thread: threading.Thread, started_at: str | None = None) -> str:
    """The thread's name, what it runs, whether it is a daemon and where it was started."""
    target = getattr(thread, "_target", None)  # Thread keeps it until run() returns
    runs = getattr(target, "__qualname__", None) or type(thread).__qualname__
    module = getattr(target, "__module__", None) or type(thread).__module__
    where = f", started at {started_at}" if started_at else ""
    return f"{thread.name} ({module}.{runs}{', daemon' if thread.daemon else ''}{where})"


def created_here(depth: int = 2) -> str:
    """Where the code that asked for a task is (``depth`` frames up: the caller of the function that calls
    this), past asyncio's own frames: ``file:line in function``, or asyncio's line for a task that a loop
    callback made (a stream server's connection handler)."""
    frame = first = sys._getframe(depth)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_ASYNCIO_FOLDER):
        if frame.f_code.co_name == "_run":  # events.Handle._run: a callback the loop ran, not code that awaited
            return f"{_place(first)} (a loop callback)"
        frame = frame.f_back
    return _place(frame)


def started_here(depth: int = 2) -> str:
    """Where the code that started a thread is, past ``threading`` and ``concurrent.futures`` (an executor
    starts its workers as work is submitted): ``file:line in function``."""
    frame = sys._getframe(depth)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_THREADING_FILES):
        frame = frame.f_back
    return _place(frame)


def _place(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def describe_task(task: asyncio.Task[Any], created_at: str | None) -> str:
    """The task's coroutine, the line it waits on and where it was created."""
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", None) or repr(coro)
    stack = task.get_stack()
    waits = f", waiting at {stack[-1].f_code.co_filename}:{stack[-1].f_lineno}" if stack else ""
    return f"{name}{waits}, created at {created_at or 'an unknown place'}"


@dataclass
class TaskLedger:
    """The event loops made during a test, where each of their tasks was created, and the tasks that
    ``asyncio.run`` found still running when the test's coroutine returned (it cancels them without a word)."""

    loops: list[asyncio.AbstractEventLoop] = field(default_factory=list)
    """Held until the guard looks: a loop left open would otherwise go with the garbage, unseen."""
    created_at: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = field(default_factory=weakref.WeakKeyDictionary)
    swept: list[str] = field(default_factory=list)
    started_at: weakref.WeakKeyDictionary[threading.Thread, str] = field(default_factory=weakref.WeakKeyDictionary)

    def note_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loops.append(loop)

    def note_task(self, task: asyncio.Task[Any], created_at: str) -> None:
        self.created_at[task] = created_at

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Record the tasks still running on ``loop`` as leaked (called as ``asyncio.run`` starts cancelling them)."""
        for task in asyncio.all_tasks(loop):
            if not task.done():
                self.swept.append(f"{describe_task(task, self.created_at.get(task))} (cancelled by asyncio.run)")

    def left_running(self) -> list[str]:
        """Every task left running: those ``asyncio.run`` swept, and those on loops still open or closed with
        tasks pending on them."""
        left = list(self.swept)
        for loop in self.loops:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            left.extend(describe_task(t, self.created_at.get(t)) for t in pending)
            if not loop.is_closed():
                left.append(f"event loop {loop!r} left open")
        return left


@contextmanager
def starts_recorded(ledger: TaskLedger) -> Iterator[None]:
    """While inside, every thread started is noted in ``ledger`` with where it was started (``Thread.start``
    wrapped: threading has no hook there), so that a thread left running names the code that made it."""
    original = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        ledger.started_at[thread] = started_here()
        original(thread)

    threading.Thread.start = start  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        threading.Thread.start = original  # type: ignore[method-assign]


@contextmanager
def sweeps_recorded(ledger: TaskLedger) -> Iterator[None]:
    """While inside, ``asyncio.run`` (``asyncio.Runner.close``) tells ``ledger`` what it is about to cancel.

    asyncio has no public hook there: ``Runner.close`` calls the module function ``_cancel_all_tasks`` (3.11 to
    3.13), so that is what is wrapped; without it a task a test forgot would be cancelled unseen.
    """
    original: Callable[[asyncio.AbstractEventLoop], None] = asyncio.runners._cancel_all_tasks  # type: ignore[attr-defined]

    def cancel_all_tasks(loop: asyncio.AbstractEventLoop) -> None:
        ledger.sweep(loop)
        original(loop)

    asyncio.runners._cancel_all_tasks = cancel_all_tasks  # type: ignore[attr-defined]
    try:
        yield
    finally:
        asyncio.runners._cancel_all_tasks = original  # type: ignore[attr-defined]


def release_logged_frames(records: Iterable[logging.LogRecord]) -> None:
    """Clear the locals of the frames in the tracebacks that captured log records keep (``exc_info``, or an
    exception given as an argument: ``log.warning("lost %s: %s", peer, error)``).

    pytest keeps every record a test logged until the test's teardown has ended (``caplog.get_records``), and a
    record logged with its exception keeps the traceback, whose frames keep their locals: an agent's server, its
    compiled stages and their open OpenVINO files would outlive the test that stopped it in those frames alone.
    The records keep their message and exception (and the report its formatted text); only the finished frames'
    locals go, as ``traceback.clear_frames`` does.
    """
    for record in records:
        args = record.args.values() if isinstance(record.args, Mapping) else record.args or ()
        errors = [record.exc_info[1] if record.exc_info else None, *args]  # an error given as an argument too
        seen: set[int] = set()
        for error in errors:
            while isinstance(error, BaseException) and id(error) not in seen:  # its causes, each with a traceback
                seen.add(id(error))
                traceback.clear_frames(error.__traceback__)
                error = error.__cause__ or error.__context__


def _allowed(allowances: tuple[tuple[str, str], ...], text: str) -> bool:
    return any(re.search(pattern, text) for pattern, _ in allowances)


@dataclass
class Baseline:
    """The threads and descriptors open before a test, and the ledger of its tasks."""

    threads: frozenset[threading.Thread]
    fds: frozenset[tuple[int, str]]
    ledger: TaskLedger = field(default_factory=TaskLedger)

    @classmethod
    def take(cls) -> Baseline:
        return cls(frozenset(threading.enumerate()), frozenset(open_fds().items()))

    def new_threads(self) -> list[threading.Thread]:
        started = self.ledger.started_at
        return [
            t
            for t in threading.enumerate()
            if t not in self.threads
            and t.is_alive()
            and not _allowed(THREAD_ALLOWANCES, describe_thread(t, started.get(t)))
        ]

    def new_fds(self) -> dict[int, str]:
        kept = long_lived_fds()
        return {
            fd: target
            for fd, target in open_fds().items()
            if (fd, target) not in self.fds and fd not in kept and not _allowed(FD_ALLOWANCES, target)
        }

    def absorb(self) -> None:
        """Count every thread and descriptor open now as there before the test: called when the test set up a
        fixture of a wider scope (``request.getfixturevalue`` in its body), whose agents and files are meant to
        outlive it."""
        self.threads |= frozenset(threading.enumerate())
        self.fds |= frozenset(open_fds().items())

    def leaks(self, threads: bool = True, fds: bool = True, settle_s: float = SETTLE_SECONDS) -> list[str]:
        """What the test left: one line per kind (tasks, threads, descriptors), empty when it left nothing.

        A descriptor still open first gets a garbage collection (an unclosed socket in a reference cycle is the
        collector's to close, and its ``ResourceWarning`` says so); then threads and descriptors get ``settle_s``
        to go (a worker finishing its last item), and a last collection; only what outlives that counts.
        """
        tasks = self.ledger.left_running()  # before any collection below takes a loop left open
        left_threads = self.new_threads() if threads else []
        left_fds = self.new_fds() if fds else {}
        if left_fds:
            gc.collect()
            left_fds = self.new_fds()
        deadline = time.monotonic() + settle_s
        while (left_threads or left_fds) and time.monotonic() < deadline:
            time.sleep(0.05)
            left_threads = [t for t in left_threads if t.is_alive()]
            left_fds = self.new_fds() if fds else {}
        if left_fds:
            gc.collect()
            left_fds = self.new_fds()
        problems = []
        if tasks:
            problems.append(f"asyncio tasks left running: {'; '.join(tasks)}")
        if left_threads:
            started = self.ledger.started_at
            problems.append(
                f"threads left running: {', '.join(describe_thread(t, started.get(t)) for t in left_threads)}"
            )
        if left_fds:
            problems.append(f"file descriptors left open: {', '.join(describe_fd(*item) for item in left_fds.items())}")
        return problems
