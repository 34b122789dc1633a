"""Long steps on the PagedAttention compilation (``agent.runtime.paged_prefill``): the KV state must cross into
the blocks and back exactly, with rejected drafts left out, or the next steps attend to the wrong positions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from agent.runtime.config import RuntimeConfig
from agent.runtime.session import StageSession
from agent.runtime.stage import CompiledStage, default_inference_precision
from shards.manifest import Manifest

DECODED = (504, 3575, 28)


def _stages(folder: Path, **config: object) -> list[CompiledStage]:
    manifest = Manifest.load(folder)
    runtime = RuntimeConfig(device="CPU", **config)  # type: ignore[arg-type]
    return [CompiledStage(folder, graph, manifest.weights, runtime) for graph in manifest.stages]


def _step(sessions: Sequence[StageSession], ids: Sequence[int], last_only: bool = False) -> np.ndarray:
    x = np.asarray([list(ids)], dtype=np.int64)
    for i, session in enumerate(sessions):
        x = np.array(session.step(x, last_only=last_only and i == len(sessions) - 1))
    return x[0, -1]


def _logits(stages: Sequence[CompiledStage], prompt: Sequence[Sequence[int]], turn: Sequence[int]) -> list[np.ndarray]:
    """A prompt (sent in the given chunks), decode steps attending to it, a second long step, one more step."""
    sessions = [stage.new_session() for stage in stages]
    out = [_step(sessions, chunk, last_only=True) for chunk in prompt][-1:]
    out += [_step(sessions, [token]) for token in DECODED]
    out += [_step(sessions, turn, last_only=True), _step(sessions, [28])]
    return out


def _distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def _document(length: int, seed: int = 7) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 40000, size=length)]


def test_a_paged_long_step_gives_the_sdpa_graphs_logits(exported: Callable[..., Path], cache_dir: Path) -> None:
    """In f32 the two attention kernels differ only in rounding (about 3e-5 here); a state that failed to cross
    would move the next logits by whole units, as leaving the prompt out does."""
    folder = exported(1, "int4")
    ov_cache = cache_dir / "ov"
    paged = _stages(folder, precision="f32", cache_dir=ov_cache)
    sdpa = _stages(folder, precision="f32", cache_dir=ov_cache, prefill_attention="sdpa")
    assert sdpa[0].paged_prefill() is None
    prompt, turn = _document(400), _document(200, seed=8)
    want, got = _logits(sdpa, [prompt], turn), _logits(paged, [prompt], turn)
    assert paged[0].paged_prefill() is not None
    assert [int(np.argmax(g)) for g in got] == [int(np.argmax(w)) for w in want]
    assert _distance(got, want) <= 1e-3
    lost = _logits(sdpa, [turn], turn)
    assert _distance(lost, want) > 1.0


@pytest.mark.parametrize("precision", ["auto", "f32"])
def test_a_prompt_in_chunks_leaves_the_one_step_state(
    exported: Callable[..., Path], cache_dir: Path, precision: str
) -> None:
    """Through all three stages (a middle stage takes hidden states), one thread: a 700-position document sent in
    chunks of 234-233 positions gives bit-identical logits to one step, then and on every later step, in the
    int4 default precision as in f32; so does one step that each stage infers 200 positions at a time (the
    middle stage's rows joined, the head's unread parts skipped). (By default, on a CPU computing in bf16, prompts
    run in bf16 with KV blocks in bf16, which the kept positions must cross into exactly; elsewhere in f32
    activations quantized on the fly.)"""
    stages = _stages(exported(3, "int4"), threads=1, precision=precision, cache_dir=cache_dir / "ov")
    document = _document(700)
    whole = _logits(stages, [document], DECODED)
    chunked = _logits(stages, [document[:234], document[234:467], document[467:]], DECODED)
    assert _distance(chunked, whole) == 0.0
    for stage in stages:
        prefill = stage.paged_prefill()
        assert prefill is not None and prefill.inference_positions > len(document)
        prefill.inference_positions = 200
    assert _distance(_logits(stages, [document], DECODED), whole) == 0.0


def test_rejected_drafts_stay_out_of_a_paged_step(exported: Callable[..., Path], cache_dir: Path) -> None:
    """A session that masked rejected drafts (the rewind f32 uses) hands only its kept positions to the paged step:
    the next turn's logits are those of a session that cut the drafts out of its state, bit for bit."""
    folder = exported(1, "int4")
    document, turn, drafts = _document(300), _document(200, seed=8), [3575, 28, 11]

    def turn_logits(rewind: str, rejected: int) -> list[np.ndarray]:
        stages = _stages(folder, threads=2, precision="f32", rewind=rewind, cache_dir=cache_dir / "ov")
        sessions = [stage.new_session() for stage in stages]
        _step(sessions, document, last_only=True)
        _step(sessions, [DECODED[0], *drafts])
        for session in sessions:
            session.rewind(rejected)
        return [_step(sessions, turn, last_only=True), _step(sessions, [28])]

    masked = turn_logits("mask", len(drafts))
    assert _distance(masked, turn_logits("compact", len(drafts))) == 0.0
    assert _distance(masked, turn_logits("mask", 0)) > 0.01, "the drafts were never in the way"


def test_fast_prefill_computes_prompts_in_the_default_precision(
    exported: Callable[..., Path],
    cache_dir: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """``fast_prefill``: the paged compilation runs in the CPU's default precision (bf16 where the CPU has it),
    the decode compilation in f32 activations; the answer stays within the rounding the default precision
    itself puts between logits. On a CPU computing in f32 anyway both compile alike."""
    folder = exported(1, "int4")
    ov_cache = cache_dir / "ov"
    default = default_inference_precision(ov.Core(), "CPU")
    record_property("cpu_default_precision", default)
    fast = _stages(folder, cache_dir=ov_cache, fast_prefill=True)
    paged = fast[0].paged_prefill()
    assert paged is not None
    assert paged.compiled.get_property("INFERENCE_PRECISION_HINT").to_string() == default
    single = _stages(folder, cache_dir=ov_cache, fast_prefill=False)
    prompt, turn = _document(400), _document(200, seed=8)
    got, want = _logits(fast, [prompt], turn), _logits(single, [prompt], turn)
    rounded = _logits(_stages(folder, cache_dir=ov_cache, precision=default), [prompt], turn)
    worst, rounding = _distance(got, want), _distance(rounded, want)
    record_property("max_abs_logit_difference", worst)
    assert worst <= 2 * rounding + 0.1
