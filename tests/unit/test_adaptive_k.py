"""The per-session draft-length controller, driven by simulated acceptance and timing."""

from __future__ import annotations

import numpy as np
import pytest

from agent.head.adaptive_k import AdaptiveK

LAN = (0.001, 0.0003)  # a: round trip + fixed cost, b: cost per extra position (seconds)
WAN = (0.200, 0.0003)


def _simulate(
    controller: AdaptiveK, alpha: float, cost: tuple[float, float], steps: int = 400, seed: int = 0
) -> list[int]:
    """Drive the controller: each draft survives with probability alpha; step time a + b k with 3% jitter."""
    rng = np.random.default_rng(seed)
    a, b = cost
    chosen = []
    for _ in range(steps):
        k = controller.choose()
        assert 0 <= k <= controller.k_max
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        seconds = (a + b * k) * (1.0 + 0.03 * rng.standard_normal())
        controller.record(k, accepted, step_seconds=seconds, draft_seconds=0.1 * seconds)
        chosen.append(k)
    return chosen


@pytest.mark.parametrize(
    ("alpha", "cost", "low", "high"),
    [
        (0.8, LAN, 2, 5),  # cheap round trip: a few drafts pay off (optimum 3)
        (0.8, WAN, 8, 16),  # expensive round trip: long drafts (optimum ~11 with the b floor)
        (0.05, LAN, 0, 0),  # drafts almost never survive: do not draft
        (0.05, WAN, 0, 2),  # barely worth one draft when the trip is expensive
        (0.0, LAN, 0, 0),
        (0.0, WAN, 0, 0),
    ],
)
def test_k_follows_acceptance_and_round_trip(alpha: float, cost: tuple[float, float], low: int, high: int) -> None:
    controller = AdaptiveK()
    _simulate(controller, alpha, cost)
    assert low <= controller.best_k() <= high
    assert controller.alpha == pytest.approx(alpha, abs=0.06)


def test_wan_drafts_longer_than_lan() -> None:
    lan, wan = AdaptiveK(), AdaptiveK()
    _simulate(lan, 0.7, LAN)
    _simulate(wan, 0.7, WAN)
    assert wan.best_k() > lan.best_k() + 3


def test_cost_fit_recovers_the_line() -> None:
    controller = AdaptiveK()
    _simulate(controller, 0.8, (0.050, 0.004), steps=200)
    a, b = controller.cost_model()  # type: ignore[misc]
    assert a == pytest.approx(0.050, rel=0.1)
    assert b == pytest.approx(0.004, rel=0.3)


def test_prior_splits_the_time_until_two_distinct_k_are_seen() -> None:
    controller = AdaptiveK(explore_every=0)
    assert controller.cost_model() is None
    assert controller.choose() == 4  # k_initial before any observation
    controller.record(4, 4, 0.012, 0.002)
    a, b = controller.cost_model()  # type: ignore[misc]
    assert a == pytest.approx(0.012 / 1.2) and b == pytest.approx(0.05 * a)
    assert controller.draft_seconds_total == pytest.approx(0.002)


def test_explores_neighbours_deterministically() -> None:
    controller = AdaptiveK(explore_every=4)
    run1 = _simulate(controller, 0.8, LAN, steps=80, seed=3)
    run2 = _simulate(AdaptiveK(explore_every=4), 0.8, LAN, steps=80, seed=3)
    assert run1 == run2
    assert len(set(run1[-40:])) >= 2  # the fit keeps seeing distinct k


def test_explores_upwards_from_zero() -> None:
    controller = AdaptiveK(explore_every=2)
    for _ in range(40):
        controller.record(1, 0, 0.001, 0.0)
        controller.record(0, 0, 0.001, 0.0)
    assert controller.best_k() == 0
    seen = []
    for _ in range(8):
        k = controller.choose()
        seen.append(k)
        controller.record(k, 0, 0.001 + 0.0003 * k, 0.0)
    assert seen.count(1) == 4 and seen.count(0) == 4


def test_fixed_k_is_always_returned() -> None:
    controller = AdaptiveK(fixed=5)
    assert _simulate(controller, 0.0, LAN, steps=50) == [5] * 50
    assert AdaptiveK(fixed=0).choose() == 0


