"""``python -m bench prefill``: prompts of exactly N ids, the lengths measured, the goals and the report (no model)."""

from __future__ import annotations

import argparse

import pytest

from bench import BenchError
from bench.prefill_bench import (
    CONFIGS,
    FILLER,
    PrefillRun,
    PrefillSettings,
    build_report,
    goal_ratios,
    prompt_lengths,
    prompt_of,
    render_markdown,
    ring_stages,
    token_counts,
)


class SplittingTokenizer:
    """A toy subword tokenizer: BOS, then a word of more than five letters in two pieces (head, tail), any other
    word whole. A prompt cut between a word's pieces decodes into text that encodes otherwise (the head alone is
    a whole word of another id), as a real BPE tokenizer may."""

    def __init__(self) -> None:
        self.vocab: dict[tuple[str, str], int] = {}

    def _id(self, kind: str, text: str) -> int:
        return self.vocab.setdefault((kind, text), len(self.vocab) + 1)

    def encode(self, text: str) -> list[int]:
        ids = [0]
        for word in text.split():
            if len(word) > 5:
                ids += [self._id("head", word[:3]), self._id("tail", word[3:])]
            else:
                ids.append(self._id("word", word))
        return ids

    def decode(self, ids: list[int]) -> str:
        pieces = {token: piece for piece, token in self.vocab.items()}
        return "".join(text if kind == "tail" else " " + text for kind, text in map(pieces.__getitem__, ids[1:]))


@pytest.mark.parametrize("n", [1, 2, 3, 16, 17, 64, 65, 200, 513])
def test_a_prompt_has_exactly_n_ids_and_its_text_encodes_back_into_them(n: int) -> None:
    tokenizer = SplittingTokenizer()
    prompt = prompt_of(n, tokenizer.encode, tokenizer.decode)
    assert len(prompt.ids) == n
    assert tokenizer.encode(prompt.text) == prompt.ids
    assert prompt.ids[0] == 0  # the tokenizer's own special tokens are kept, as a chat agent adds them


def test_a_prompt_is_the_repeated_text_cut_where_it_encodes_back() -> None:
    tokenizer = SplittingTokenizer()
    words = FILLER.split()
    assert prompt_of(5, tokenizer.encode, tokenizer.decode).text.split() == words[:3]  # BOS The off+ice keeps
    # BOS The off: "office" cut in two, whose text encodes as the word "off"; one word later it encodes back
    assert prompt_of(3, tokenizer.encode, tokenizer.decode).text.split() == words[1:2]


def test_a_tokenizer_that_never_encodes_a_cut_back_is_refused() -> None:
    with pytest.raises(BenchError, match="exactly 10 tokens"):
        prompt_of(10, lambda text: list(range(len(text))), lambda ids: "x")


def test_lengths_leave_one_position_for_the_answer_and_run_shortest_first() -> None:
    assert prompt_lengths((4096, 512, 2048), 4096) == (512, 2048, 4095)
    assert prompt_lengths((4096, 4095), 4096) == (4095,)
    assert prompt_lengths((4096, 512), None) == (512, 4096)


def test_configs_and_lengths_on_the_command_line() -> None:
    assert [ring_stages(c) for c in CONFIGS] == [1, 1, 1, 1, 1, 1, 2, 2, 3, 3]
    assert token_counts("512, 2048,4096") == (512, 2048, 4096)
    for bad in ("", "0", "512,x"):
        with pytest.raises(argparse.ArgumentTypeError):
            token_counts(bad)


def test_goals_compare_medians_per_length() -> None:
    medians = {"genai": {"512": 1.0, "2048": 4.0}, "torch": {"512": 0.5}, "1-stage": {"512": 1.05, "2048": 6.0}}
    goals = {f"{g['config']}/{g['reference']}": g for g in goal_ratios(medians)}
    assert set(goals) == {"1-stage/genai", "1-stage/torch"}  # no ring measured: no ring goal
    assert goals["1-stage/genai"]["lengths"]["512"] == {"ratio": pytest.approx(1.05), "pass": True}
    assert goals["1-stage/genai"]["lengths"]["2048"] == {"ratio": pytest.approx(1.5), "pass": False}
    assert goals["1-stage/torch"]["lengths"] == {"512": {"ratio": pytest.approx(2.1), "pass": False}}


