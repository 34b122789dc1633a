"""Prompt-lookup (n-gram) drafting."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from agent.head.drafters import Draft, Drafter, HybridDrafter, NGramDrafter


def _brute_force(context: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The definition, without an index: most recent earlier match of the longest suffix, copied onwards."""
    length = len(context)
    for n in range(max_ngram, min_ngram - 1, -1):
        if n > length:
            continue
        suffix = context[length - n :]
        for follow in range(length - 1, n - 1, -1):
            if context[follow - n : follow] == suffix:
                extended = list(context)
                for j in range(k):
                    extended.append(extended[follow + j])
                return extended[length:]
    return []


def test_is_a_drafter() -> None:
    drafter: Drafter = NGramDrafter()
    assert drafter.propose([1, 2, 3], 4) == Draft([], None)


def test_finds_a_repetition() -> None:
    context = [5, 1, 2, 3, 4, 9, 9, 1, 2]
    assert NGramDrafter().propose(context, 2).tokens == [3, 4]


def test_proposes_at_most_k_and_nothing_for_k_zero() -> None:
    context = [1, 2, 3, 4, 5, 6, 1, 2]
    drafter = NGramDrafter()
    assert drafter.propose(context, 3).tokens == [3, 4, 5]
    assert drafter.propose(context, 0).tokens == []


def test_prefers_the_longest_ngram() -> None:
    # The 1-gram (3,) last occurred before 7; the 3-gram (1, 2, 3) before 8: the longer match wins.
    context = [1, 2, 3, 8, 0, 3, 7, 0, 1, 2, 3]
    assert NGramDrafter(max_ngram=3).propose(context, 1).tokens == [8]
    assert NGramDrafter(max_ngram=1).propose(context, 1).tokens == [7]


def test_prefers_the_most_recent_match() -> None:
    context = [1, 2, 10, 1, 2, 20, 1, 2, 30, 1, 2]
    assert NGramDrafter().propose(context, 1).tokens == [30]


def test_no_match_proposes_nothing() -> None:
    assert NGramDrafter().propose([1, 2, 3, 4], 5).tokens == []
    assert NGramDrafter(min_ngram=2).propose([1, 2, 3, 1], 5).tokens == []
    assert NGramDrafter().propose([], 5).tokens == []


def test_a_match_reaching_the_end_continues_periodically() -> None:
    assert NGramDrafter().propose([7, 7, 7], 4).tokens == [7, 7, 7, 7]
    assert NGramDrafter().propose([0, 1, 2, 1, 2], 5).tokens == [1, 2, 1, 2, 1]


def test_growing_context_is_indexed_incrementally() -> None:
    drafter = NGramDrafter()
    context = [4, 5, 6]
    assert drafter.propose(context, 2).tokens == []
    context += [7, 4, 5]
    assert drafter.propose(context, 2).tokens == [6, 7]
    context += [6, 9]
    assert drafter.propose(context, 2).tokens == _brute_force(context, 2, 3, 1)


def test_commit_rewinds_the_index() -> None:
    drafter = NGramDrafter()
    context = [1, 2, 3, 1, 2, 4, 1, 2]
    assert drafter.propose(context, 1).tokens == [4]
    drafter.commit(5)  # [1, 2, 3, 1, 2] kept: the "1 2 -> 4" occurrence is gone
    context = [1, 2, 3, 1, 2, 5, 1, 2]
    assert drafter.propose(context, 1).tokens == [5]
    drafter.commit(3)
    assert drafter.propose([1, 2, 3, 1, 2], 2).tokens == [3, 1]


def test_a_shorter_or_different_context_rebuilds_the_index() -> None:
    drafter = NGramDrafter()
    assert drafter.propose([1, 2, 3, 1, 2, 4, 1, 2], 1).tokens == [4]
    assert drafter.propose([1, 2, 3, 1, 2], 1).tokens == [3]  # shorter, no commit
    assert drafter.propose([9, 2, 3, 9, 2, 8, 9, 2], 1).tokens == [8]  # same length, other tokens
    drafter.reset()
    assert drafter.propose([6, 6], 1).tokens == [6]


def test_accepts_numpy_contexts() -> None:
    assert NGramDrafter().propose(np.array([3, 4, 5, 3, 4], dtype=np.int64), 2).tokens == [5, 3]


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_matches_the_definition_on_random_growth_and_rewinds(max_ngram: int, min_ngram: int) -> None:
    rng = np.random.default_rng(max_ngram * 10 + min_ngram)
    drafter = NGramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    context: list[int] = []
    for _ in range(300):
        if context and rng.random() < 0.1:
            kept = int(rng.integers(0, len(context)))
            context = context[:kept]
            drafter.commit(kept)
        context += rng.integers(0, 6, size=int(rng.integers(1, 4))).tolist()
        k = int(rng.integers(0, 6))
        assert drafter.propose(context, k).tokens == _brute_force(context, k, max_ngram, min_ngram)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        NGramDrafter(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError):
        NGramDrafter(min_ngram=0)
    with pytest.raises(ValueError):
        NGramDrafter().propose([1], -1)
    with pytest.raises(ValueError):
        NGramDrafter().commit(-1)


