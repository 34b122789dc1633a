"""A head's ring connection closed under an answer in flight (the plan moved the ring, issue 46's soak): the
step that waited on it fails at once, as a lost ring, so the chat replays it on the new ring, and the stages
free the session. Before, closing the client cancelled the session's watchdog and left its step waiting
forever: the soak's chaos saw a chat that never ended, and its sessions held on the stages."""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import PeerUnavailableError
from agent.head.ring_client import RingClient
from tests.middle.toy_ring import GREEDY, ToyRing, run

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
