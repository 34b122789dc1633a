"""Two chats that find the ring lost at once both ask the head to reconnect (issue 46's lab soak: a coordinator
restart as the fleet re-planned after a kill). The head must reach the ring once, not twice over: before, both
reconnects dialled, the second overwrote the first's connections without closing them, and a session opened on
an orphaned connection (``246c2b83decf3441``) was held by its stages until the end of the soak, as no close ever
came for it and the connection it was owned by never ended."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.errors import PeerUnavailableError
from tests.middle.toy_ring import GREEDY, answer, reference, ring_and_client, run

PROMPT = [1, 3, 9, 14, 22, 2, 4]


def test_chats_that_find_the_ring_lost_at_once_reconnect_it_once_and_every_session_is_freed() -> None:
    async def main() -> None:
        async with ring_and_client() as (ring, client):
            dialled: list[tuple[str, int]] = []
            dial = client._network.dial

            async def counted(address: tuple[str, int], **options: Any) -> Any:
                dialled.append(address)
                await asyncio.sleep(0.01)  # a real dial takes a while: the other chat runs meanwhile
                return await dial(address, **options)

            client._network.dial = counted  # type: ignore[method-assign]
            client.failure = PeerUnavailableError("ring connection lost: the test")  # both see a lost ring
            sessions = await asyncio.gather(*(client.open_session(GREEDY) for _ in range(3)))
            assert len(dialled) == 2  # the first stage and the last, once
            expected = await reference(ring, PROMPT)
            for session in sessions:
                assert await answer(session, PROMPT) == expected
                await session.close()
            await ring.until(lambda: ring.held() == [0, 0, 0])
            await client.close()
            first, last = ring.servers[0], ring.servers[-1]
            # no connection of this head is left open on a stage, to hold a session it opens
            await ring.until(lambda: not first._connections and not last.heads)

    run(main)