def test_evidence_grows_with_the_length_of_the_copied_match() -> None:
    # (1, 2) matched, and the tokens before the two occurrences differ (5 vs 9): a 2-token match.
    assert NGramDrafter().propose([5, 1, 2, 3, 4, 9, 9, 1, 2], 2).evidence == (2).bit_length()
    # the last 10 tokens repeat tokens 0..9 verbatim: a 10-token match, whatever max_ngram is
    copy = [*range(20), 99, *range(10)]
    assert NGramDrafter(max_ngram=3).propose(copy, 2).evidence == (10).bit_length()
    # capped: a very long repetition counts as MATCH_CAP tokens
    long_copy = [*range(100), *range(60)]
    assert NGramDrafter().propose(long_copy, 1).evidence == NGramDrafter.MATCH_CAP.bit_length()
    assert NGramDrafter().propose([1, 2, 3], 2).evidence is None


def test_truncated_keeps_evidence_and_distributions() -> None:
    draft = Draft([1, 2, 3], None, evidence=3)
    assert draft.truncated(2) == Draft([1, 2], None, evidence=3)
    assert draft.truncated(0).tokens == []


def test_drafting_past_the_context_then_rejecting_matches_the_definition() -> None:
    """Pipelined speculation looks drafts up past the final context, then keeps some of them: the index
    must forget the rest exactly (undone, not rebuilt) and keep matching the brute-force definition."""
    rng = np.random.default_rng(7)
    drafter = NGramDrafter(max_ngram=4)
    context: list[int] = rng.integers(0, 5, size=12).tolist()
    for _ in range(200):
        drafter.commit(len(context))  # everything so far is final
        speculative = context + rng.integers(0, 5, size=int(rng.integers(1, 6))).tolist()
        k = int(rng.integers(1, 5))
        assert drafter.propose(speculative, k).tokens == _brute_force(speculative, k, 4, 1)
        kept = int(rng.integers(len(context), len(speculative) + 1))
        drafter.commit(kept)
        context = speculative[:kept] + rng.integers(0, 5, size=int(rng.integers(0, 3))).tolist()
        assert drafter.propose(context, k).tokens == _brute_force(context, k, 4, 1)


class _ScriptedModel:
    """A model drafter stand-in that records what it was asked (the hybrid's routing is under test)."""

    blocking = True
    drafts_cheaply = False
    stops_on_belief = True

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.floors: list[float] = []
        self.committed: list[int] = []

    def propose(
        self, context: list[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        self.asked.append((len(context), k))
        self.floors.append(min_belief)
        return Draft([900 + i for i in range(k)])

    def commit(self, context_len_kept: int) -> None:
        self.committed.append(context_len_kept)

    def reset(self) -> None:
        self.asked.clear()


def test_hybrid_copies_long_repeats_and_asks_the_model_elsewhere() -> None:
    model = _ScriptedModel()
    hybrid = HybridDrafter(NGramDrafter(), model, min_evidence=4, model_k=3)
    # a 10-token stretch repeated: the match before the end is 10 tokens long (evidence 4)
    stretch = list(range(10, 20))
    copied = hybrid.propose([1, *stretch, 2, *stretch], 5)
    assert copied.tokens == [2, 10, 11, 12, 13] and copied.evidence == 4
    assert model.asked == []
    # a one-token coincidence (evidence 1) goes to the model, capped at model_k, in its own class
    drafted = hybrid.propose([5, 6, 7, 5], 6)
    assert drafted.tokens == [900, 901, 902] and drafted.evidence == HybridDrafter.MODEL_EVIDENCE
    assert model.asked == [(4, 3)]
    # nothing to copy at all: the model again
    assert hybrid.propose([40, 41, 42], 2).tokens == [900, 901]
    # where the loop would send no model draft (K 0 for its class), the model is not run at all
    asked = len(model.asked)
    skipped = hybrid.propose_sized(
        [40, 41, 42], 6, lambda evidence: 0 if evidence == HybridDrafter.MODEL_EVIDENCE else 6
    )
    assert skipped.tokens == [] and len(model.asked) == asked
    assert hybrid.propose_sized([40, 41, 42], 6, lambda evidence: 2).tokens == [900, 901]
    # a belief floor goes to the model, which may cut its draft by it (this scripted one never does)
    assert hybrid.propose_sized([40, 41, 42], 6, lambda evidence: 16, 0.3).tokens == [900, 901, 902]
    assert model.floors[-1] == 0.3 and model.floors[-2] == 0.0
    assert hybrid.propose_sized([40, 41, 42], 6, lambda evidence: 0, 0.3).tokens == []
    hybrid.commit(3)
    assert model.committed == [3]
    with pytest.raises(ValueError):
        HybridDrafter(NGramDrafter(), model, min_evidence=0)
