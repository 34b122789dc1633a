"""A stage's decode precision is chosen by timing each candidate once per PC and stage, kept in the compiled-model
cache, honoured on restart, and never makes an exact stage inexact (issue 47)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from agent.runtime.repeatable import ALIKE
from agent.runtime.stage import RuntimeConfig, computes_alike, decode_candidates, speculation_is_exact
from agent.runtime.tuning import CHOICES_FILE, TIMING_ROUNDS, choose_precision


class Timer:
    """Injected timings: ms per token by candidate (one value, or one a round), and every candidate timed, in
    order of the calls."""

    def __init__(self, ms: dict[str, float | list[float]]) -> None:
        self.ms = {name: v if isinstance(v, list) else [v] * TIMING_ROUNDS for name, v in ms.items()}
        self.timed: list[str] = []

    def __call__(self, precision: str) -> float:
        self.timed.append(precision)
        rounds = self.ms[precision]
        return rounds[(self.timed.count(precision) - 1) % len(rounds)]


def test_the_fastest_is_chosen_once_and_kept_for_a_restart(tmp_path: Path) -> None:
    timer = Timer({"auto": 8.9, "bf16": 7.9})
    first = choose_precision("stage-0:CPU", ("auto", "bf16"), timer, tmp_path)
    assert (first.precision, first.measured_now, timer.timed) == ("bf16", True, ["auto", "bf16"] * TIMING_ROUNDS)
    assert json.loads((tmp_path / CHOICES_FILE).read_text())["stage-0:CPU"]["precision"] == "bf16"
    # a restart: the same PC and stage read the choice back and time nothing, even if the timings would now differ
    restart = Timer({"auto": 1.0, "bf16": 9.0})
    again = choose_precision("stage-0:CPU", ("auto", "bf16"), restart, tmp_path)
    assert (again.precision, again.measured_now, restart.timed) == ("bf16", False, [])
    assert dict(again.ms_per_token) == {"auto": 8.9, "bf16": 7.9}
    assert "bf16 7.90" in again.describe() and again.to_json()["precision"] == "bf16"
    # another stage (or another CPU, thread count, OpenVINO: all in the key) is timed for itself
    other = choose_precision("stage-1:CPU", ("auto", "bf16"), restart, tmp_path)
    assert (other.precision, other.measured_now, restart.timed) == ("auto", True, ["auto", "bf16"] * TIMING_ROUNDS)
    kept = json.loads((tmp_path / CHOICES_FILE).read_text())
    assert {k: v["precision"] for k, v in kept.items()} == {"stage-0:CPU": "bf16", "stage-1:CPU": "auto"}


def test_nothing_to_choose_times_nothing_and_ties_keep_the_rule(tmp_path: Path) -> None:
    timer = Timer({"auto": 5.0, "bf16": 5.0})
    alone = choose_precision("k", ("f32",), timer, tmp_path)
    assert (alone.precision, alone.measured_now, alone.describe(), timer.timed) == ("f32", False, "f32", [])
    assert not (tmp_path / CHOICES_FILE).exists()
    assert choose_precision("k", ("auto", "bf16"), timer, tmp_path).precision == "auto"


def test_candidates_are_timed_in_alternating_rounds_and_their_best_round_counts(tmp_path: Path) -> None:
    # the PC was busy in the first round, while bf16 was timed: its quiet rounds still win
    timer = Timer({"auto": [8.9, 8.8, 8.9, 9.0, 8.9], "bf16": [12.0, 7.9, 8.0, 8.1, 8.0]})
    choice = choose_precision("k", ("auto", "bf16"), timer, tmp_path)
    assert timer.timed == ["auto", "bf16"] * 5 and TIMING_ROUNDS == 5
    assert (choice.precision, dict(choice.ms_per_token)) == ("bf16", {"auto": 8.8, "bf16": 7.9})


def test_an_unreadable_or_stale_cache_is_timed_again(tmp_path: Path) -> None:
    (tmp_path / CHOICES_FILE).write_text("{not json")
    timer = Timer({"auto": 3.0, "bf16": 2.0})
    assert choose_precision("k", ("auto", "bf16"), timer, tmp_path).precision == "bf16"
    # a kept choice no longer among the candidates (the user named a precision since) is not taken
    assert choose_precision("k", ("auto", "f16"), Timer({"auto": 1.0, "f16": 2.0}), tmp_path).precision == "auto"


def test_without_a_cache_folder_each_start_times_again() -> None:
    timer = Timer({"auto": 3.0, "bf16": 2.0})
    choose_precision("k", ("auto", "bf16"), timer, None)
    choose_precision("k", ("auto", "bf16"), timer, None)
    assert timer.timed == ["auto", "bf16"] * TIMING_ROUNDS * 2


def test_only_auto_on_a_quantizing_cpu_offers_the_plugin_default() -> None:
    one_thread = RuntimeConfig(device="CPU", threads=1)
    assert decode_candidates("CPU", "int4", one_thread, "bf16") == ("auto", "bf16")
    assert decode_candidates("CPU", "int8", RuntimeConfig(), "f16") == ("auto", "f16")
    # the user named a precision, float weights, a CPU whose default is f32 anyway, another device: no choice
    assert decode_candidates("CPU", "int4", replace(one_thread, precision="f32"), "bf16") == ("f32",)
    assert decode_candidates("CPU", "int4", replace(one_thread, precision="bf16"), "bf16") == ("bf16",)
    assert decode_candidates("CPU", "fp16", one_thread, "bf16") == ("auto",)
    assert decode_candidates("CPU", "int4", one_thread, "f32") == ("auto",)
    assert decode_candidates("GPU.0", "int4", one_thread, "f16") == ("auto",)


@pytest.mark.parametrize(
    ("threads", "rewind", "prefill_attention"),
    list(itertools.product([1, 2, None], ["auto", "mask", "compact"], ["paged", "sdpa"])),
)
def test_no_candidate_is_less_exact_than_the_rule(threads: int | None, rewind: str, prefill_attention: str) -> None:
    rule = RuntimeConfig(device="CPU", threads=threads, rewind=rewind, prefill_attention=prefill_attention)
    for precision in decode_candidates("CPU", "int4", rule, "bf16"):
        chosen = replace(rule, precision=precision)
        exact = speculation_is_exact("CPU", "int4", rule)
        assert exact is not True or speculation_is_exact("CPU", "int4", chosen) is True
        assert ALIKE.index(computes_alike("CPU", "int4", chosen)) >= ALIKE.index(computes_alike("CPU", "int4", rule))
    # the one-thread rule: cutting rejected drafts out keeps bf16 decoding exact as it does the rule's choice
    if threads == 1 and rewind in ("auto", "compact"):
        assert speculation_is_exact("CPU", "int4", replace(rule, precision="bf16")) is True


def test_bench_shards_reports_what_each_config_decoded_in() -> None:
    from bench.report import build_report, render_table
    from bench.worker import RunResult

    def run(precision: str | None) -> RunResult:
        return RunResult(list(range(9)), 0.1, 0.08, 1.0, 10**8, 2, 1.0, precision=precision)

    results = {"mono": [run(None)], "1-stage": [run("bf16")], "2-stage": [run("bf16/auto")]}
    report = build_report("smollm2", 9, 1, results, {"cpu": "test CPU", "pinned_core": 1})
    assert {name: f.get("precision") for name, f in report["configs"].items()} == {
        "mono": None,
        "1-stage": "bf16",
        "2-stage": "bf16/auto",
    }
    assert "decode precision (chosen by timing here): 1-stage bf16, 2-stage bf16/auto" in render_table(report)
