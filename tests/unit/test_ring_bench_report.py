"""``python -m bench ring --json``: the report's shape (as ``python -m bench shards --json``), ratios and goals."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from bench.ring_bench import RingSettings, _settings_json, add_arguments, build_report, render_markdown

CONFIGS = ("mono", "pp", "pp+sd", "pp+mb", "pp+sd+mb")


def _run(config: str, latency: float, tok_s: float, users: int = 1) -> dict[str, Any]:
    speculative = "sd" in config
    tokens = [[5, 6, 7, 8] * 8 for _ in range(users)]
    return {
        "config": config,
        "latency_ms": latency,
        "tokens": tokens,
        "tok_s": tok_s,
        "per_user_tok_s": [tok_s / users] * users,
        "ttft_s": [0.2] * users,
        "window_s": 31 / (tok_s / users),
        "window_tokens": 31 * users,
        "steps": 10 if speculative else 31,
        "drafted": 30 if speculative else 0,
        "accepted": 21 if speculative else 0,
        "k_chosen": [3, 3, 4] if speculative else [],
        "drafter": "ngram" if speculative else None,
        "head_stage_s": 0.5,
        "head_infer_s": 0.48,
        "head_ov_latency_s": 0.47,
        "draft_s": 0.1 if speculative else 0.0,
        "loop_cpu_s": 0.02,
        "loop_kernel_s": 0.005,
        "agent_compute_s": [0.5],
        "agent_steps": [31],
        "agent_cpu_s": [0.52],
        "cpu_share": 0.99 if config == "mono" else None,
        "others_busy": 0.01,
        "foreign_busy": 0.0,
    }


def _raw(speeds: dict[float, dict[str, float]]) -> dict[str, Any]:
    latencies: dict[str, Any] = {}
    for latency, by_config in speeds.items():
        runs = {
            name: [_run(name, latency, tok_s * f, 2 if "mb" in name else 1) for f in (0.95, 1.0, 1.05)]
            for name, tok_s in by_config.items()
        }
        latencies[str(latency)] = {"tokens": 32, "runs": runs}
    setup = {
        "model": "smollm2",
        "stages": 2,
        "layers": [18, 12],
        "latencies": latencies,
        "prompt_tokens": 40,
        "drafters": {str(lat): "ngram" for lat in speeds},
        "pilots": {str(lat): {} for lat in speeds},
    }
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = _settings_json(
        RingSettings.from_args(
            parser.parse_args(["--model", "smollm2", "--stages", "2", "--runs", "3", "--tokens", "32"])
        )
    )
    return {"settings": settings, "machine": {"cores": 2}, "setups": [setup]}


RAW = _raw(
    {
        0.0: {"mono": 10.0, "pp": 10.0, "pp+sd": 15.0, "pp+mb": 18.0, "pp+sd+mb": 25.0},
        100.0: {"pp": 3.0, "pp+sd": 8.0, "pp+mb": 6.0, "pp+sd+mb": 16.0},
    }
)


def test_the_report_has_the_shards_benchmarks_shape_and_every_configuration() -> None:
    report = json.loads(json.dumps(build_report(RAW)))  # one JSON object, nothing that json cannot carry
    for key in ("model", "tokens", "runs", "machine", "configs", "ratios", "goals"):
        assert key in report, key
    assert set(report["configs"]) == set(CONFIGS)
    for name, figures in report["configs"].items():
        for key in ("tok_s", "per_user_tok_s", "acceptance", "k"):
            assert key in figures, (name, key)
    assert report["configs"]["pp+mb"]["per_user_tok_s"] == pytest.approx(9.0)  # two users share 18 tok/s
    assert report["configs"]["pp+sd"]["acceptance"] == pytest.approx(0.7)
    assert report["configs"]["pp+sd"]["k"] == 3
    assert report["configs"]["pp"]["acceptance"] is None  # nothing drafted: no rate, rather than a made-up 0
    assert [c["latency_ms"] for c in report["setups"][0]["cells"]] == [0.0, 100.0]


def test_ratios_and_goals() -> None:
    report = build_report(RAW)
    assert report["ratios"]["pp+sd+mb/mono"] == pytest.approx(2.5)
    assert report["ratios"]["pp+sd/pp"] == pytest.approx(1.5)
    goals = report["goals"]
    assert goals["pp+sd+mb/mono@0ms"]["pass"] and goals["pp+sd/pp@0ms"]["pass"]
    assert not goals["pp+mb/pp@0ms"]["pass"]  # 1.8x against the 1.85x goal
    assert goals["pp+sd+mb/pp@100ms"]["ratio"] == pytest.approx(16 / 3)
    assert goals["pp+sd+mb/pp@100ms"]["pass"]
    assert goals["python_share@0ms"]["pass"]


def test_speculative_tokens_that_differ_from_pp_are_reported() -> None:
    raw = json.loads(json.dumps(RAW))
    raw["setups"][0]["latencies"]["0.0"]["runs"]["pp+sd"][1]["tokens"][0][20] = 99
    agreement = build_report(raw)["setups"][0]["cells"][0]["agreement"]
    assert agreement["pp+sd/pp"] == {"same": 31, "total": 32, "first_difference": 20}  # the worst run counts
    assert agreement["pp+mb/pp"] == {"same": 32, "total": 32, "first_difference": None}


def test_wire_bytes_per_decode_step_are_reported_and_rendered() -> None:
    raw = json.loads(json.dumps(RAW))
    for run in raw["setups"][0]["latencies"]["0.0"]["runs"]["pp+sd"]:
        run["wire_sent_bytes"], run["wire_received_bytes"] = 10 * 2304, 10 * 20  # 10 steps
    report = build_report(raw)
    split = report["configs"]["pp+sd"]["time_split"]
    assert split["wire_bytes_per_step"] == [2304, 20]
    assert report["configs"]["pp"]["time_split"]["wire_bytes_per_step"] == [None, None]  # saved before they counted
    text = render_markdown(report, "python -m bench ring --model smollm2")
    assert "| 2,304, 20 |" in text
    assert "| pp+sd+mb | 25.0 (23.8-26.2) |" in text


def test_a_ratio_just_under_its_goal_is_not_shown_as_equal() -> None:
    from bench.ring_bench import _goal_text

    assert (
        _goal_text("pp+mb/pp@0ms", {"target": 1.85, "ratio": 1.8474, "pass": False})
        == "pp+mb/pp@0ms: 1.847× (≥ 1.85×) FAIL"
    )
    assert (
        _goal_text("pp+sd/pp@0ms", {"target": 1.4, "ratio": 1.5612, "pass": True})
        == "pp+sd/pp@0ms: 1.56× (≥ 1.40×) pass"
    )
