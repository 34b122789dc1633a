"""The ``cb`` baseline of ``python -m bench ring --users`` (bench.cb_baseline): its figures come from the tokens' time
stamps as a ring run's do, it enters the users report beside the rings, and a process that cannot load says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import BenchError
from bench.cb_baseline import CbRun, CbSpec, CbWorker
from bench.ring_users import build_users_report, cb_ring_run
from bench.stats import StampFigures


def test_figures_start_when_the_last_user_has_its_first_token() -> None:
    figures = StampFigures.of([[1.0, 1.1, 1.2], [1.05, 1.1, 1.2]], started=0.9)
    # after 1.05 (the second user's first token): two tokens each, in 0.15 s
    assert figures.window_tokens == 4
    assert figures.tok_s == pytest.approx(4 / 0.15)
    assert figures.per_user_tok_s == pytest.approx([2 / 0.2, 2 / 0.15])
    assert figures.ttft_s == pytest.approx([0.1, 0.15])
    assert figures.gap_p50_s == pytest.approx(0.1)
    assert figures.gap_p99_s == pytest.approx(0.1)


def test_tokens_of_one_step_share_a_stamp_and_count_a_gap_of_zero() -> None:
    figures = StampFigures.of([[0.5, 0.6, 0.6, 0.6, 1.0]], started=0.0)
    assert figures.gap_p50_s == 0.0
    assert figures.gap_p99_s == pytest.approx(0.4)
    assert figures.per_user_tok_s == pytest.approx([4 / 0.5])


def test_a_user_of_one_token_has_no_speed() -> None:
    figures = StampFigures.of([[0.2]], started=0.0)
    assert figures.per_user_tok_s == [0.0] and figures.tok_s == 0.0 and figures.gap_p50_s is None


def test_a_cb_run_enters_the_users_report_beside_the_ring() -> None:
    stamps = [[0.1 + 0.01 * i for i in range(11)], [0.2 + 0.01 * i for i in range(11)]]
    run = CbRun(
        tokens=[[7] * 11, [7] * 11], stamps=stamps, steps=12, cpu_share=0.9, max_cache_usage=1.5, kv_cache_bytes=1
    )
    record = cb_ring_run(run)
    assert record.config == "cb" and record.steps == 12 and record.tokens == run.tokens
    assert record.ttft_s == pytest.approx([0.1, 0.2])
    as_run = {**record.__dict__, "load_before": 1.0, "load_after": 1.0}
    packed = {**as_run, "config": "packed", "tok_s": 2 * record.tok_s}
    raw = {"settings": {}, "machine": {}, "runs": {"2": {"cb": [as_run], "packed": [packed]}}}
    report = build_users_report(raw)
    assert report["cells"]["2"]["cb"]["tok_s"] == pytest.approx(record.tok_s)
    assert report["ratios"]["2"]["packed/cb"] == pytest.approx(2.0)


def test_a_spec_needs_a_prompt_tokens_and_cores() -> None:
    with pytest.raises(ValueError, match="core"):
        CbSpec(model_dir="m", prompt_ids=[1, 2], tokens=8, warmup_tokens=2, cores=[])
    with pytest.raises(ValueError, match="prompt"):
        CbSpec(model_dir="m", prompt_ids=[], tokens=8, warmup_tokens=2, cores=[0])


@pytest.mark.processes
def test_a_baseline_that_cannot_load_its_model_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(Path(sys.modules["bench"].__file__ or ".").parent.parent)  # the child runs -m bench.cb_baseline
    spec = CbSpec(model_dir=str(tmp_path / "missing"), prompt_ids=[1, 2], tokens=4, warmup_tokens=2, cores=[0])
    with pytest.raises(BenchError, match=r"cb worker ended \(exit 1\)") as caught:
        CbWorker(spec)
    assert "missing" in str(caught.value)
