"""``fast_prefill``: a compressed export on the CPU decodes in one compilation and prefills in another;
the KV state must cross between them both ways, or the next step attends to nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov

from agent.runtime.config import RuntimeConfig
from agent.runtime.session import StageSession
from agent.runtime.stage import CompiledStage, default_inference_precision
from shards.manifest import Manifest


def _logits(session: StageSession, prompt: list[int], turn: list[int], *, with_prompt: bool = True) -> list[np.ndarray]:
    """A prefill, decode steps attending to it, a second long step and one more decode step."""
    out = []
    if with_prompt:
        out.append(np.array(session.step(np.asarray([prompt]), last_only=True))[0, -1])
    for token in (504, 3575, 28):
        out.append(np.array(session.step(np.asarray([[token]])))[0, -1])
    out.append(np.array(session.step(np.asarray([turn]), last_only=True))[0, -1])
    out.append(np.array(session.step(np.asarray([[28]])))[0, -1])
    return out


def _distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_the_kv_state_crosses_between_compilations_exactly(
    exported: Callable[..., Path],
    cache_dir: Path,
    chat_ids: list[list[int]],
) -> None:
    """Long steps in a second compilation of the same graph: with an f32 KV cache (no re-rounding when the
    state is set) the split session gives exactly the logits of one compilation, on any CPU."""
    folder = exported(1, "int4")
    manifest = Manifest.load(folder)
    graph = manifest.stages[0]
    config = RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision="f32")
    single, split = (CompiledStage(folder, graph, manifest.weights, config) for _ in range(2))
    # what fast_prefill would do, with a second compilation that rounds nothing differently
    split.prefill_compiled = CompiledStage(folder, graph, manifest.weights, config).compiled

    prompt, turn = chat_ids[0], chat_ids[1]
    want = _logits(single.new_session(), prompt, turn)
    got = _logits(split.new_session(), prompt, turn)
    assert _distance(got, want) <= 1e-5
    # what a state left behind would look like: the same steps without the prompt
    lost = _logits(single.new_session(), prompt, turn, with_prompt=False)
    assert _distance(lost, want[1:]) > 1.0


def test_fast_prefill_hands_the_kv_state_over_in_the_default_precision(
    exported: Callable[..., Path],
    cache_dir: Path,
    chat_ids: list[list[int]],
    record_property: Callable[[str, object], None],
) -> None:
    """The real ``fast_prefill`` split: only where the CPU's default precision is below f32 (elsewhere it
    compiles once), and then within the distance the default precision itself puts between logits."""
    folder = exported(1, "int4")
    manifest = Manifest.load(folder)
    graph = manifest.stages[0]
    split = CompiledStage(
        folder, graph, manifest.weights, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", fast_prefill=True)
    )
    default = default_inference_precision(ov.Core(), "CPU")
    record_property("cpu_default_precision", default)
    if default == "f32":
        assert split.prefill_compiled is None, "a CPU computing in f32 gains nothing from a second compilation"
        return
    assert split.prefill_compiled is not None, "int4 on the CPU should get a prefill compilation"
    # the reference: the decode compilation alone (f32 activations, quantized on the fly) does everything
    single = CompiledStage(folder, graph, manifest.weights, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    assert single.prefill_compiled is None
    prompt, turn = chat_ids[0], chat_ids[1]
    got, want = _logits(split.new_session(), prompt, turn), _logits(single.new_session(), prompt, turn)
    # the plugin's default throughout: how far plain rounding moves these logits from f32
    rounded = CompiledStage(
        folder, graph, manifest.weights, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision=default)
    )
    worst, rounding = _distance(got, want), _distance(_logits(rounded.new_session(), prompt, turn), want)
    record_property("max_abs_logit_difference", worst)
    print(
        f"\nprefill split vs one compilation: max abs logit difference {worst:.4f} "
        f"({default} throughout: {rounding:.4f})"
    )
    for g, w in zip(got, want, strict=True):
        assert int(np.argmax(g)) == int(np.argmax(w))
    # Only the prefill rounds in the default precision here, so the split stays within that compilation's
    # distance; a lost or misaligned KV state fails the step outright or moves logits by far more.
    assert worst <= 2 * rounding + 0.1
