"""Choosing how many tokens to draft per step, per session, from what the last steps cost and yielded.

Model. Each drafted token is accepted with probability ``alpha`` given all earlier ones were, so a step
drafting k tokens emits ``1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)`` tokens on
average. A step costs ``t(k) = a + b k``: ``a`` is the ring round trip plus fixed per-step work, ``b``
the marginal cost of one more position (verification compute, bandwidth, drafting). K maximises
expected tokens per second. A large round trip relative to ``b`` (WAN) favours long drafts; low
acceptance favours none.

Estimates. ``alpha`` is the mean of a Beta posterior (Jeffreys prior) over per-token Bernoulli trials: a
step that kept m of k drafts contributes m successes and, if m < k, one failure (the sufficient counts
of a truncated geometric). Counts decay geometrically so the estimate follows changes in the text; the
prior is weak so that the estimate can fall below the cost floor and K reach 0 when nothing is accepted.
Drafts may carry an ``evidence`` class (the n-gram drafter's match length): each class keeps its own
counts, shrunk towards the pooled estimate by ``evidence_weight`` pseudo-trials, so a long verbatim copy
is drafted far ahead while a one-token coincidence in the same answer is drafted short or not at all.
``a`` and ``b`` are a least-squares line through a window of recent (k, seconds) observations; until
the window holds two distinct k, ``b`` is assumed to be a fixed fraction of ``a``. ``b`` is floored at
``min_cost_ratio * a``: a drafted position is never free, and jitter in the fit must not send K to
``k_max``. Every ``explore_every`` steps the controller tries one more or one fewer than its best K
(alternating) so both the line and ``alpha`` keep receiving informative data.

Deterministic: no clocks or randomness inside; the caller passes the measured times in.
"""

from __future__ import annotations

from collections import deque

import numpy as np

_MIN_FIXED_COST = 1e-6  # seconds; keeps t(k) positive when a noisy fit puts the intercept at or below zero


