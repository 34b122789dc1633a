"""Ring life cycle: bring-up in any order, a stage that dies and comes back, cancellation by the head."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import FleetBusyError, RingError
from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import decode
from tests.integration.ring_lab import AgentProcess, Fleet, free_port, start_agent, status, wait_for
from tests.integration.test_ring import GREEDY, _client, _decoding, _generate

pytestmark = pytest.mark.ring


def _tokens(folder: Path, ring: list[AgentProcess], fleet: Fleet, prompt: list[int], n: int) -> list[int]:
    async def run() -> list[int]:
        client = _client(folder, ring, fleet.identity("head"))
        await client.connect()
        try:
            return await _generate(client, prompt, n=n)
        finally:
            await client.close()

    return asyncio.run(run())


def test_first_stage_up_before_its_successor_then_successor_restarts(
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
) -> None:
    folder = exported(2, "fp32")
    port = free_port()
    observer = fleet.identity("observer")
    first = start_agent(folder, 0, fleet.identity("early0"), cache_dir, next_address=("127.0.0.1", port))
    agents = [first]
    try:
        assert status(first.address, observer)["next_stage"] == "down"
        second = start_agent(folder, 1, fleet.identity("late1"), cache_dir, extra=["--listen", f"127.0.0.1:{port}"])
        agents.append(second)
        wait_for(lambda: status(first.address, observer)["next_stage"] == "connected", 20, "stage 0 to find stage 1")
        before = _tokens(folder, agents, fleet, chat_ids[0], 24)

        # The successor dies in the middle of a generation: the head gets an error, not a hang. The stage comes
        # back on the same port: stage 0 re-dials it, and the same head, reconnecting, is answered as before.
        async def interrupted_then_reconnected() -> list[int]:
            client = _client(folder, agents, fleet.identity("head"))
            await client.connect()
            try:
                session = await client.open_session(GREEDY)
                produced = 0
                with pytest.raises(RingError):
                    async for _ in decode(
                        session,
                        chat_ids[1],
                        max_tokens=2000,
                        stop_ids=frozenset(),
                        params=GREEDY,
                        context_tokens=client.manifest.context_tokens,
                        k_policy=AdaptiveK(fixed=0),
                    ):
                        produced += 1
                        if produced == 5:
                            os.kill(second.process.pid, signal.SIGKILL)
                await session.close()
                await asyncio.to_thread(restart_second)
                assert client.failure is not None, "the head did not notice the lost stage"
                again = await client.open_session(GREEDY)
                try:
                    return [t async for t in _decoding(again, client, chat_ids[0], n=24)]
                finally:
                    await again.close()
            finally:
                await client.close()

        def restart_second() -> None:
            second.process.wait(10)
            wait_for(lambda: status(first.address, observer)["next_stage"] == "down", 10, "stage 0 to notice")
            assert status(first.address, observer)["sessions"] == [], "the broken session was not freed on stage 0"
            agents[1] = start_agent(
                folder, 1, fleet.identity("late1"), cache_dir, extra=["--listen", f"127.0.0.1:{port}"]
            )
            wait_for(lambda: status(first.address, observer)["next_stage"] == "connected", 20, "stage 0 to reconnect")

        assert asyncio.run(asyncio.wait_for(interrupted_then_reconnected(), 120)) == before
        assert _tokens(folder, agents, fleet, chat_ids[0], 24) == before  # and a new head too
    finally:
        for agent in agents:
            agent.stop()
    assert any("lost next stage" in line for line in first.log)


def test_cancelled_generation_frees_every_stage(
    ring3: list[AgentProcess],
    exported: Callable[..., Path],
    fleet: Fleet,
    chat_ids: list[list[int]],
) -> None:
    folder = exported(3, "fp32")
    observer = fleet.identity("observer")

    async def run() -> list[int]:
        client = _client(folder, ring3, fleet.identity("head"))
        await client.connect()
        try:
            produced = asyncio.Event()

            async def long_answer() -> None:
                session = client.session(GREEDY)
                try:
                    async for _ in decode(
                        session,
                        chat_ids[2],
                        max_tokens=2000,
                        stop_ids=frozenset(),
                        params=GREEDY,
                        context_tokens=client.manifest.context_tokens,
                    ):
                        produced.set()
                finally:
                    await session.close()

            task = asyncio.get_running_loop().create_task(long_answer())
            await asyncio.wait_for(produced.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the same head goes on with a new session
            return await _generate(client, chat_ids[0], n=8)
        finally:
            await client.close()

    tokens = asyncio.run(run())
    assert len(tokens) == 8
    wait_for(
        lambda: not any(status(a.address, observer)["sessions"] for a in ring3),
        10,
        "every stage to free the cancelled session",
    )


def test_a_full_later_stage_refuses_only_the_extra_session(
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    chat_ids: list[list[int]],
) -> None:
    """Stage 1 holds one session, stage 0 three: the second session is refused by stage 1, the refusal reaches
    its head as "fleet busy", stage 0 frees what it had opened for it, and the first session carries on."""
    folder = exported(2, "fp32")
    observer = fleet.identity("observer")
    last = start_agent(folder, 1, fleet.identity("busy1"), cache_dir, extra=["--max-sessions", "1"])
    first = start_agent(
        folder, 0, fleet.identity("busy0"), cache_dir, next_address=last.address, extra=["--max-sessions", "3"]
    )
    agents = [first, last]
    try:
        wait_for(lambda: status(first.address, observer)["next_stage"] == "connected", 20, "stage 0 to find stage 1")
        alone = _tokens(folder, agents, fleet, chat_ids[0], 12)

        async def run() -> tuple[list[int], list[object], str]:
            client = _client(folder, agents, fleet.identity("head"))
            await client.connect()
            try:
                holder = client.session(GREEDY)
                answer = _decoding(holder, client, chat_ids[0], n=12)
                tokens = [await anext(answer)]
                extra = client.session(GREEDY)
                with pytest.raises(FleetBusyError, match="fleet busy: busy1"):
                    await extra.step(chat_ids[1], 0, last_only=True)
                await extra.close()
                held = await asyncio.to_thread(lambda: [status(a.address, observer)["sessions"] for a in agents])
                tokens += [t async for t in answer]
                await holder.close()
                return tokens, held, f"{holder.id:016x}"
            finally:
                await client.close()

        tokens, held, holder_id = asyncio.run(run())
        assert tokens == alone
        assert held == [[holder_id], [holder_id]], "the refused session left state behind"
    finally:
        for agent in agents:
            agent.stop()
