"""The ring's session rules, in milliseconds: real stage servers and ring client on toy stages in memory.

Open, step, speculate, park, evict, close; a fleet that is full; a head that vanishes; a stage lost
mid-answer and the ring healing once it is back. The answers must be the whole toy model's, token for
token, and no session may outlive its head or its use on any stage.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import FleetBusyError, PeerUnavailableError, RingError, SessionEvictedError
from agent.head.decode import DecodeStats
from agent.head.drafters import NGramDrafter
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, run

PROMPT = [1, 3, 9, 14, 22, 9, 14, 31, 2, 4]
OTHER = [1, 3, 40, 41, 42, 43, 2, 4]
REPEATING = [1, 3, *([7, 8, 9, 10] * 6), 2, 4]


def test_the_ring_answers_as_the_whole_model_plainly_speculatively_and_pipelined() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        client = ring.client()
        await client.connect()
        try:
            for prompt in (PROMPT, REPEATING):
                expected = await reference(ring, prompt)
                plain = await client.open_session(GREEDY)
                assert await answer(plain, prompt) == expected
                await plain.close()
                stats = DecodeStats()
                drafted = await client.open_session(GREEDY)
                assert await answer(drafted, prompt, drafter=NGramDrafter(), stats=stats) == expected
                await drafted.close()
                piped = await client.open_session(GREEDY)
                assert await answer(piped, prompt, drafter=NGramDrafter(), depth=2) == expected
                await piped.close()
            assert stats.drafted > 0 and stats.accepted > 0, "the repeating prompt's drafts were never judged"
            assert stats.drafted > stats.accepted, "no draft was rejected: rewinds went untested"
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_two_heads_at_once_get_the_answers_they_get_alone() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        heads = [ring.client("10.9.0.100"), ring.client("10.9.0.101")]
        for head in heads:
            await head.connect()
        try:
            sessions = [await head.open_session(GREEDY) for head in heads]
            together = await asyncio.gather(
                answer(sessions[0], PROMPT, drafter=NGramDrafter()), answer(sessions[1], OTHER)
            )
            assert list(together) == [await reference(ring, PROMPT), await reference(ring, OTHER)]
            assert ring.held() == [2, 2, 2]
            for session in sessions:
                await session.close()
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            for head in heads:
                await head.close()
            await ring.stop()

    run(main)


def test_a_full_fleet_refuses_only_the_extra_session_and_has_room_once_one_closes() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=2)
        client = ring.client()
        await client.connect()
        try:
            expected = await reference(ring, PROMPT, 6)
            first, second = [await client.open_session(GREEDY) for _ in range(2)]
            await first.step(PROMPT, 0, last_only=True)
            await second.step(PROMPT, 0, last_only=True)
            extra = await client.open_session(GREEDY)
            with pytest.raises(FleetBusyError, match="fleet busy: toy0 already serves 2 sessions"):
                await extra.step(OTHER, 0, last_only=True)
            await extra.close()
            out = await first.step([expected[0]], 0, last_only=True)
            assert int(out.top1[-1]) == expected[1], "an open session was disturbed by the refusal"
            await first.close()
            await ring.until(lambda: ring.held() == [1, 1, 1])
            again = await client.open_session(GREEDY)
            assert await answer(again, PROMPT, 6) == expected
            await again.close()
            await second.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_full_later_stage_refuses_the_extra_session_and_frees_it_upstream() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=3)
        await ring.vanish(2)
        await ring.restart(2, max_sessions=1)
        client = ring.client()
        await client.connect()
        try:
            first = await client.open_session(GREEDY)
            await first.step(PROMPT, 0, last_only=True)
            extra = await client.open_session(GREEDY)
            with pytest.raises(FleetBusyError, match="toy2 already serves 1 sessions"):
                await extra.step(OTHER, 0, last_only=True)
            await ring.until(lambda: ring.held() == [1, 1, 1])
            await first.close()
            await extra.close()
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_parked_session_gives_its_place_to_a_new_one_and_its_head_hears_of_it() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=1)
        client = ring.client()
        await client.connect()
        try:
            kept = await client.open_session(GREEDY)
            await kept.step(PROMPT, 0, last_only=True)
            await kept.park()
            newcomer = await client.open_session(GREEDY)
            assert await answer(newcomer, OTHER, 6) == await reference(ring, OTHER, 6)
            assert ring.servers[0].table.evicted == 1
            with pytest.raises(SessionEvictedError, match=r"evicted this session, .*: its place went to a new session"):
                await kept.step([5], 0, last_only=True)
            assert not kept.usable()
            await newcomer.close()
            await kept.close()
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_an_active_session_is_never_evicted() -> None:
    async def main() -> None:
        ring = await ToyRing.start(max_sessions=1)
        client = ring.client()
        await client.connect()
        try:
            active = await client.open_session(GREEDY)
            await active.step(PROMPT, 0, last_only=True)
            newcomer = await client.open_session(GREEDY)
            with pytest.raises(FleetBusyError):
                await newcomer.step(OTHER, 0, last_only=True)
            await newcomer.close()
            expected = await reference(ring, PROMPT, 3)
            assert int((await active.step([expected[0]], 0, last_only=True)).top1[-1]) == expected[1]
            await active.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_vanished_head_leaves_no_session_on_any_stage() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        doomed, other = ring.client("10.9.0.66"), ring.client("10.9.0.77")
        await doomed.connect()
        await other.connect()
        try:
            for _ in range(2):
                session = await doomed.open_session(GREEDY)
                await session.step(PROMPT, 0, last_only=True)
            survivor = await other.open_session(GREEDY)
            await survivor.step(OTHER, 0, last_only=True)
            assert ring.held() == [3, 3, 3]
            ring.network.host("10.9.0.66").vanish()
            await ring.until(lambda: ring.held() == [1, 1, 1])
            expected = await reference(ring, OTHER, 4)
            assert int((await survivor.step([expected[0]], 0, last_only=True)).top1[-1]) == expected[1]
            await survivor.close()
        finally:
            await other.close()
            await doomed.close()
            await ring.stop()

    run(main)


def test_a_stage_lost_mid_answer_fails_that_answer_and_the_ring_heals_once_it_is_back() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        client = ring.client()
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            await session.step(PROMPT, 0, last_only=True)
            await ring.vanish(1)
            with pytest.raises(PeerUnavailableError):
                for _ in range(50):
                    await session.step([9], 0, last_only=True)
            await ring.until(lambda: ring.held()[0] == 0 and ring.held()[2] == 0)
            await ring.restart(1)
            healed = await client.open_session(GREEDY)  # reconnects: the ring answers again
            assert await answer(healed, PROMPT) == await reference(ring, PROMPT)
            await healed.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_head_whose_reconnect_failed_tries_again_at_its_next_session() -> None:
    """The first stage's PC stays away longer than one attempt to reach it (a frozen PC, a reboot): the
    attempt fails, and once the PC is back the next session reconnects, rather than finding a head that
    believes itself connected to nothing ("connect() first")."""

    async def main() -> None:
        ring = await ToyRing.start()
        client = ring.client()
        await client.connect()
        try:
            await ring.vanish(0)
            await ring.until(lambda: client.failure is not None)
            with pytest.raises(RingError, match="cannot join the ring"):
                await client.open_session(GREEDY, timeout=0.2)
            await ring.restart(0)
            healed = await client.open_session(GREEDY, timeout=2.0)
            assert await answer(healed, PROMPT) == await reference(ring, PROMPT)
            await healed.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_stages_come_up_in_any_order_and_the_ring_forms_once_all_are_there() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        await ring.vanish(2)
        await ring.vanish(1)
        try:
            await ring.until(lambda: ring.servers[0].status()["next_stage"] == "down")
            client = ring.client()
            await ring.restart(2)
            connecting = asyncio.ensure_future(client.connect())
            await ring.restart(1)
            await connecting
            await ring.until(lambda: ring.servers[0].status()["next_stage"] == "connected")
            session = await client.open_session(GREEDY)
            assert await answer(session, PROMPT) == await reference(ring, PROMPT)
            await session.close()
            await client.close()
        finally:
            await ring.stop()

    run(main)
