"""Drafters propose the next few tokens cheaply; the ring's target model then verifies them in one trip.

``Drafter`` is the protocol the generation loop uses; ``NGramDrafter`` is prompt-lookup decoding, which
needs no model: text that repeats earlier context (code, quotes, lists, summaries) is guessed from
what followed the previous occurrence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agent.sampling.distribution import SparseDistribution

DRAFTERS = ("auto", "none", "ngram", "draft", "ngram+draft")
"""Drafter names a head accepts (``agent.head.drafting.make_drafter`` builds them)."""


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    # The distribution each token was sampled from (same length as tokens), or None when the drafter is
    # deterministic (speculative sampling then treats q as one-hot on the drafted token).
    dists: list[SparseDistribution] | None = None
    # How strongly the drafter believes this draft, as a small class (None: no such signal). Drafts of
    # one class are accepted at similar rates, so the K controller keeps one acceptance estimate per class.
    evidence: int | None = None

    def truncated(self, k: int) -> Draft:
        """The first ``k`` tokens of this draft (and their distributions)."""
        return Draft(self.tokens[:k], None if self.dists is None else self.dists[:k], self.evidence)


class Drafter(Protocol):
    # True when proposing runs inference: the loop then calls propose() off the event loop.
    blocking: bool
    # True when proposing k tokens costs about the same as proposing one (a lookup, not a model): the loop
    # then asks for the longest draft it could use and cuts it to the K chosen for the draft's evidence.
    drafts_cheaply: bool
    # True when propose() also takes ``min_belief`` (a :class:`BeliefDrafter`): the drafter then decides
    # each draft's length by its own chances, and the loop asks for the longest draft it could use.
    stops_on_belief: bool

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to ``k`` tokens likely to follow ``context`` (all final tokens: prompt and emitted so far)."""
        ...

    def commit(self, context_len_kept: int) -> None:
        """The first ``context_len_kept`` tokens of the context are final; a stateful drafter rewinds past them."""
        ...

    def reset(self) -> None:
        """Forget everything: the next context is a new conversation."""
        ...


class BeliefDrafter(Drafter, Protocol):
    """A drafter that knows its chances (a draft model): it may stop before ``k`` where they run low."""

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        """As :meth:`Drafter.propose`, stopping before the first token at which the drafter's own chance
        that every drafted token so far is right falls below ``min_belief``, or where ``stop()``, asked
        between tokens, says so."""
        ...


