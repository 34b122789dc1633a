"""``fast_prefill``: a compressed export on the CPU decodes in one compilation and prefills in another;
the KV state must cross between them both ways, or the next step attends to nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.runtime import RuntimeConfig
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest


def test_prefill_in_its_own_compilation_hands_the_kv_state_over(
    exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]],
    record_property: Callable[[str, object], None],
) -> None:
    folder = exported(1, "int4")
    manifest = Manifest.load(folder)
    graph = manifest.stages[0]
    split = CompiledStage(folder, graph, manifest.weights,
                          RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", fast_prefill=True))
    assert split.prefill_compiled is not None, "int4 on the CPU should get a prefill compilation"
    # the reference: the decode compilation alone (f32 activations, quantized on the fly) does everything
    single = CompiledStage(folder, graph, manifest.weights, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    assert single.prefill_compiled is None
    prompt, turn = chat_ids[0], chat_ids[1]

    def logits(stage: CompiledStage) -> list[np.ndarray]:
        session = stage.new_session()
        out = [np.array(session.step(np.asarray([prompt]), last_only=True))[0, -1]]  # a prefill
        for token in (504, 3575, 28):  # decode steps attend to what the prefill left
            out.append(np.array(session.step(np.asarray([[token]])))[0, -1])
        out.append(np.array(session.step(np.asarray([turn]), last_only=True))[0, -1])  # a second long step
        out.append(np.array(session.step(np.asarray([[28]])))[0, -1])
        return out

    got, want = logits(split), logits(single)
    # the plugin's default (bf16) throughout: how far plain rounding moves these logits from f32
    bf16 = logits(CompiledStage(folder, graph, manifest.weights,
                                RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov", precision="bf16")))
    worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    rounding = max(float(np.abs(b - w).max()) for b, w in zip(bf16, want, strict=True))
    record_property("max_abs_logit_difference", worst)
    print(f"\nprefill split vs one compilation: max abs logit difference {worst:.4f} (bf16 throughout: {rounding:.4f})")
    for g, w in zip(got, want, strict=True):
        assert int(np.argmax(g)) == int(np.argmax(w))
    # Only the prefill rounds in bf16 here, so the split stays within the bf16 compilation's distance;
    # a lost or misaligned KV state fails the step outright or moves logits by far more.
    assert worst <= 2 * rounding + 0.1
