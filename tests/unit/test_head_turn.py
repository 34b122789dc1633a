"""``HeadTurn``: the head's core taken in turns, and ``wanted`` that tells work done ahead to yield."""

from __future__ import annotations

import asyncio

from agent.head.turn import HeadTurn


def test_wanted_while_a_session_queues_but_not_for_spare_work() -> None:
    async def go() -> list[tuple[str, bool]]:
        turn = HeadTurn()
        seen: list[tuple[str, bool]] = []
        async with turn.spare():
            seen.append(("spare holds it", turn.wanted))
            spare_waiter = asyncio.create_task(_hold(turn.spare()))
            await asyncio.sleep(0)
            seen.append(("spare work queued", turn.wanted))
            session = asyncio.create_task(_hold(turn))
            await asyncio.sleep(0)
            seen.append(("a session queued", turn.wanted))
        await asyncio.gather(spare_waiter, session)
        seen.append(("all done", turn.wanted or turn.locked()))
        return seen

    assert asyncio.run(go()) == [
        ("spare holds it", False),
        ("spare work queued", False),
        ("a session queued", True),
        ("all done", False),
    ]


def test_a_cancelled_wait_is_not_counted() -> None:
    async def go() -> bool:
        turn = HeadTurn()
        async with turn:
            waiter = asyncio.create_task(_hold(turn))
            await asyncio.sleep(0)
            assert turn.wanted
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
        return turn.wanted

    assert asyncio.run(go()) is False


async def _hold(lock: object) -> None:
    async with lock:  # type: ignore[attr-defined]
        await asyncio.sleep(0)
