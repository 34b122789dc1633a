"""A drafter that runs a small OpenVINO model: a separate draft model or the target's self-draft."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agent.head.drafters import Draft
from agent.runtime.stage import CompiledStage
from agent.sampling.distribution import SparseDistribution
from agent.sampling.keyed import PositionNoise
from agent.sampling.params import SamplingParams, sampling_distribution


class ModelDrafter:
    """Drafts K tokens autoregressively with a one-graph draft model, keeping its own KV cache.

    The draft's cache follows the conversation: each proposal first feeds the context tokens the
    draft has not seen, and :meth:`commit` rewinds (mask-based) past drafted tokens the target
    rejected. In sampling mode drafts are sampled from the draft's own distribution, which is
    returned for the acceptance rule.
    """

    blocking = True
    """Proposing runs inference: call it off the event loop."""
    drafts_cheaply = False
    stops_on_belief = True

    def __init__(self, draft: CompiledStage, params: SamplingParams) -> None:
        self._session = draft.new_session()
        self._params = params
        # the head's own keyed noise (the same seed): its guesses then fall on the target's draws wherever
        # the two distributions are close (``agent.sampling.keyed``)
        self._noise = PositionNoise(params.seed)
        self._fed: list[int] = []

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        """Up to ``k`` tokens; fewer where the draft's own chance that every token so far is right falls
        below ``min_belief``: the product of its top probabilities at each position, known before the
        token there is drawn. ``stop``: asked before each further model step; True ends the draft there
        (drafting ahead yields the head's core to a session that wants it)."""
        if k <= 0:
            return Draft([])
        common = _common_prefix(self._fed, context)
        if common == len(context):  # nothing new to feed: re-feed the last token for its logits
            common -= 1
        self._rewind_to(common)
        fresh = list(context[common:])
        logits = self._session.step(np.asarray([fresh], dtype=np.int64), last_only=True)
        self._fed = list(context)
        tokens: list[int] = []
        dists: list[SparseDistribution] = []
        belief = 1.0
        for i in range(k):
            row = logits[0, -1]
            if self._params.greedy:
                if min_belief > 0.0:
                    belief *= _probability_of_top(row)
            else:
                dist = SparseDistribution.from_probs(sampling_distribution(row, self._params))
                belief *= float(dist.probs.max())
            # Decided before the token is drawn: had the drawn token decided whether it is sent, the
            # tokens sent would not follow the draft's distribution and speculative sampling would be biased.
            if belief < min_belief:
                break
            if self._params.greedy:
                token = int(np.argmax(row))
            else:
                token = self._noise.sample(dist, len(context) + i)
                dists.append(dist)
            tokens.append(token)
            if i < k - 1:
                if stop is not None and stop():
                    break
                logits = self._session.step(np.asarray([[token]], dtype=np.int64), last_only=True)
                self._fed.append(token)
        return Draft(tokens, None if self._params.greedy else dists)

    def commit(self, context_len_kept: int) -> None:
        self._rewind_to(min(context_len_kept, len(self._fed)))

    def reset(self) -> None:
        self._session.reset()
        self._fed = []

    def _rewind_to(self, length: int) -> None:
        if length < len(self._fed):
            self._session.rewind(len(self._fed) - length)
            del self._fed[length:]


def _probability_of_top(logits: np.ndarray) -> float:
    """Softmax probability of the largest logit."""
    return float(1.0 / np.exp(logits - logits.max()).sum())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
