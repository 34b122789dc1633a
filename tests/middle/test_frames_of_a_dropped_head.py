"""Frames a stage had taken in from a head's connection, and not handled yet, when that connection dropped (issue 46's
lab soak: pc3 cut off 3.3 s; stage 0, re-planned, aborted its ring peers). Stage 0's worker was held by another
session meanwhile, so a replayed chat's OPEN (``0863d638bd0e0647``) waited in its queue while the connection's
clean-up freed the sessions it owned. Handled after, the OPEN opened a session owned by a connection already gone
and passed it on; the head, reconnected meanwhile, was reachable from the last stage, which took it too. Stages 0,
1 and 2 held it to the end of the soak: no close could ever come for it."""

from __future__ import annotations

import asyncio

from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, run

PROMPT = [1, 3, 9, 14, 22, 9, 14, 31, 2, 4]


def test_a_session_whose_open_was_queued_when_its_head_dropped_is_never_held() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        first = ring.servers[0]
        ring.stages[0].prefill_seconds = 0.5  # stage 0's worker is busy with one prompt while the next one queues
        client = ring.client()
        await client.connect()
        try:
            busy, queued = await client.open_session(GREEDY), await client.open_session(GREEDY)
            computing = asyncio.create_task(busy.step(PROMPT, 0, last_only=True))
            await ring.until(lambda: busy.id in first._running)
            waiting = asyncio.create_task(queued.step(PROMPT, 0, last_only=True))
            await ring.until(lambda: first.status()["queued"] >= 2)  # its OPEN and STEP, behind the busy step
            (head,) = first._ring_peers
            head.abort()  # as a re-planned stage drops its ring peers: the head's frames are still queued on it
            outcomes = await asyncio.gather(computing, waiting, return_exceptions=True)
            assert all(isinstance(outcome, Exception) for outcome in outcomes), outcomes
            # the head replays on a new connection, while stage 0 still computes the busy step
            await client.reconnect()
            assert first.status()["queued"] >= 2, "the test's premise: the OPEN is handled after the reconnect"
            again = await client.open_session(GREEDY)
            assert await answer(again, PROMPT, 6) == await reference(ring, PROMPT, 6)
            await again.close()
            # every stage frees every session: none is opened for a connection whose clean-up is done
            await ring.until(lambda: ring.held() == [0, 0, 0] and not first.status()["queued"])
            await asyncio.sleep(0.3)  # nor later (a session opened late reaches the next stages later)
            assert ring.held() == [0, 0, 0]
        finally:
            await client.close()
            await ring.stop()

    run(main)
