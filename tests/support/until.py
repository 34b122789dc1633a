"""Waiting in a test's event loop for something an agent does by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` every 50 ms until it holds; the seconds it took. ``AssertionError`` naming ``what`` after
    ``timeout`` seconds."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - start
