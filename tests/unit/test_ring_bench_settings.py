"""``python -m bench ring``'s options: setups, latencies, which draft model each setup gets, and the cores (which
``python -m bench chat`` takes the same way)."""

from __future__ import annotations

import argparse

import pytest

from bench import BenchError
from bench.ring_bench import DEFAULT_LATENCIES, RingSettings, Setup, add_arguments


def _settings(*argv: str) -> RingSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return RingSettings.from_args(parser.parse_args(list(argv)))


def test_defaults_cover_every_setup_and_latency() -> None:
    settings = _settings()
    assert settings.setups == (Setup("qwen2.5-coder-1.5b", 2), Setup("smollm2", 2), Setup("smollm2", 3))
    assert settings.latencies == DEFAULT_LATENCIES
    assert settings.drafter == "best" and settings.rewind == "auto" and not settings.draft_ahead
    assert _settings("--draft-ahead").draft_ahead


def test_qwen_drafts_with_smollm2_and_a_model_never_drafts_for_itself() -> None:
    settings = _settings()
    assert settings.draft_model_for("qwen2.5-coder-1.5b") == "smollm2"
    assert settings.draft_model_for("smollm2") is None  # its self-draft
    chosen = _settings("--draft-model", "smollm2", "--model", "smollm2")
    assert chosen.draft_model_for("smollm2") is None
    other = _settings("--draft-model", "some/other-model")
    assert other.draft_model_for("qwen2.5-coder-1.5b") == "some/other-model"


def test_bad_options_are_refused() -> None:
    with pytest.raises(BenchError):
        _settings("--stages", "1", "--model", "smollm2")
    with pytest.raises(BenchError):
        _settings("--latency-ms", "-5")
    with pytest.raises(BenchError):
        _settings("--tokens-at", "100:64")


def test_a_pinned_cut_names_its_own_export() -> None:
    settings = _settings("--model", "qwen2.5-coder-1.5b", "--layers", "18,10")
    assert settings.setups == (Setup("qwen2.5-coder-1.5b", 2, (18, 10)),)
    assert settings.setups[0].export_name == "shoal-layers-18-10"
    assert Setup("qwen2.5-coder-1.5b", 2).export_name == "shoal-2stage"  # the planner's cut keeps its folder
    with pytest.raises(BenchError, match="needs --model"):
        _settings("--layers", "18,10")
    with pytest.raises(BenchError, match="every stage"):
        _settings("--model", "smollm2", "--stages", "3", "--layers", "18,12")


def test_agent_cores_are_one_per_agent_in_stage_order_and_the_last_is_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    settings = _settings("--head-core", "0", "--agent-core", "1,2")
    assert [settings.agent_core(stage) for stage in (1, 2, 3)] == [1, 2, 2]
    assert settings.spare_cores() == [3, 4, 5, 6, 7]  # where the delay proxies go
    assert _settings("--head-core", "0").agent_cores == (7,)
    with pytest.raises(BenchError):
        _settings("--head-core", "1", "--agent-core", "1,2")  # the head's core is not an agent's
    with pytest.raises(SystemExit):
        _settings("--agent-core", "1,x")


def test_the_chat_bench_takes_the_same_agent_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.chat_bench import ChatBenchSettings
    from bench.chat_bench import add_arguments as add_chat_arguments

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    parser = argparse.ArgumentParser()
    add_chat_arguments(parser)
    settings = ChatBenchSettings.from_args(
        parser.parse_args(["--stages", "4", "--head-core", "0", "--agent-core", "1,2"])
    )
    assert [settings.agent_core(stage) for stage in (1, 2, 3)] == [1, 2, 2]
    assert ChatBenchSettings.from_args(parser.parse_args(["--head-core", "0"])).agent_cores == (7,)
    with pytest.raises(BenchError):
        ChatBenchSettings.from_args(parser.parse_args(["--head-core", "1", "--agent-core", "1,2"]))
