"""A head's ring connection closed under an answer in flight (the plan moved the ring, issue 46's soak): the
step that waited on it fails at once, as a lost ring, so the chat replays it on the new ring, and the stages
free the session. Before, closing the client cancelled the session's watchdog and left its step waiting
forever: the soak's chaos saw a chat that never ended, and its sessions held on the stages. A request that opens
its session just as the ring moves gets a typed, transient error to retry, not ``RingError("connect() first")``,
which reached OpenAI API and chat users as ``HTTP 503 connect() first``."""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import PeerUnavailableError, RingMovedError
from agent.head.ring_client import RingClient
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, run

PROMPT = [1, 3, 9, 14, 22, 2, 4]


def test_a_step_in_flight_when_the_head_closes_its_ring_fails_at_once_and_the_stages_free_it() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        held_back: list[object] = []

        async def hold_back(running: object, output: object) -> None:  # the next stage is gone: no answer comes
            held_back.append(output)

        ring.servers[1]._deliver = hold_back  # type: ignore[method-assign]
        first, last = ring.servers[0].address, ring.servers[-1].address
        client = RingClient(ring.manifest, first, last, ring.network.host("10.9.0.100"), "h")
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            step = asyncio.ensure_future(session.step(PROMPT, 0, last_only=True))
            await ring.until(lambda: bool(held_back))
            await client.close()  # what the chat service does when the plan moves the ring
            with pytest.raises(PeerUnavailableError, match="ring connection was closed"):
                await asyncio.wait_for(step, 2.0)
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_a_session_opened_as_the_ring_moves_fails_as_a_moved_ring_to_retry() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        client = ring.client()
        await client.connect()
        try:
            opening = asyncio.ensure_future(client.open_session(GREEDY))
            await asyncio.sleep(0)  # it waits for its local sessions on the compute thread
            await client.close()  # the plan moved the ring meanwhile
            with pytest.raises(RingMovedError, match="transient, retry") as caught:
                await opening
            # a lost ring, as the chat service replays and maps to ``ring_unavailable`` (503)
            assert isinstance(caught.value, PeerUnavailableError)
            assert "connect()" not in str(caught.value)
            again = ring.client()  # the retry, on the ring as it is now
            await again.connect()
            retried = await again.open_session(GREEDY)
            assert await answer(retried, PROMPT) == await reference(ring, PROMPT)
            await retried.close()
            await again.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)
