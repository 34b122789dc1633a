"""Random draws keyed by (seed, position): one seed gives one text, whatever the drafter, K or the timing.

A token at position ``p`` is drawn from its distribution by the Gumbel-max trick, ``argmax_k(log P(k) +
G(seed, p, k))``, where ``G`` is Gumbel noise that depends on the seed, the position and the token id
only (a counter-based hash, so any ids of any position cost what they are). That is exactly a draw from
``P``, and it no longer depends on how many draws came before it: which positions were drafted, by whom,
how many at once, or whether a kept session was reused.

Speculative sampling then keeps a drafted token exactly when it equals the target's own draw at its
position, and emits that draw otherwise, so the emitted tokens are the plain draws. A draft model that
draws its guesses with the same noise picks the target's token wherever its distribution is close to the
target's (the Gumbel coupling), so its guesses are kept about as often as with the classic rule.
"""

from __future__ import annotations

import secrets

import numpy as np

from agent.sampling.distribution import SparseDistribution

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64s (wrapping arithmetic): a well-mixed 64-bit hash of each."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


class PositionNoise:
    """Gumbel noise keyed by (seed, position, token id); ``seed=None`` draws a seed at random."""

    def __init__(self, seed: int | None) -> None:
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        self._key = _splitmix(np.array([self.seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]

    def uniforms(self, position: int, ids: np.ndarray) -> np.ndarray:
        """One uniform in (0, 1) per token id of ``ids`` at ``position``, the same on every call."""
        with np.errstate(over="ignore"):
            where = _splitmix(np.array([position], dtype=np.uint64) ^ self._key)[0]
            z = _splitmix(np.asarray(ids, dtype=np.uint64) * _GOLDEN ^ where)
        return ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53

    def sample(self, distribution: SparseDistribution, position: int) -> int:
        """The token drawn from ``distribution`` at ``position`` (exactly distributed as it)."""
        ids = distribution.ids
        if ids.size == 1:
            return int(ids[0])
        gumbel = -np.log(-np.log(self.uniforms(position, ids)))
        with np.errstate(divide="ignore"):  # zero-probability entries score -inf: never drawn
            scores = np.log(distribution.probs.astype(np.float64)) + gumbel
        return int(ids[int(np.argmax(scores))])
