"""The loop with a drafter that stops on its own chances: how far it may draft, and that output holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import Draft
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import VOCAB, ScriptedTarget, next_greedy, plain_greedy

PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]


class ConfidentDrafter:
    """A 'draft model' that is always sure of itself: right (the scripted continuation) or always wrong."""

    blocking = True
    drafts_cheaply = False
    stops_on_belief = True

    def __init__(self, right: bool) -> None:
        self.right = right
        self.asked: list[tuple[int, float]] = []

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        self.asked.append((k, min_belief))
        known = list(context)
        for _ in range(k):
            nxt = next_greedy(known)
            known.append(nxt if self.right else (nxt + 1) % VOCAB)
        return Draft(known[len(context) :])

    def commit(self, context_len_kept: int) -> None:
        pass

    def reset(self) -> None:
        pass


def _decode(drafter: ConfidentDrafter, stats: DecodeStats, belief_stop: bool = True) -> list[int]:
    async def go() -> list[int]:
        return [
            t
            async for t in decode(
                ScriptedTarget(),
                PROMPT,
                max_tokens=120,
                stop_ids=frozenset(),
                params=SamplingParams(),
                context_tokens=4096,
                drafter=drafter,  # type: ignore[arg-type]
                k_policy=AdaptiveK(k_max=12, k_initial=2),
                stats=stats,
                belief_stop=belief_stop,
            )
        ]

    return asyncio.run(go())


def test_a_believed_drafter_drafts_past_the_controllers_k_where_drafting_pays() -> None:
    drafter, stats = ConfidentDrafter(right=True), DecodeStats()
    assert _decode(drafter, stats) == plain_greedy(PROMPT, 120)
    asked = [k for k, _ in drafter.asked]
    assert max(asked) == 12  # k_max: the drafter's own chances, not one K per class, decide the length
    assert all(floor > 0 for _, floor in drafter.asked)
    # without belief stops the controller's K holds; it starts at k_initial and must learn its way up
    plain_drafter = ConfidentDrafter(right=True)
    assert _decode(plain_drafter, DecodeStats(), belief_stop=False) == plain_greedy(PROMPT, 120)
    assert plain_drafter.asked[0][0] == 2 and all(floor == 0.0 for _, floor in plain_drafter.asked)


def test_a_confidently_wrong_drafter_is_held_to_the_measured_acceptance() -> None:
    drafter, stats = ConfidentDrafter(right=False), DecodeStats()
    assert _decode(drafter, stats) == plain_greedy(PROMPT, 120)
    assert stats.accepted == 0
    # its confidence would draft 12 every step; after a few rejections the controller's best K is at most
    # 1 (positions cost next to nothing here), which caps the stretch at 3
    late = [k for k, _ in drafter.asked[6:]]
    assert late and max(late) <= 3 and drafter.asked[0][0] > 3
