"""One stream of an answer's events from two sources: its tokens, and what happens meanwhile (progress)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")
S = TypeVar("S")


async def interleave(items: AsyncIterator[T], side: asyncio.Queue[S]) -> AsyncGenerator[T | S, None]:
    """``items`` as they come, with what is put on ``side`` meanwhile yielded between them, in the order it
    arrived. It ends with ``items``; an exception of ``items`` is raised here. Closing it cancels the item
    being awaited (``items`` then ends as a cancelled generator does)."""
    upcoming: asyncio.Future[T] = asyncio.ensure_future(anext(items))
    getter: asyncio.Future[S] | None = None
    try:
        while True:
            if not side.empty():
                yield side.get_nowait()
                continue
            getter = asyncio.ensure_future(side.get())
            await asyncio.wait((upcoming, getter), return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
            getter = None
            if upcoming.done():
                try:
                    item = upcoming.result()
                except StopAsyncIteration:
                    return
                yield item
                upcoming = asyncio.ensure_future(anext(items))
    finally:
        for pending in (upcoming, getter):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