class NGramDrafter:
    """Prompt-lookup decoding over an incrementally maintained n-gram index.

    For n from ``max_ngram`` down to ``min_ngram``, find the most recent earlier occurrence of the last
    n tokens and propose what followed it. The index maps each n-gram to the position right after its
    latest occurrence that has a follower, so a lookup is one dict access per n and growing the
    context by one token costs one insert per n.

    Each draft's ``evidence`` is the bit length of the match length: how many tokens before the context's
    end agree with the tokens before the copied occurrence (counted up to ``MATCH_CAP``). A copy that has
    held for 20 tokens is far likelier to continue than a one-token coincidence, and measured on a
    code-editing answer the per-class acceptance separates well (see docs/benchmarks.md).
    """

    blocking = False
    drafts_cheaply = True
    stops_on_belief = False
    MATCH_CAP = 32

    def __init__(self, max_ngram: int = 8, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        # What each not-yet-final token overwrote in the index, so drafts that were looked up past the
        # context (pipelined speculation) and then rejected are taken out again without a rebuild.
        self._undo: list[list[tuple[int, tuple[int, ...], int | None]]] = []
        self._final = 0
        self.reset()

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self._sync(context)
        if k == 0:
            return Draft([])
        tokens = self._tokens
        length = len(tokens)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if n > length:
                continue
            follow = self._index[n].get(tuple(tokens[length - n :]))
            if follow is not None:
                return Draft(self._continue_from(follow, k), evidence=self._match_length(follow, n).bit_length())
        return Draft([])

    def commit(self, context_len_kept: int) -> None:
        if context_len_kept < 0:
            raise ValueError(f"context_len_kept must be >= 0, got {context_len_kept}")
        if context_len_kept < len(self._tokens):
            self._truncate(context_len_kept)
        final = min(context_len_kept, len(self._tokens))
        if final > self._final:
            del self._undo[: final - self._final]
            self._final = final

    def reset(self) -> None:
        self._tokens = []
        self._index = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._undo = []
        self._final = 0

    def _truncate(self, length: int) -> None:
        """Forget the tokens from ``length`` on, restoring what they overwrote in the index."""
        if length < self._final:
            self._rebuild(self._tokens[:length])
            return
        while len(self._tokens) > length:
            self._tokens.pop()
            for n, key, previous in reversed(self._undo.pop()):
                if previous is None:
                    del self._index[n][key]
                else:
                    self._index[n][key] = previous

    def _match_length(self, follow: int, n: int) -> int:
        """How many tokens before the end equal those before ``follow`` (at least the matched ``n``)."""
        tokens, length = self._tokens, len(self._tokens)
        m = n
        while m < self.MATCH_CAP and follow - 1 - m >= 0 and tokens[follow - 1 - m] == tokens[length - 1 - m]:
            m += 1
        return m

    def _continue_from(self, follow: int, k: int) -> list[int]:
        """The k tokens after position ``follow``, continued as an overlapping copy past the context's end.

        The match says the text repeats with period ``d = len - follow``; once the copy reaches the
        end of the context it keeps copying its own output (as LZ77 does), so a short period such as
        ``a b a b`` still yields k tokens instead of stopping at the context's end.
        """
        tokens = self._tokens
        length = len(tokens)
        period = length - follow
        out: list[int] = []
        for j in range(k):
            pos = follow + j
            out.append(tokens[pos] if pos < length else out[j - period])
        return out

    def _sync(self, context: Sequence[int]) -> None:
        """Bring the index up to ``context``: extend it, or rebuild it when the context is not a continuation."""
        have = len(self._tokens)
        # Callers rewind through commit(); a shorter context or a changed last token is a cheap safety net
        # against a forgotten commit/reset (a stale index would only waste drafts, never change output).
        if len(context) < have or (have and int(context[have - 1]) != self._tokens[-1]):
            self._rebuild([int(t) for t in context])
        else:
            self._extend([int(t) for t in context[have:]])

    def _rebuild(self, tokens: list[int]) -> None:
        self.reset()
        self._extend(tokens)

    def _extend(self, new_tokens: list[int]) -> None:
        tokens = self._tokens
        for token in new_tokens:
            follow = len(tokens)  # the position of `token`: every n-gram ending just before it now has a follower
            tokens.append(token)
            undo = []
            for n, index in self._index.items():
                if follow >= n:
                    key = tuple(tokens[follow - n : follow])
                    undo.append((n, key, index.get(key)))
                    index[key] = follow
            self._undo.append(undo)


class HybridDrafter:
    """The n-gram drafter where the context repeats at length, a model everywhere else.

    A copy the n-gram index has matched over at least ``min_evidence`` (bit length of the match length;
    4 = eight tokens or more) is drafted from the context; shorter matches and new text go to the model,
    which drafts at most ``model_k`` tokens. Model drafts carry the evidence class ``MODEL_EVIDENCE``,
    so the K controller learns their acceptance apart from the copies'. Replayed on a Qwen-1.5B
    code-editing answer with SmolLM2-135M drafting, long copies from the context and the model elsewhere
    needed 34 verification steps for 128 tokens, the n-gram drafter alone 60 (docs/benchmarks.md).
    """

    blocking = True
    drafts_cheaply = True  # the loop asks for up to k_max and cuts by evidence; the model drafts <= model_k
    stops_on_belief = True  # its model's drafts do, with the floor the loop passes to propose_sized
    MODEL_EVIDENCE = 0  # the n-gram drafter's classes start at 1 (a match of one token)

    def __init__(self, ngram: NGramDrafter, model: BeliefDrafter, *, min_evidence: int = 4, model_k: int = 8) -> None:
        if min_evidence < 1 or model_k < 1:
            raise ValueError("min_evidence and model_k must be at least 1")
        self.ngram, self.model = ngram, model
        self.min_evidence, self.model_k = min_evidence, model_k

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return self.propose_sized(context, k, lambda evidence: k)

    def propose_sized(
        self,
        context: Sequence[int],
        k: int,
        k_for: Callable[[int | None], int],
        min_belief: float = 0.0,
        stop: Callable[[], bool] | None = None,
    ) -> Draft:
        """``propose``, sized by the loop: the model drafts at most ``k_for(MODEL_EVIDENCE)`` tokens (where
        the loop would send none, it is not run), stopping earlier where its own chances fall below
        ``min_belief`` or ``stop()`` says so."""
        copied = self.ngram.propose(context, k)
        if copied.tokens and (copied.evidence or 0) >= self.min_evidence:
            return copied
        wanted = min(k, self.model_k, k_for(self.MODEL_EVIDENCE))
        if wanted <= 0:
            return Draft([], evidence=self.MODEL_EVIDENCE)
        drafted = self.model.propose(context, wanted, min_belief, stop)
        return Draft(drafted.tokens, drafted.dists, self.MODEL_EVIDENCE)

    def commit(self, context_len_kept: int) -> None:
        self.ngram.commit(context_len_kept)
        self.model.commit(context_len_kept)

    def reset(self) -> None:
        self.ngram.reset()
        self.model.reset()