def _settings(agent_cores: tuple[int, ...]) -> PrefillSettings:
    return PrefillSettings(
        model="smollm2",
        lengths=(512, 4096),
        runs=2,
        configs=CONFIGS,
        prefill_chunk=512,
        head_core=0,
        agent_cores=agent_cores,
    )


def _report(agent_cores: tuple[int, ...]) -> dict[str, object]:
    times = {"genai": 1.0, "genai-f32": 1.2, "torch": 2.0, "1-stage": 1.0, "1-stage-f32": 1.5, "1-stage-sdpa": 2.0}
    times |= {"ring2": 1.2, "ring2-pipelined": 0.8}
    times["ring3"] = 1.3
    times["ring3-pipelined"] = 0.5
    runs = [
        PrefillRun(config, n, run, seconds * (8 if n > 512 else 1) * (1 + run / 10), 7)
        for config, seconds in times.items()
        for n in (512, 4095)
        for run in range(2)
    ]
    machine = {
        "cpu": "Test CPU",
        "cores": 4,
        "memory_gb": 16.0,
        "load_average": 0.1,
        "date": "2026-12-04T12:00:00+00:00",
        "openvino": "1",
        "openvino_genai": "1",
        "optimum_intel": "1",
    }
    failures = {"torch": "BenchError: out of memory"} if len(agent_cores) == 1 else {}
    return build_report(_settings(agent_cores).to_json(), (512, 4095), runs, machine, failures)


def test_the_report_holds_each_config_and_length_and_the_goals() -> None:
    report = _report((1, 2))
    ttft = report["ttft_s"]
    assert isinstance(ttft, dict) and list(ttft) == list(CONFIGS)
    assert ttft["genai"]["4095"]["runs"] == 2
    assert ttft["genai"]["512"]["min"] == pytest.approx(1.0)
    ring = next(g for g in report["goals"] if g["config"] == "ring3-pipelined")  # type: ignore[attr-defined]
    assert ring["lengths"]["512"]["pass"] and ring["lengths"]["512"]["ratio"] == pytest.approx(0.5)
    assert report["first_tokens"] == {"512": dict.fromkeys(CONFIGS, 7), "4095": dict.fromkeys(CONFIGS, 7)}


def test_the_markdown_shows_times_goals_and_the_cores_of_each_agent() -> None:
    markdown = render_markdown(_report((1, 2)), "python -m bench prefill")
    header = (
        "| prompt tokens | genai | genai-f32 | torch | 1-stage | 1-stage-f32 | 1-stage-sdpa | ring2 | ring2-pipelined "
        "| ring3 | ring3-pipelined |"
    )
    assert header in markdown
    assert "| 4,095 | 8.400 (8.000-8.800) |" in markdown
    assert "| 1-stage ≤ 1.1× genai | 1.00 pass | 1.00 pass |" in markdown
    assert "| 1-stage-f32 ≤ 1.1× genai-f32 | 1.25 FAIL | 1.25 FAIL |" in markdown
    assert "| 1-stage ≤ 1.5× torch | 0.50 pass | 0.50 pass |" in markdown
    assert "| ring3-pipelined ≤ 0.6× 1-stage | 0.50 pass | 0.50 pass |" in markdown
    assert "the ring of 3: stage 0 (the chat agent) on core 0, stages 1-2 on one core each (cores 1, 2" in markdown
    assert "the ring of 2: stage 0 (the chat agent) on core 0, stage 1 on core 1" in markdown
    assert "First token at 4,095 prompt tokens: all 7." in markdown
    assert "Prompt lengths asked: 512, 4,096, each cut to leave one position" in markdown
    assert "shared cores" not in markdown and "failed" not in markdown


def test_a_ring_whose_stages_share_a_core_is_said_to_miss_the_goals_setting() -> None:
    markdown = render_markdown(_report((1,)), "python -m bench prefill")
    assert "stages 1-2 on core 1, which the 2 agents share" in markdown
    assert "ring3-pipelined ≤ 0.6× 1-stage (the stages shared cores here" in markdown
    assert "- torch failed: BenchError: out of memory" in markdown