class AdaptiveK:
    """Per-session controller: ``choose()`` before drafting, ``record(...)`` after the step's verdict."""

    def __init__(
        self,
        k_max: int = 16,
        fixed: int | None = None,
        *,
        k_initial: int = 4,
        window: int = 64,
        explore_every: int = 8,
        memory: float = 0.98,
        prior_accepts: float = 0.5,
        prior_rejects: float = 0.5,
        prior_cost_ratio: float = 0.05,
        min_cost_ratio: float = 0.02,
        evidence_weight: float = 2.0,
    ) -> None:
        """``prior_cost_ratio``: b/a assumed before two distinct k were seen; ``min_cost_ratio``: floor on b/a."""
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max}")
        if fixed is not None and not 0 <= fixed <= k_max:
            raise ValueError(f"fixed K must be in 0..{k_max}, got {fixed}")
        if window < 2 or explore_every < 0 or not 0 < memory <= 1:
            raise ValueError("window must be >= 2, explore_every >= 0 and memory in (0, 1]")
        if prior_accepts <= 0 or prior_rejects <= 0 or prior_cost_ratio < 0 or min_cost_ratio < 0:
            raise ValueError("priors must be positive and cost ratios non-negative")
        if evidence_weight <= 0:
            raise ValueError(f"evidence_weight must be positive, got {evidence_weight}")
        self.k_max, self.fixed = k_max, fixed
        self.k_initial = min(max(k_initial, 0), k_max)
        self.explore_every, self.memory = explore_every, memory
        self.prior_accepts, self.prior_rejects = prior_accepts, prior_rejects
        self.prior_cost_ratio, self.min_cost_ratio = prior_cost_ratio, min_cost_ratio
        self.evidence_weight = evidence_weight
        self._accepts = 0.0
        self._rejects = 0.0
        self._by_evidence: dict[int, tuple[float, float]] = {}
        self._times: deque[tuple[int, float]] = deque(maxlen=window)
        self._fit: tuple[float, float] | None = None  # cost_model() of the current window, until a step is timed
        self._steps = 0
        self.draft_seconds_total = 0.0

    @property
    def alpha(self) -> float:
        """Estimated probability that a drafted token is accepted, given the ones before it were (all drafts)."""
        a, r = self.prior_accepts + self._accepts, self.prior_rejects + self._rejects
        return a / (a + r)

    def alpha_for(self, evidence: int | None) -> float:
        """The acceptance estimate for drafts of one evidence class (the pooled one for None)."""
        if evidence is None:
            return self.alpha
        accepts, rejects = self._by_evidence.get(evidence, (0.0, 0.0))
        return (accepts + self.evidence_weight * self.alpha) / (accepts + rejects + self.evidence_weight)

    def cost_model(self) -> tuple[float, float] | None:
        """``(a, b)`` in seconds for ``t(k) = a + b k``, or None before any step was recorded."""
        # Asked several times per step (best K, belief floor, exploration) over the same window: fit once.
        if self._fit is None and self._times:
            self._fit = self._fit_line()
        return self._fit

    def _fit_line(self) -> tuple[float, float]:
        """Least squares through the window of timed steps (at least one)."""
        ks = np.array([k for k, _ in self._times], dtype=np.float64)
        ts = np.array([t for _, t in self._times], dtype=np.float64)
        if np.unique(ks).size < 2:
            # One k only: the line is undetermined, so split the mean time with the prior ratio b = r a.
            a = float(ts.mean()) / (1.0 + self.prior_cost_ratio * float(ks[0]))
            return max(a, _MIN_FIXED_COST), self.prior_cost_ratio * max(a, _MIN_FIXED_COST)
        dk = ks - ks.mean()
        b = float(dk @ (ts - ts.mean()) / (dk @ dk))
        a = max(float(ts.mean()) - b * float(ks.mean()), _MIN_FIXED_COST)
        return a, max(b, self.min_cost_ratio * a)

    def best_k(self, evidence: int | None = None) -> int:
        """The K with the most expected tokens per second under the current estimates (no exploration)."""
        if self.fixed is not None:
            return self.fixed
        cost = self.cost_model()
        if cost is None:
            if not self._steps:
                return self.k_initial
            # Acceptance already measured, no step timed yet: only b/a matters, so take the prior ratio.
            cost = (1.0, self.prior_cost_ratio)
        return int(np.argmax(self._rates(cost, evidence)))

    def belief_floor(self, evidence: int | None = None) -> float:
        """The least chance of being kept that makes one more drafted position worth its cost.

        A position costs ``b`` seconds and, when kept, is worth a token at the best rate ``r`` (tokens per
        second at the best K): drafting it pays when P(kept) > ``b r``. A drafter that knows its own
        chances per token (a draft model's probabilities) stops where they fall below this, which tracks
        each step's text more closely than one K per evidence class.
        """
        cost = self.cost_model() or (1.0, self.prior_cost_ratio)
        return min(1.0, cost[1] * float(np.max(self._rates(cost, evidence))))

    def _rates(self, cost: tuple[float, float], evidence: int | None) -> np.ndarray:
        """Expected tokens per second of every K in 0..k_max."""
        a, b = cost
        alpha = self.alpha_for(evidence)
        ks = np.arange(self.k_max + 1, dtype=np.float64)
        tokens = (1.0 - alpha ** (ks + 1)) / (1.0 - alpha) if alpha < 1.0 else ks + 1
        # argmax over these takes the first maximum, so ties go to the smaller (cheaper, less risky) K.
        return tokens / (a + b * ks)

    def choose(self, evidence: int | None = None) -> int:
        """The K to draft next: ``best_k(evidence)``, or a neighbour of it on exploration steps."""
        best = self.best_k(evidence)
        if self.fixed is not None or self.k_max == 0 or not self.explore_every:
            return best
        if self._steps % self.explore_every != self.explore_every - 1:
            return best
        step = 1 if (self._steps // self.explore_every) % 2 == 0 else -1
        k = best + step
        if not 0 <= k <= self.k_max:
            k = best - step
        return k

    def record(
        self,
        k: int,
        accepted: int,
        step_seconds: float,
        draft_seconds: float,
        evidence: int | None = None,
        *,
        timed: bool = True,
    ) -> None:
        """One finished step: ``k`` drafted, ``accepted`` kept, in ``step_seconds`` of wall time.

        ``step_seconds`` is the whole step, drafting included (it is what K trades against);
        ``draft_seconds`` is the drafting part of it, checked and summed in ``draft_seconds_total`` for
        diagnostics only: the line ``a + b k`` already charges drafting to ``b``. ``timed=False``: the
        step's time is not what its k cost (the first step after a prompt queues behind the prefills of
        sessions that started with it, and a draft model's first step includes its own prefill): its
        acceptance counts, its time stays out of the line, where one such point would fix the slope
        for a whole window.
        """
        if not 0 <= accepted <= k:
            raise ValueError(f"accepted must be in 0..k, got {accepted} of {k}")
        if not (np.isfinite(step_seconds) and np.isfinite(draft_seconds) and step_seconds >= 0 and draft_seconds >= 0):
            raise ValueError("step and draft times must be finite and >= 0")
        self._steps += 1
        self.draft_seconds_total += draft_seconds
        if timed:
            self._times.append((k, step_seconds))
            self._fit = None
        if k > 0:  # a step with nothing drafted says nothing about acceptance
            rejected = 1.0 if accepted < k else 0.0
            self._accepts = self.memory * self._accepts + accepted
            self._rejects = self.memory * self._rejects + rejected
            if evidence is not None:
                accepts, rejects = self._by_evidence.get(evidence, (0.0, 0.0))
                self._by_evidence[evidence] = (self.memory * accepts + accepted, self.memory * rejects + rejected)
