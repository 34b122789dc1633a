"""The suite's own guard (``tests/conftest.py:_loop_watch``) fails a test that blocks its event loop or leaks a
thread, and passes one that does neither."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parents[1] / "conftest.py").read_text(encoding="utf-8")

CASES = """
import asyncio, threading, time

def test_blocks_the_loop():
    async def main():
        time.sleep(1.5)  # a blocking call on the event loop
    asyncio.run(main())

def test_leaks_a_thread():
    threading.Thread(target=time.sleep, args=(5,), name="leaky").start()

def test_offloads_the_blocking_call():
    async def main():
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, 1.5)
    asyncio.run(main())
"""


def test_blocking_the_loop_or_leaking_a_thread_fails_the_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2]))  # the conftest imports tests.support
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=2)  # a teardown failure counts as an error beside the pass
    result.stdout.fnmatch_lines(["*the event loop was blocked*", "*threads left running: leaky*"], consecutive=False)
