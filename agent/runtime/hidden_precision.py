"""Hidden states that leave a CPU stage in the precision it computes in, so that its residual stream is computed
in that precision too.

The CPU plugin keeps in f32 every node on the way back from an f32 output to the nearest matmul, "to keep the
output accurate" (``Graph::EnforceInferencePrecision``, unless the output's own precision already is the one it
computes in). A stage that ends in hidden states ends in the residual stream: a chain of adds running through
every layer back to its input, so the whole stream stayed f32 in a stage computing in bf16: two reorders a layer
around bf16 matmuls and no fused residual adds (57 reorders in a 14-layer SmolLM2 stage, 2 with its output in
bf16), ~0.2-0.4 ms a token a stage on a 2-core EPYC (``python -m bench shards``). A graph ending in logits (the
model's, or a stage's holding the LM head) never had it: its output follows a matmul. So the one graph the model
is computes its residual stream in bf16 where the CPU computes in bf16, and a stage's hidden states narrowed to
bf16 at its end are the values the whole model holds at that layer.

Numpy has no bfloat16 (OpenVINO's Python binding shows bf16 data as float16, which reads its bits wrongly): a
narrowed output is widened to f32 here, exactly (bf16 is the top half of an f32), before it goes on.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
from openvino.preprocess import PrePostProcessor

NARROWED = {"bf16": ov.Type.bf16, "f16": ov.Type.f16}
"""Precisions a CPU stage's hidden states leave in when it computes in them."""
CAPABILITY = {"bf16": "BF16", "f16": "FP16"}
"""The CPU's ``OPTIMIZATION_CAPABILITIES`` entry saying it computes in each of them."""


def narrows_hidden_states(core: ov.Core, device: str, ends_in_logits: bool, computes_in: str) -> bool:
    """Whether a stage graph's hidden-state output is narrowed to ``computes_in``: on a CPU that computes in it (a
    CPU without bf16 computes a bf16 hint in f32, and its stream stays f32); never on other devices (the GPU plugin
    computes its outputs as it is told)."""
    if device != "CPU" or ends_in_logits or computes_in not in NARROWED:
        return False
    return CAPABILITY[computes_in] in core.get_property(device, "OPTIMIZATION_CAPABILITIES")


def narrow_output(model: ov.Model, output: str, precision: str) -> ov.Model:
    """``model`` with its output ``output`` converted to ``precision`` (a convert at its end, fused away on
    compiling)."""
    steps = PrePostProcessor(model)
    steps.output(output).tensor().set_element_type(NARROWED[precision])
    return steps.build()


def widens(output: ov.Output) -> bool:
    """Whether a compiled ``output`` holds narrowed bf16 hidden states, read as f32 (a :class:`Widener`)."""
    return bool(output.get_element_type() == ov.Type.bf16)


class Widener:
    """Reads a narrowed bf16 output as f32 into a buffer it reuses: no allocation per decode step."""

    def __init__(self) -> None:
        self._buffer = np.empty(0, dtype=np.uint32)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """``values`` (bf16 bits, as OpenVINO's float16 view) as f32; valid until the next call."""
        bits = values.view(np.uint16)
        if self._buffer.size < bits.size:
            self._buffer = np.empty(bits.size, dtype=np.uint32)
        wide = self._buffer[: bits.size].reshape(bits.shape)
        np.left_shift(bits, 16, out=wide, dtype=np.uint32)
        return wide.view(np.float32)