@pytest.mark.parametrize("k_max", [0, 1, 3])
def test_bounds_are_respected(k_max: int) -> None:
    for alpha, cost in [(0.95, WAN), (0.0, LAN)]:
        chosen = _simulate(AdaptiveK(k_max=k_max), alpha, cost, steps=100)
        assert min(chosen) >= 0 and max(chosen) <= k_max


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        AdaptiveK(k_max=-1)
    with pytest.raises(ValueError):
        AdaptiveK(k_max=4, fixed=5)
    with pytest.raises(ValueError):
        AdaptiveK().record(2, 3, 0.1, 0.0)
    with pytest.raises(ValueError):
        AdaptiveK().record(2, 1, float("nan"), 0.0)
    with pytest.raises(ValueError):
        AdaptiveK().record(2, 1, -0.1, 0.0)


def test_each_evidence_class_keeps_its_own_acceptance() -> None:
    """Long verbatim copies (class 5) always survive, one-token coincidences (class 1) never do:
    the controller drafts far ahead for the first and not at all for the second."""
    controller = AdaptiveK(explore_every=0)
    rng = np.random.default_rng(7)
    for _ in range(200):
        evidence = 5 if rng.random() < 0.5 else 1
        k = max(controller.choose(evidence), 1)
        accepted = k if evidence == 5 else 0
        controller.record(k, accepted, 0.200 + 0.0003 * k, 0.0, evidence=evidence)
    assert controller.alpha_for(5) > 0.9
    assert controller.alpha_for(1) < 0.1
    assert controller.best_k(5) >= 8
    assert controller.best_k(1) <= 1  # one draft is nearly free next to a 200 ms round trip
    # an unseen class starts from the pooled estimate
    assert controller.alpha_for(3) == pytest.approx(controller.alpha)


def test_an_untimed_step_counts_for_acceptance_but_not_for_the_cost_line() -> None:
    """A first step that queued behind another session's prefill must not make drafting look expensive."""
    timed, untimed = AdaptiveK(explore_every=0), AdaptiveK(explore_every=0)
    for controller, is_timed in ((timed, True), (untimed, False)):
        controller.record(4, 4, 0.200, 0.0, timed=is_timed)  # 4 positions "took" 200 ms: mostly waiting
        for _ in range(10):
            controller.record(1, 1, 0.030, 0.0)
            controller.record(2, 2, 0.031, 0.0)
    assert untimed.alpha == timed.alpha
    a, b = untimed.cost_model()  # type: ignore[misc]
    assert b == pytest.approx(0.001) and a == pytest.approx(0.029)
    assert timed.cost_model()[1] > 0.01  # type: ignore[index]
    assert untimed.best_k() > timed.best_k()


def test_acceptance_counts_before_any_step_is_timed() -> None:
    """After an untimed first step that kept nothing, K follows the low acceptance, not ``k_initial``."""
    controller = AdaptiveK(explore_every=0, k_initial=4)
    assert controller.best_k() == 4
    controller.record(4, 0, 0.3, 0.0, timed=False)
    assert controller.cost_model() is None
    assert controller.best_k() < 4


def test_belief_floor_is_the_cost_of_a_position_in_tokens_at_the_best_rate() -> None:
    """Drafting one more position pays when its chance of being kept exceeds b x (best tokens per second)."""
    a, b, alpha = 0.25, 0.025, 0.6
    controller = AdaptiveK()
    _simulate(controller, alpha, (a, b), steps=300)
    fit_a, fit_b = controller.cost_model()  # type: ignore[misc]
    k = controller.best_k()
    tokens = (1 - controller.alpha ** (k + 1)) / (1 - controller.alpha)
    assert controller.belief_floor() == pytest.approx(fit_b * tokens / (fit_a + fit_b * k), rel=1e-9)
    assert 0.1 < controller.belief_floor() < 0.5
    # a slower ring (the same positions, a longer round trip) makes a doubtful position worth drafting
    wan = AdaptiveK()
    _simulate(wan, alpha, (4 * a, b), steps=300)
    assert wan.belief_floor() < 0.5 * controller.belief_floor()


def test_belief_floor_before_any_timing_uses_the_prior_ratio() -> None:
    controller = AdaptiveK(prior_cost_ratio=0.05)
    # nothing recorded: alpha is the prior's 0.5, t(k) = 1 + 0.05 k
    ks = np.arange(controller.k_max + 1)
    best_rate = max((1 - 0.5 ** (ks + 1)) / 0.5 / (1 + 0.05 * ks))
    assert controller.belief_floor() == pytest.approx(0.05 * best_rate)
