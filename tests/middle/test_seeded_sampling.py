"""Sampling with a seed repeats (issue 22 §2): the same seed, prompt and settings give the same tokens whatever
the drafter (none, n-gram, a draft model), K, the pipelining depth, or whether a kept session was reused;
another seed gives another text. Draws are keyed by position (``agent.sampling.keyed``)."""

from __future__ import annotations

from pathlib import Path

from agent.chat_client.protocol import ChatRequest
from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import NGramDrafter
from agent.head.model_drafter import ModelDrafter
from agent.sampling.params import SamplingParams
from tests.middle.toy_ring import ToyRing, run
from tests.support.toy_model import ToyStage, ToyTokenizer, whole_model

PROMPT = [1, 3, *([7, 8, 9, 10] * 5), 2, 4]
WARM = SamplingParams(temperature=0.8, top_p=0.95, seed=1234)


def test_a_seed_gives_one_text_whatever_the_drafter_k_and_depth() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        client = ring.client()
        await client.connect()

        async def sample(drafter: object, k: int | None, depth: int, params: SamplingParams = WARM) -> list[int]:
            session = await client.open_session(params)
            stats = DecodeStats()
            tokens = [
                t
                async for t in decode(
                    session,
                    PROMPT,
                    max_tokens=40,
                    stop_ids=frozenset(),
                    params=params,
                    context_tokens=256,
                    drafter=drafter,  # type: ignore[arg-type]
                    k_policy=AdaptiveK(fixed=k) if k is not None else None,
                    stats=stats,
                    depth=depth,
                )
            ]
            await session.close()
            if drafter is not None:
                assert stats.drafted > 0, "nothing was drafted: the test would not test drafting"
            return tokens

        try:
            plain = await sample(None, None, 1)
            assert len(set(plain)) > 5
            for k in (1, 3, 6):
                assert await sample(NGramDrafter(), k, 1) == plain, f"n-gram, K={k}"
            assert await sample(NGramDrafter(), 4, 2) == plain, "n-gram, pipelined"
            draft_model = ToyStage(whole_model(ring.manifest), ring.weights)
            assert await sample(ModelDrafter(draft_model, WARM), 3, 1) == plain, "a draft model"  # type: ignore[arg-type]
            other = SamplingParams(temperature=0.8, top_p=0.95, seed=99)
            assert await sample(None, None, 1, other) != plain
        finally:
            await client.close()
            await ring.stop()

    run(main, timeout=60)


def test_a_seeded_chat_repeats_and_its_done_event_names_the_seed(tmp_path: Path) -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        daemon = await ring.chat_agent(tmp_path, prefill_chunk=4)  # the kept turn reuses whole chunks of 4
        assert daemon.chats is not None
        try:

            async def ask(seed: int | None, *turns: tuple[str, str]) -> tuple[list[int], dict[str, object]]:
                request = ChatRequest(
                    token=daemon.chats.token,
                    messages=turns,
                    max_tokens=20,
                    temperature=0.9,
                    seed=seed,  # type: ignore[union-attr]
                )
                events = [e async for e in daemon.chats.answer(request)]  # type: ignore[union-attr]
                assert events[-1].event == "done", events[-1]
                return [e.id for e in events if e.event == "token" and e.id is not None], events[-1].stats

            first, stats = await ask(7, ("user", "tell me"))
            assert stats["seed"] == 7
            text = ToyTokenizer().decode(first)
            follow = (("user", "tell me"), ("assistant", text), ("user", "more"))
            reused, stats = await ask(7, *follow)  # takes over the kept session
            assert stats["cached_tokens"], stats
            await daemon.chats.kept.close_all()  # type: ignore[union-attr]
            fresh, stats = await ask(7, *follow)  # the same turn on a fresh session
            assert stats["cached_tokens"] == 0, stats
            assert reused == fresh
            _, unseeded = await ask(None, ("user", "tell me"))
            assert isinstance(unseeded["seed"], int)  # an answer without a seed says which it drew
        finally:
            await daemon.stop()
            await ring.stop()

    run(main, timeout=60)
