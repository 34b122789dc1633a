"""Pipelined prefill (``agent.head.prefill``): a long prompt goes round the ring in chunks, back to back.

The answer must be the whole model's token for token; every stage must compute the chunks (not one step);
the head hears each chunk's progress; and the stages overlap: stage 1 works on a chunk while stage 0
computes the next, so the prompt takes far less than the stages' times added up.
"""

from __future__ import annotations

import time

import pytest

from agent.head.prefill import prefill_chunks
from agent.head.ring_client import RingClient
from tests.middle.toy_ring import GREEDY, ToyRing, answer, reference, run

PROMPT = [1, 3, *range(5, 45), 2, 4]  # 44 positions


def test_chunks_end_at_multiples_of_the_chunk_size_wherever_the_prompt_starts_and_cover_it() -> None:
    assert prefill_chunks(0, 44, 0) == [44]
    assert prefill_chunks(0, 44, 44) == [44]
    assert prefill_chunks(0, 44, 10) == [10, 10, 10, 10, 4]
    assert prefill_chunks(20, 24, 10) == [10, 10, 4]  # a kept session resumed at a boundary: the same last chunks
    assert prefill_chunks(17, 27, 10) == [3, 10, 10, 4]
    assert prefill_chunks(17, 500, 0) == [500]
    for start in range(0, 30):
        for positions in range(1, 130):
            for chunk in (1, 7, 64):
                sizes = prefill_chunks(start, positions, chunk)
                ends = [start + sum(sizes[: i + 1]) for i in range(len(sizes))]
                assert sum(sizes) == positions and max(sizes) <= chunk and min(sizes) >= 1
                assert all(end % chunk == 0 for end in ends[:-1])
    with pytest.raises(ValueError):
        prefill_chunks(0, 0, 10)


def _client(ring: ToyRing, chunk: int) -> RingClient:
    client = ring.client()
    client.prefill_chunk = chunk
    return client


def test_a_chunked_prompt_gives_the_whole_models_answer_and_tells_its_progress() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        client = _client(ring, 10)
        await client.connect()
        try:
            expected = await reference(ring, PROMPT)
            session = await client.open_session(GREEDY)
            told: list[tuple[int, int]] = []
            session.watch_prefill(lambda done, total: told.append((done, total)))
            assert await answer(session, PROMPT) == expected
            assert told == [(10, 44), (20, 44), (30, 44), (40, 44)]
            assert session.prefill_progress is None
            for stage in ring.stages:
                assert stage.steps[:5] == [10, 10, 10, 10, 4], stage.steps
            await session.close()
        finally:
            await client.close()
            await ring.stop()

    run(main)


def test_the_stages_compute_the_chunks_of_a_prompt_at_the_same_time() -> None:
    async def main() -> tuple[float, float]:
        ring = await ToyRing.start()
        for stage in ring.stages:
            stage.prefill_seconds = 0.2  # each step of a prompt takes this long on its stage's thread
        timings = []
        try:
            for chunk in (0, 11):  # one step, then 4 chunks
                client = _client(ring, chunk)
                await client.connect()
                session = await client.open_session(GREEDY)
                started = time.perf_counter()
                await session.step(PROMPT, 0, last_only=True)
                timings.append(time.perf_counter() - started)
                await session.close()
                await client.close()
        finally:
            await ring.stop()
        return timings[0], timings[1]

    whole, chunked = run(main)
    # one step: 3 stages x 0.2 s; 4 chunks one after another would be 12 x 0.2 s, pipelined (4 + 2) x 0.2 s
    assert whole >= 0.6
    assert chunked < 1.9, f"4 chunks over 3 stages took {chunked:.2f} s: the stages did not overlap"
