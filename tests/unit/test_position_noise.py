"""Draws keyed by (seed, position) (``agent.sampling.keyed``): each is exactly a draw from its distribution,
the same seed and position give the same token, and a close draft distribution mostly picks the target's."""

from __future__ import annotations

import numpy as np

from agent.sampling.distribution import SparseDistribution
from agent.sampling.keyed import PositionNoise
from tests.unit.spec_stats import chi_square_pvalue


def _dist(p: np.ndarray) -> SparseDistribution:
    return SparseDistribution.from_probs(p)


def test_draws_over_positions_follow_the_distribution() -> None:
    p = np.random.default_rng(3).dirichlet(np.ones(40) * 0.5)
    noise = PositionNoise(17)
    counts = np.bincount([noise.sample(_dist(p), position) for position in range(20000)], minlength=40)
    assert chi_square_pvalue(counts, p) > 0.001


def test_the_same_seed_and_position_give_the_same_token_and_others_differ() -> None:
    p = _dist(np.full(1000, 1e-3))
    a, b = PositionNoise(5), PositionNoise(5)
    draws = [a.sample(p, i) for i in range(200)]
    assert draws == [b.sample(p, i) for i in range(200)]
    assert draws != [PositionNoise(6).sample(p, i) for i in range(200)]
    assert len(set(draws)) > 150  # positions are not one draw repeated


def test_a_close_draft_distribution_picks_the_targets_token_almost_always() -> None:
    rng = np.random.default_rng(1)
    agree = 0
    noise = PositionNoise(2)
    for position in range(2000):
        p = rng.dirichlet(np.ones(50) * 0.3)
        q = 0.9 * p + 0.1 * rng.dirichlet(np.ones(50))
        agree += noise.sample(_dist(p), position) == noise.sample(_dist(q), position)
    assert agree / 2000 > 0.8
