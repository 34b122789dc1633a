"""An idle agent gives back the memory its C heap keeps (issue 46 §2): once per idle period, never while steps flow."""

from __future__ import annotations

import asyncio
import ctypes
import sys

import psutil
import pytest

from agent.node.heap_trim import HeapTrim, IdleWatch, watched
from agent.runtime.heap import give_back_heap


def test_the_heap_is_trimmed_once_an_idle_period_and_never_while_steps_flow() -> None:
    watch, trims = IdleWatch(0, 0.0), []
    steps = 0
    for tick in range(1, 61):  # a second a tick: steps flow for 20 s, 20 s idle, one step, 19 s idle
        now = float(tick)
        steps += tick <= 20 or tick == 40
        watch, due = watched(watch, steps, now, idle_after=5.0)
        if due:
            trims.append(now)
    assert trims == [25.0, 45.0]
    # a slow stream (a step every 4 s) never counts as idle
    watch, dues = IdleWatch(0, 0.0), []
    for tick in range(1, 61):
        watch, due = watched(watch, tick // 4, float(tick), idle_after=5.0)
        dues.append(due)
    assert not any(dues)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def test_the_daemon_part_trims_off_the_loop_after_the_idle_time_and_says_so_in_its_status() -> None:
    clock = _Clock()
    trimmed_at: list[float] = []

    def steps() -> int:  # a step a second from 10 s to 20 s
        return int(min(max(clock.now, 10.0), 20.0))

    def trim() -> bool:
        trimmed_at.append(clock.now)
        return True

    async def run() -> dict[str, object]:
        part = HeapTrim("pc1", steps, idle_after=5.0, clock=lambda: clock.now, trim=trim, sleep=clock.sleep)
        await part.start(("127.0.0.1", 0))
        while clock.now < 40:
            await asyncio.sleep(0.001)  # the part's fake sleeps run on; the executor's thread runs a trim
        await part.stop()
        return part.status()

    status = asyncio.run(run())
    assert status == {"trims": 2, "idle_after_s": 5.0}
    assert trimmed_at[0] == pytest.approx(5.0, abs=1.0)  # after start: what compiling the stages freed
    assert trimmed_at[1] == pytest.approx(25.0, abs=1.5)  # after the last step, not while they flowed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_trim_returns_the_freed_memory_the_heap_kept() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    block, count = 4096, 25_000  # 100 MB in small blocks: from the heap, not mapped on their own
    blocks = [libc.malloc(block) for _ in range(count)]
    for address in blocks:
        ctypes.memset(address, 1, block)
    pin = libc.malloc(block)  # above them all, so the heap's top cannot shrink by itself
    for address in blocks:
        libc.free(address)
    held = psutil.Process().memory_info().rss
    assert give_back_heap()
    returned = held - psutil.Process().memory_info().rss
    libc.free(pin)
    assert returned > 0.8 * block * count, returned
