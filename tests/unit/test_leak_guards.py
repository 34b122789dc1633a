"""The suite's leak guards (``tests/support/leaks.py``, run after every test by ``tests/conftest.py:_loop_watch``)
catch a task, a thread or a descriptor a test left behind, name it, and pass a test that cleans up."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.support.leaks import Baseline, describe_fd, describe_thread, open_fds

pytest_plugins = ["pytester"]

ROOT = Path(__file__).parents[2]
CONFTEST = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")

CASES = """
import asyncio, logging, socket, threading

import pytest

def test_leaves_a_task_to_asyncio_run():
    async def forgotten():
        await asyncio.sleep(3600)

    async def main():
        asyncio.get_running_loop().create_task(forgotten())
        await asyncio.sleep(0)

    asyncio.run(main())

def test_leaves_a_loop_open_with_a_task():
    async def parked():
        await asyncio.sleep(3600)

    loop = asyncio.new_event_loop()
    loop.create_task(parked())
    loop.run_until_complete(asyncio.sleep(0))

def test_leaves_a_listening_socket():
    listener = socket.create_server(("127.0.0.1", 0))
    LEFT.append(listener)

def test_leaves_a_file_open(tmp_path):
    LEFT.append(open(tmp_path / "left-open.txt", "w"))

def test_leaves_a_daemon_thread():
    stop = threading.Event()
    LEFT.append(stop)
    threading.Thread(target=stop.wait, name="lingering", daemon=True).start()

def test_fails_holding_a_file(tmp_path):
    held = open(tmp_path / "held.txt", "w")
    assert held.closed, "the failure, and only it, is reported"

@pytest.fixture(scope="session")
def kept_for_the_session(tmp_path_factory):
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="session-worker")
    worker.start()
    with open(tmp_path_factory.mktemp("session") / "kept.txt", "w") as kept:
        yield kept
    stop.set()
    worker.join()

def test_asks_for_a_session_fixture_in_its_body(request):
    request.getfixturevalue("kept_for_the_session")  # its thread and file are the session's

def test_cleans_up_after_itself(tmp_path):
    async def served():
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        task = asyncio.create_task(asyncio.sleep(3600))
        task.cancel()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()

    asyncio.run(served())
    with open(tmp_path / "closed.txt", "w") as f:
        f.write("x")
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()

def test_logs_errors_whose_frames_held_files(tmp_path):
    def serve(name):
        held = open(tmp_path / name, "w")
        raise OSError("the peer went away")

    # pytest keeps the records, and with them each error's traceback and its frames
    try:
        serve("held-by-a-logged-traceback.txt")
    except OSError:
        logging.getLogger("cases").exception("serving failed")
    try:
        serve("held-by-a-logged-error.txt")
    except OSError as error:
        logging.getLogger("cases").warning("serving failed: %s", error)

LEFT = []
"""

LEAKS = [
    "*asyncio tasks left running: *forgotten, waiting at *test_cases.py:*, created at *test_cases.py:* in main "
    "(cancelled by asyncio.run)*",
    "*asyncio tasks left running: *parked, waiting at *, created at *test_cases.py:* in "
    "test_leaves_a_loop_open_with_a_task; event loop * left open*",
    "*file descriptors left open: fd * -> socket:* AF_INET SOCK_STREAM 127.0.0.1:*",
    "*file descriptors left open: fd * -> */left-open.txt*",
    "*threads left running: lingering (threading.Event.wait, daemon, started at *test_cases.py:* in "
    "test_leaves_a_daemon_thread)*",
]


def test_a_test_that_leaks_fails_naming_the_leak(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the conftest imports tests.support
    # in a folder below the root, as tests/ is: a session fixture's setup is the root's, outside that folder
    suite = pytester.mkdir("suite")
    (suite / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (suite / "test_cases.py").write_text(CASES, encoding="utf-8")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "suite")
    # a failure at teardown counts as an error beside the pass; the failed test's open file (its traceback holds
    # it) is not reported
    result.assert_outcomes(passed=8, failed=1, errors=5)
    for line in LEAKS:
        result.stdout.fnmatch_lines([line], consecutive=False)
    assert "ERROR test_cases.py::test_fails_holding_a_file" not in result.stdout.str()
    clean_tests = (
        "test_asks_for_a_session_fixture_in_its_body",
        "test_cleans_up_after_itself",
        "test_logs_errors_whose_frames_held_files",  # the logged tracebacks' frames are cleared
    )
    for clean in clean_tests:
        assert f"{clean} - " not in result.stdout.str()


def test_a_descriptor_is_seen_while_open_and_named(tmp_path: Path) -> None:
    baseline = Baseline.take()
    path = tmp_path / "held.txt"
    with open(path, "w"):
        held = baseline.new_fds()
        assert list(held.values()) == [str(path)]
        assert any(str(path) in line for line in baseline.leaks(threads=False, settle_s=0))
    assert baseline.new_fds() == {}
    assert baseline.leaks(threads=False, settle_s=0) == []


def test_a_socket_is_named_by_its_ends() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()) as dialer:
        port = listener.getsockname()[1]
        fds = open_fds()
        assert describe_fd(listener.fileno(), fds[listener.fileno()]).endswith(f"AF_INET SOCK_STREAM 127.0.0.1:{port}")
        local = dialer.getsockname()[1]
        assert describe_fd(dialer.fileno(), fds[dialer.fileno()]).endswith(f"127.0.0.1:{local} -> 127.0.0.1:{port}")
    r, w = os.pipe()
    try:
        assert describe_fd(r, open_fds()[r]).startswith(f"fd {r} -> pipe:[")
    finally:
        os.close(r)
        os.close(w)


def test_a_thread_is_named_with_its_target_until_it_ends() -> None:
    baseline = Baseline.take()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="held-open")
    thread.start()
    try:
        assert describe_thread(thread) == "held-open (threading.Event.wait)"
        assert baseline.new_threads() == [thread]
    finally:
        stop.set()
        thread.join()
    assert baseline.new_threads() == []
