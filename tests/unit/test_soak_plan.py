"""The soak's pure parts (issue 46): the chaos schedule and the requests, from a seeded generator."""

from __future__ import annotations

import itertools
import random

from bench.chaos import KINDS, LAB_KINDS, schedule
from bench.soak_bench import (
    CANCELLABLE,
    CLIENTS,
    SoakPrompt,
    SoakSettings,
    plan_requests,
    prompt_lengths,
    warm_up_lengths,
)


def test_the_chaos_schedule_is_bounded_in_count_place_and_hold_and_revokes_the_one_spare_at_most_once() -> None:
    for seed in range(50):
        faults = schedule(random.Random(seed), 9, 1000, max_hold=20.0)
        assert schedule(random.Random(seed), 9, 1000, max_hold=20.0) == faults  # the seed decides
        kinds = [f.kind for f in faults]
        assert kinds.count("revoke") <= 1 and len(faults) >= 9 - 2 and set(kinds) <= set(KINDS)
        assert all(100 <= f.after_requests <= 900 for f in faults), faults
        assert [f.after_requests for f in faults] == sorted(f.after_requests for f in faults)
        assert all(0.0 <= f.hold <= 20.0 for f in faults)
        assert all(f.hold >= 8.0 for f in faults if f.kind == "stop")  # SIGSTOP holds 8-30 s
    assert {f.kind for f in schedule(random.Random(1), 2, 60, ("kill", "coordinator"))} == {"kill", "coordinator"}


def test_a_host_is_cut_off_only_in_the_lab_and_for_three_to_eight_seconds() -> None:
    assert "cut" not in KINDS and "cut" in LAB_KINDS  # on loopback no host can be cut off
    assert all(f.kind != "cut" for seed in range(50) for f in schedule(random.Random(seed), 9, 1000))
    cuts = [f for seed in range(50) for f in schedule(random.Random(seed), 10, 1000, LAB_KINDS) if f.kind == "cut"]
    assert len(cuts) >= 50, len(cuts)  # every shuffled turn of the five kinds has one
    assert all(3.0 <= f.hold <= 8.0 for f in cuts) and max(f.hold for f in cuts) - min(f.hold for f in cuts) > 3


def test_the_requests_mix_clients_sampling_and_a_tenth_cancelled_mid_answer() -> None:
    settings = SoakSettings(requests=2000, max_prompt=100, max_answer=32, pool=4)
    pool = [SoakPrompt(10 + i, f"pool prompt {i}") for i in range(settings.pool)]
    requests = plan_requests(random.Random(7), settings, pool, lambda n: f"fresh prompt of {n}")
    assert {r.client for r in requests} == set(CLIENTS)
    cancelled = [r for r in requests if r.cancel_after is not None]
    assert 0.08 <= len(cancelled) / len(requests) <= 0.12, len(cancelled)
    assert all(r.client in CANCELLABLE and 1 <= (r.cancel_after or 0) < r.max_tokens for r in cancelled)
    greedy = [r for r in requests if r.temperature == 0.0]
    assert 0.4 <= len(greedy) / len(requests) <= 0.6
    assert all(r.prompt == pool[r.pool].text for r in greedy), "a greedy request asks a prompt with a reference"
    assert all(r.pool == -1 and r.prompt.startswith("fresh") for r in requests if r.temperature > 0.0)
    assert all(1 <= r.max_tokens <= settings.max_answer for r in requests)


def test_every_sampled_prompt_length_was_sent_in_the_warm_up_so_the_drift_counts_no_new_kernels() -> None:
    settings = SoakSettings(requests=1000, max_prompt=400, pool=8, lengths=16)
    lengths = prompt_lengths(settings)
    assert len(lengths) == 16 and lengths[0] == 8 and lengths[-1] == 400  # spread over every size asked for
    assert all(b - a >= 20 for a, b in itertools.pairwise(lengths))
    pool = [SoakPrompt(n, f"pool prompt of {n}") for n in (8, 400, lengths[4])]
    warm = warm_up_lengths(lengths, pool)
    assert set(warm) | {p.tokens for p in pool} == set(lengths) and not {8, lengths[4], 400} & set(warm)
    requests = plan_requests(random.Random(3), settings, pool, lambda n: f"fresh prompt of {n}", lengths)
    assert {r.prompt_tokens for r in requests} <= set(lengths)
    assert len({r.prompt_tokens for r in requests if r.temperature > 0.0}) == 16  # 1000 draws reach every length
    assert all(r.prompt == f"fresh prompt of {r.prompt_tokens}" for r in requests if r.temperature > 0.0)
    # with no fixed set (--lengths 0), the lengths are any from 8 to max_prompt: many the warm-up never sent
    free = SoakSettings(requests=1000, max_prompt=400, lengths=0)
    assert prompt_lengths(free) == ()
    anywhere = {r.prompt_tokens for r in plan_requests(random.Random(3), free, pool, str, ())}
    assert len(anywhere) > 100 and min(anywhere) >= 8 and max(anywhere) <= 400
