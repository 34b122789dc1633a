"""Which kept chat session a new turn takes over, and when kept sessions give their places up."""

from __future__ import annotations

import asyncio

from agent.chat.kept import KeptConversation, KeptConversations
from agent.head.resumable import ResumableTarget
from agent.head.sampling import SamplingParams
from tests.unit.scripted_target import ScriptedTarget

GREEDY = SamplingParams()


class Places:
    """Counts the places kept sessions hold, as the agent's session table would."""

    def __init__(self) -> None:
        self.held = 0

    def conversation(self, held: list[int], params: SamplingParams = GREEDY) -> KeptConversation:
        target = ResumableTarget(ScriptedTarget(), params)
        target.held = list(held)
        self.held += 1

        def release() -> None:
            self.held -= 1

        return KeptConversation(target, None, release)


def test_a_turn_takes_the_session_that_holds_most_of_its_conversation() -> None:
    async def go() -> None:
        places = Places()
        kept = KeptConversations("n", 60.0, 3)
        short = places.conversation([1, 2, 3, 4])
        long = places.conversation([1, 2, 3, 4, 5, 6, 7, 8])
        other = places.conversation([9, 9, 9, 9])
        for conversation in (short, long, other):
            assert kept.keep(conversation)
        taken = kept.take([1, 2, 3, 4, 5, 6, 7, 8, 20, 21], GREEDY)
        assert taken is long and len(kept) == 2
        assert kept.resumed == 1 and kept.reused_tokens == 8
        # shares half of what ``short`` holds: enough; a quarter of ``other``: not
        assert kept.take([1, 2, 30, 31], GREEDY) is short
        assert kept.take([9, 40, 41, 42], GREEDY) is None
        assert places.held == 3  # taking over keeps the place; nothing was freed
        await kept.close_all()
        assert places.held == 2 and other.target.inner.closed  # type: ignore[attr-defined]

    asyncio.run(go())


def test_other_sampling_or_a_lost_ring_starts_afresh() -> None:
    async def go() -> None:
        places = Places()
        kept = KeptConversations("n", 60.0, 2)
        warm = places.conversation([1, 2, 3, 4], SamplingParams(temperature=0.7, seed=1))
        lost = places.conversation([5, 6, 7, 8])
        kept.keep(warm)
        kept.keep(lost)
        assert kept.take([1, 2, 3, 4, 10], GREEDY) is None  # the stages sample with what the session opened with
        assert kept.take([1, 2, 3, 4, 10], SamplingParams(temperature=0.7, seed=2)) is warm  # the seed is the head's
        await lost.target.inner.close()  # as a lost ring fails its sessions
        assert kept.take([5, 6, 7, 8, 10], GREEDY) is None
        assert len(kept) == 0 and places.held == 1  # the lost one's place is given up
        await kept.close_all()

    asyncio.run(go())


def test_kept_sessions_are_few_and_expire() -> None:
    async def go() -> None:
        places = Places()
        kept = KeptConversations("n", 0.05, 1)
        first, second = places.conversation([1, 2]), places.conversation([3, 4])
        kept.keep(first)
        kept.keep(second)  # one at most: the older gives its place up
        await asyncio.sleep(0)
        assert len(kept) == 1 and places.held == 1 and first.target.inner.closed  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)
        assert len(kept) == 0 and places.held == 0 and second.target.inner.closed  # type: ignore[attr-defined]
        third = places.conversation([5, 6])
        kept.keep(third)
        freed = kept.evict_oldest()
        assert freed is not None and places.held == 0
        await freed
        assert third.target.inner.closed  # type: ignore[attr-defined]
        assert kept.evict_oldest() is None
        await kept.close_all()

    asyncio.run(go())


def test_keeping_off_keeps_nothing() -> None:
    async def go() -> None:
        kept = KeptConversations("n", 0.0, 4)
        assert not kept.keep(Places().conversation([1, 2]))
        assert len(kept) == 0

    asyncio.run(go())


def test_the_session_table_asks_for_a_kept_place_before_refusing() -> None:
    from agent.node.sessions import SessionTable

    freed: list[int] = []
    table = SessionTable(2)
    assert table.reserve() and table.reserve()
    assert not table.reserve()  # nothing to reclaim

    def give_up_a_kept_place() -> bool:
        table.release()
        freed.append(1)
        return True

    table.reclaim = give_up_a_kept_place
    assert table.reserve() and freed == [1] and table.local == 2
    table.reclaim = lambda: False
    assert not table.make_room()
