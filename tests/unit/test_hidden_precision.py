"""Hidden states narrowed to bf16 at a CPU stage's end are read back as f32 exactly (agent.runtime.hidden_precision)."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from agent.runtime.hidden_precision import Widener, narrow_output, narrows_hidden_states, widens


class _Cpu:
    """A core whose CPU says what it computes in (``OPTIMIZATION_CAPABILITIES``), as OpenVINO's does."""

    def __init__(self, capabilities: list[str]) -> None:
        self.capabilities = capabilities

    def get_property(self, device: str, name: str) -> list[str]:
        assert (device, name) == ("CPU", "OPTIMIZATION_CAPABILITIES")
        return self.capabilities


@pytest.mark.parametrize(
    ("device", "ends_in_logits", "computes_in", "capabilities", "narrows"),
    [
        ("CPU", False, "bf16", ["BF16", "FP32"], True),
        ("CPU", False, "f16", ["FP16", "FP32"], True),
        ("CPU", True, "bf16", ["BF16", "FP32"], False),  # logits follow a matmul: nothing to gain, nothing rounded
        ("CPU", False, "f32", ["BF16", "FP32"], False),
        ("CPU", False, "bf16", ["FP32", "INT8"], False),  # a bf16 hint computes in f32 there
        ("GPU", False, "f16", ["FP16", "FP32"], False),
    ],
)
def test_only_a_cpu_stage_computing_below_f32_narrows_its_hidden_states(
    device: str, ends_in_logits: bool, computes_in: str, capabilities: list[str], narrows: bool
) -> None:
    core = _Cpu(capabilities)
    assert narrows_hidden_states(core, device, ends_in_logits, computes_in) is narrows  # type: ignore[arg-type]


def test_widened_values_are_the_bf16_values_exactly_in_a_reused_buffer() -> None:
    values = np.random.default_rng(7).standard_normal((1, 5, 64)).astype(np.float32) * 100
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: its bits, as OpenVINO shows them
    widen = Widener()
    wide = widen(bits.view(np.float16))
    assert wide.dtype == np.float32 and wide.shape == values.shape
    assert np.array_equal(wide.view(np.uint32), bits.astype(np.uint32) << 16)
    assert np.all(np.abs(wide - values) <= np.abs(values) * 2**-7)  # within bf16's rounding of each value
    one = widen(bits[:, :1].view(np.float16))
    assert np.shares_memory(one, wide)  # a shorter step reuses the buffer: no allocation per decode step
    assert np.array_equal(one.view(np.uint32), bits[:, :1].astype(np.uint32) << 16)


def test_a_narrowed_output_compiles_to_bf16_and_reads_back_as_its_rounded_f32() -> None:
    core = ov.Core()
    if not narrows_hidden_states(core, "CPU", False, "bf16"):
        pytest.skip("this CPU does not compute in bf16")
    x = ops.parameter([1, 4], np.float32, name="x")
    total = ops.add(x, x)
    total.output(0).get_tensor().set_names({"last_hidden_state"})
    model = narrow_output(ov.Model([total], [x]), "last_hidden_state", "bf16")
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
    assert widens(compiled.output(0))
    feed = np.array([[1.0, 1.00390625, 3.14159, -2.5]], dtype=np.float32)
    out = compiled.create_infer_request().infer({0: feed}, share_outputs=True)[compiled.output(0)]
    assert out.dtype == np.float16  # the binding's view of bf16 bits: wrong unless widened
    assert Widener()(out).tolist() == [[2.0, 2.0, 6.28125, -5.0]]
