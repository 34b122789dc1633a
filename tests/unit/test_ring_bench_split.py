"""``python -m bench ring``'s per-token time split: what counts as our own Python and what as wire."""

from __future__ import annotations

from typing import Any

import pytest

from bench.ring_bench import time_split


def _run(**overrides: Any) -> dict[str, Any]:
    """One 1-user run of 100 tokens in 1.0 s: 0.4 s stage 0 (0.38 in `infer`), 0.45 s on the agent."""
    run: dict[str, Any] = {
        "window_s": 1.0,
        "window_tokens": 100,
        "tokens": [[0] * 101],
        "steps": 100,
        "head_stage_s": 0.4,
        "head_infer_s": 0.38,
        "head_ov_latency_s": 0.37,
        "draft_s": 0.0,
        "agent_compute_s": [0.45],
        "agent_cpu_s": [0.48],
        "loop_cpu_s": 0.05,
        "loop_kernel_s": 0.01,
    }
    run.update(overrides)
    return run


def test_the_event_loops_kernel_time_is_wire_not_python() -> None:
    split = time_split([_run()])
    assert split["head_loop_cpu_ms"] == pytest.approx(0.5)
    assert split["head_loop_kernel_ms"] == pytest.approx(0.1)
    assert split["head_loop_python_ms"] == pytest.approx(0.4)
    assert split["head_executor_python_ms"] == pytest.approx(0.2)
    assert split["head_python_ms"] == pytest.approx(0.6)
    assert split["python_share"] == pytest.approx(0.06)
    # what is not compute, drafting or Python is wire and the rest, the kernel's share included
    assert split["wire_and_rest_ms"] == pytest.approx(10.0 - 4.0 - 4.5 - 0.4)


def test_results_saved_before_the_kernel_split_count_all_loop_time_as_python() -> None:
    old = _run()
    del old["loop_kernel_s"]
    split = time_split([old])
    assert split["head_loop_kernel_ms"] == 0.0
    assert split["head_python_ms"] == pytest.approx(0.7)
    assert split["python_share"] == pytest.approx(0.07)


def test_medians_over_runs() -> None:
    runs = [_run(loop_cpu_s=0.05), _run(loop_cpu_s=0.07), _run(loop_cpu_s=0.30)]
    assert time_split(runs)["head_loop_python_ms"] == pytest.approx(0.6)


def test_cutting_rejected_drafts_out_of_the_kv_state_is_stage_work_not_python() -> None:
    split = time_split([_run(head_kv_cut_s=0.015)])
    assert split["head_kv_cut_ms"] == pytest.approx(0.15)
    assert split["head_executor_python_ms"] == pytest.approx(0.05)  # 0.4 - 0.38 - 0.015 s over 100 tokens
    assert split["python_share"] == pytest.approx(0.045)
    assert time_split([_run()])["head_kv_cut_ms"] == 0.0  # runs saved before the cut was timed


def test_the_agents_kv_cut_is_shown_within_their_compute() -> None:
    split = time_split([_run(agent_kv_cut_s=[0.02])])
    assert split["agents_kv_cut_ms"] == [pytest.approx(0.2)]
    assert split["agents_compute_ms"] == [pytest.approx(4.5)]  # still inside it: the stage's own work
    assert time_split([_run()])["agents_kv_cut_ms"] == [0.0]  # runs saved before agents reported it
