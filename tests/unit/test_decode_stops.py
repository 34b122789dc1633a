"""Where the head's generation loop (``decode``) ends: a stop token, inside a draft the target kept or not,
at every depth; the token budget; cancellation by the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from agent.head.adaptive_k import AdaptiveK
from agent.head.decode import DecodeStats, decode
from agent.head.drafters import Draft, NGramDrafter
from agent.sampling.params import SamplingParams
from tests.unit.scripted_target import ScriptedTarget, plain_greedy

PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
PLAIN = plain_greedy(PROMPT, 200)


class OracleDrafter:
    """Drafts the scripted model's own answer: every draft is kept, so most tokens arrive inside drafts."""

    blocking = False
    drafts_cheaply = False
    stops_on_belief = False

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return Draft(plain_greedy(list(context), k))

    def commit(self, context_len_kept: int) -> None:
        pass

    def reset(self) -> None:
        pass


def _decode(
    target: ScriptedTarget,
    stop_ids: frozenset[int],
    *,
    n: int = 200,
    depth: int = 1,
    drafter: str | None = "oracle",
    stats: DecodeStats | None = None,
) -> list[int]:
    made = {None: None, "ngram": NGramDrafter(), "oracle": OracleDrafter()}[drafter]
    # The oracle drafts a fixed 8: the first answer is token 0, then each step keeps 8 drafts and adds one.
    policy = AdaptiveK(k_max=8, k_initial=4, fixed=8 if drafter == "oracle" else None)

    async def go() -> list[int]:
        return [
            t
            async for t in decode(
                target,
                PROMPT,
                max_tokens=n,
                stop_ids=stop_ids,
                params=SamplingParams(),
                context_tokens=4096,
                drafter=made,  # type: ignore[arg-type]
                k_policy=policy,
                depth=depth,
                stats=stats,
                continue_above=0.0,
            )
        ]

    return asyncio.run(go())


def _first_late_token() -> tuple[int, int]:
    """A token that first appears well into the plain answer, and where."""
    for index, token in enumerate(PLAIN):
        if index >= 20 and token not in PLAIN[:index]:
            return token, index
    raise AssertionError("the scripted answer repeats every token early")


STOP, STOP_AT = _first_late_token()


def test_the_stop_token_arrives_inside_a_kept_draft() -> None:
    """What the oracle cases below rely on: the stop is neither the first answer nor a step's added token."""
    assert STOP_AT % 9 != 0


@pytest.mark.parametrize("drafter", [None, "ngram", "oracle"])
@pytest.mark.parametrize("depth", [1, 2])
def test_a_stop_token_ends_the_answer_without_being_yielded(drafter: str | None, depth: int) -> None:
    target = ScriptedTarget()
    stats = DecodeStats()
    out = _decode(target, frozenset({STOP}), depth=depth, drafter=drafter, stats=stats)
    assert out == PLAIN[:STOP_AT]
    if drafter is not None:
        assert stats.accepted > 0  # drafts were kept on the way, so the stop came through the speculative path
    # nothing was sent after the answer that carried the stop token: the held tokens end at most a draft past it
    assert len(target.held) <= len(PROMPT) + STOP_AT + 8 * depth


def test_a_stop_token_as_the_first_answer_yields_nothing() -> None:
    target = ScriptedTarget()
    assert _decode(target, frozenset({PLAIN[0]})) == []
    assert target.submitted == 1  # the prompt only


@pytest.mark.parametrize("drafter", [None, "ngram", "oracle"])
def test_the_token_budget_is_exact_even_inside_a_kept_draft(drafter: str | None) -> None:
    for n in (1, 2, 7, 33):
        assert _decode(ScriptedTarget(), frozenset(), n=n, drafter=drafter) == PLAIN[:n]


def test_closing_the_generator_mid_answer_stops_sending() -> None:
    """A head that cancels (the user pressed stop) sends nothing more after the tokens it took."""
    target = ScriptedTarget()

    async def go() -> tuple[list[int], int]:
        tokens = decode(
            target,
            PROMPT,
            max_tokens=200,
            stop_ids=frozenset(),
            params=SamplingParams(),
            context_tokens=4096,
            drafter=NGramDrafter(),
            k_policy=AdaptiveK(k_max=8, k_initial=4),
        )
        taken = [await anext(tokens) for _ in range(15)]
        sent = target.submitted
        await tokens.aclose()
        await asyncio.sleep(0)  # let anything the loop might still schedule run
        return taken, sent

    taken, sent = asyncio.run(go())
    assert taken == PLAIN[:15]
    assert target.submitted == sent
