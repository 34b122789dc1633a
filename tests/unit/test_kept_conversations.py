"""Which kept chat session a new turn takes over, and when kept sessions give their places up."""

from __future__ import annotations

import asyncio

from agent.chat.kept import KeptConversation, KeptConversations
from agent.head.resumable import ResumableTarget
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import ScriptedTarget

GREEDY = SamplingParams()


class Places:
    """Counts the places kept sessions hold, as the agent's session table would."""

    def __init__(self) -> None:
        self.held = 0

    async def conversation(self, held: list[int], params: SamplingParams = GREEDY) -> KeptConversation:
        target = ResumableTarget(ScriptedTarget(), params, grid=1)
        await target.step(list(held), 0, last_only=True)  # a prompt of whole chunks: all it holds is reusable
        self.held += 1
        return KeptConversation(target, (), None)

    def release(self) -> None:
        self.held -= 1

    def keeper(self, keep_seconds: float, keep_max: int) -> KeptConversations:
        return KeptConversations("n", keep_seconds, keep_max, self.release)


async def keep(kept: KeptConversations, conversation: KeptConversation, prompt: list[int] | None = None) -> bool:
    """Keep ``conversation`` as the answer to ``prompt`` (default: the first half of what it holds)."""
    held = conversation.target.held
    return await kept.keep(conversation, held[: len(held) // 2] if prompt is None else prompt)


def test_a_turn_takes_the_session_of_the_conversation_it_continues() -> None:
    async def go() -> None:
        places = Places()
        kept = places.keeper(60.0, 3)
        short = await places.conversation([1, 2, 3, 4])  # the answer to [1, 2]
        long = await places.conversation([1, 2, 3, 4, 5, 6, 7, 8])  # the answer to [1, 2, 3, 4]
        other = await places.conversation([9, 9, 9, 9])  # the answer to [9, 9]
        for conversation in (short, long, other):
            assert await keep(kept, conversation)
        # continues both short's and long's conversations: long holds more of it
        taken = kept.take([1, 2, 3, 4, 5, 6, 7, 8, 20, 21], GREEDY)
        assert taken is long and len(kept) == 2
        assert kept.resumed == 1 and kept.reused_tokens == 8
        assert kept.take([1, 2, 30, 31], GREEDY) is short
        # shares the opening of other's prompt, not the whole of it: another conversation
        assert kept.take([9, 40, 41, 42], GREEDY) is None
        assert places.held == 3  # taking over keeps the place; nothing was freed
        await kept.close_all()
        assert places.held == 2 and other.target.inner.closed  # type: ignore[attr-defined]

    asyncio.run(go())


def test_other_sampling_or_a_lost_ring_starts_afresh() -> None:
    async def go() -> None:
        places = Places()
        kept = places.keeper(60.0, 2)
        warm = await places.conversation([1, 2, 3, 4], SamplingParams(temperature=0.7, seed=1))
        lost = await places.conversation([5, 6, 7, 8])
        await keep(kept, warm)
        await keep(kept, lost)
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
        kept = places.keeper(0.05, 1)
        first, second = await places.conversation([1, 2]), await places.conversation([3, 4])
        await keep(kept, first)
        await keep(kept, second)  # one at most: the older gives its place up
        await asyncio.sleep(0)
        assert len(kept) == 1 and places.held == 1 and first.target.inner.closed  # type: ignore[attr-defined]
        await asyncio.sleep(0.2)
        assert len(kept) == 0 and places.held == 0 and second.target.inner.closed  # type: ignore[attr-defined]
        third = await places.conversation([5, 6])
        await keep(kept, third)
        freed = kept.evict_oldest()
        assert freed is not None and places.held == 0
        await freed
        assert third.target.inner.closed  # type: ignore[attr-defined]
        assert kept.evict_oldest() is None
        await kept.close_all()

    asyncio.run(go())


def test_keeping_off_keeps_nothing() -> None:
    async def go() -> None:
        places = Places()
        kept = places.keeper(0.0, 4)
        assert not await keep(kept, await places.conversation([1, 2]))
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


def test_a_full_table_evicts_the_session_parked_longest_ago_and_never_an_active_one() -> None:
    from agent.node.sessions import SessionState, SessionTable
    from agent.wire.messages import SessionOpen

    evicted: list[int] = []
    table = SessionTable(3, on_evict=lambda state, why: evicted.append(state.id))

    def add(session: int, parked_at: float | None = None) -> None:
        table.add(SessionState(session, SessionOpen(head_id=1), [], None, parked_at=parked_at))

    add(1)
    add(2)
    table.reserve()  # one of the agent's own chats
    assert not table.make_room() and evicted == []  # every place is active
    table.sessions[2].parked_at = 20.0
    table.sessions[1].parked_at = 10.0
    assert table.parked() == 2
    assert table.make_room() and evicted == [1] and set(table.sessions) == {2} and table.evicted == 1
    add(3)
    table.sessions[2].parked_at = None  # its head took it up again: a step arrived
    assert not table.make_room() and evicted == [1]

    # the agent's own kept chats give their places up first: they are its own to give
    table.sessions[2].parked_at = 5.0
    table.reclaim = lambda: (table.release(), True)[1]
    assert table.make_room() and evicted == [1] and table.local == 0


def test_keeping_parks_the_session_and_an_evicted_one_gives_its_place_up_first() -> None:
    async def go() -> None:
        places = Places()
        kept = places.keeper(60.0, 2)
        older, newer = await places.conversation([1, 2]), await places.conversation([3, 4])
        assert await keep(kept, older) and await keep(kept, newer)
        assert older.target.inner.parked == newer.target.inner.parked == 1  # type: ignore[attr-defined]
        newer.target.inner.evicted = True  # type: ignore[attr-defined]  # a stage gave its place away
        assert kept.give_up_place() and places.held == 1 and len(kept) == 1
        assert kept.take([1, 2, 9], GREEDY) is older  # the older one, still whole, stays kept till then
        assert not kept.give_up_place()
        await kept.close_all()

    asyncio.run(go())
