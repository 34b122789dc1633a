"""Choosing the next token from logits: greedy, or temperature / top-k / top-p with a seed."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from agent.errors import ShoalError

MAX_TOP_LOGPROBS = 20
"""Alternatives a session may ask for at each position (OpenAI's ``top_logprobs`` bound)."""


@dataclass(frozen=True)
class SamplingParams:
    """How a session's tokens are chosen, and what the last stage reads out for it besides."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None
    """The chosen tokens' log-probabilities and this many alternatives at each position
    (``agent.sampling.logprobs``); None: none."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ShoalError("temperature must be >= 0, top-p in (0, 1], top-k >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ShoalError(f"log-probabilities come with 0 to {MAX_TOP_LOGPROBS} alternatives, not {self.logprobs}")

    def on_stages(self) -> SamplingParams:
        """What the stages apply (the seed stays with the head): two sessions with equal ones read out alike."""
        return replace(self, seed=None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Picks tokens for one session; owns that session's random generator."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution sampling draws from, after temperature, top-k and top-p."""
        return sampling_distribution(logits, self.params)

    def pick(self, logits: np.ndarray) -> int:
        """The next token for a ``[vocab]`` row of logits."""
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = self.probabilities(logits)
        return int(self._rng.choice(probs.shape[-1], p=probs))


def sampling_distribution(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    """The distribution that sampling draws from for a ``[vocab]`` row: temperature, top-k, top-p."""
    z = logits.astype(np.float64) / p.temperature
    if p.top_k and p.top_k < z.shape[-1]:
        kth = np.partition(z, -p.top_k)[-p.top_k]
        z = np.where(z < kth, -np.inf, z)
    z -= z.max()
    probs = np.exp(z)
    probs /= probs.sum()
    if p.top_p < 1.0:
        order = np.argsort(-probs)
        cumulative = np.cumsum(probs[order])
        cut = int(np.searchsorted(cumulative, p.top_p)) + 1
        keep = np.zeros_like(probs, dtype=bool)
        keep[order[:cut]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs
