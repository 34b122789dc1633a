"""A long prompt's progress reports come out between an answer's tokens, only before the first one; an
answer closed while its prompt goes in stops the decoding at once, and an error of its first step is raised."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from agent.chat.progress import PromptProgress
from agent.chat_client.client import progress_line
from agent.chat_client.protocol import ChatEvent


def test_reports_come_before_the_first_token_and_none_after() -> None:
    async def main() -> list[int | ChatEvent]:
        progress = PromptProgress(0.0, clock=lambda: 2.5)

        async def tokens() -> AsyncGenerator[int, None]:
            for done in (4, 8):
                await asyncio.sleep(0.01)
                progress.report(done, 10)
            yield 7
            progress.report(10, 10)  # too late to tell: the prompt is in
            yield 8

        async with contextlib.aclosing(progress.before_first(tokens())) as items:
            return [item async for item in items]

    items = asyncio.run(main())
    assert items[2:] == [7, 8]
    assert [(e.event, e.stats) for e in items[:2] if isinstance(e, ChatEvent)] == [
        ("progress", {"done": 4, "total": 10, "seconds": 2.5}),
        ("progress", {"done": 8, "total": 10, "seconds": 2.5}),
    ]
    assert progress_line(items[1]) == "prompt: 8 of 10 positions in, 2.5 s"  # type: ignore[arg-type]


def test_closing_while_the_prompt_goes_in_stops_the_decoding_and_leaves_no_task() -> None:
    stopped = []

    async def main() -> None:
        progress = PromptProgress(0.0)

        async def tokens() -> AsyncGenerator[int, None]:
            try:
                progress.report(1, 10)
                await asyncio.sleep(60)
                yield 1
            finally:
                stopped.append(True)

        before = asyncio.all_tasks()
        items = progress.before_first(tokens())
        assert isinstance(await anext(items), ChatEvent)
        await items.aclose()
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == before

    asyncio.run(asyncio.wait_for(main(), 5))
    assert stopped == [True]


def test_an_error_of_the_first_step_is_raised() -> None:
    async def main() -> None:
        progress = PromptProgress(0.0)

        async def tokens() -> AsyncGenerator[int, None]:
            raise ConnectionResetError("stage 1 went away")
            yield 0

        async with contextlib.aclosing(progress.before_first(tokens())) as items:
            async for _ in items:
                pass

    with pytest.raises(ConnectionResetError, match="stage 1"):
        asyncio.run(main())
