"""KV blocks in the paged compilation's own precision: the kept positions cross from the f32 state into bf16 blocks
and back. A rounding unlike the plugin's, or a lossy way back, would move every later logit."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as ops
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from openvino.op.util import Variable, VariableInfo

from agent.runtime.paged_prefill import BLOCK_PRECISIONS, BlockPrecision

BF16 = BLOCK_PRECISIONS["bf16"]
LIMIT = float(np.float32(1e38))  # beyond about 3.39e38 bf16 rounds to infinity
FINITE = st.floats(width=32, allow_subnormal=False, min_value=-LIMIT, max_value=LIMIT)


def decode(precision: BlockPrecision, blocks: np.ndarray) -> np.ndarray:
    """What blocks of ``precision`` hold, as f32 (exact: every value of these precisions is one in f32)."""
    if precision.element_type != ov.Type.bf16:
        return blocks.astype(np.float32)
    return (blocks.astype(np.uint32) << 16).view(np.float32)


def test_bf16_rounds_to_the_nearest_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1; 1 + 3 * 2^-8 halfway up to 1 + 2^-6
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.0, 0.0], dtype=np.float32)
    assert decode(BF16, BF16.encode(values)).tolist() == [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.0, 0.0]
    assert BF16.encode(values).dtype == np.uint16


@given(arrays(np.float32, st.integers(1, 64), elements=FINITE))
def test_bf16_blocks_keep_what_a_bf16_state_held(values: np.ndarray) -> None:
    """A bf16 KV state reads out as f32 values bf16 can hold: they must cross into blocks and back unchanged,
    or a prompt sent in chunks would attend to other keys than the same prompt in one step."""
    held = decode(BF16, BF16.encode(values))
    assert np.array_equal(decode(BF16, BF16.encode(held)), held)
    assert np.all(np.abs(held - values) <= np.abs(values) * 2**-8)


def test_f32_and_f16_blocks_are_numpy_casts() -> None:
    values = np.array([1.0, 1 / 3, -65504.0], dtype=np.float32)
    assert np.array_equal(decode(BLOCK_PRECISIONS["f32"], BLOCK_PRECISIONS["f32"].encode(values)), values)
    f16 = BLOCK_PRECISIONS["f16"]
    assert f16.encode(values).dtype == np.float16
    assert decode(f16, f16.encode(values)).tolist() == values.astype(np.float16).astype(np.float32).tolist()


def _state_request() -> ov.InferRequest:
    """A compiled model whose one f32 variable is shaped like a KV state, ``[1, heads, positions, head size]``."""
    info = VariableInfo()
    info.data_shape, info.data_type, info.variable_id = ov.PartialShape([1, 2, -1, 4]), ov.Type.f32, "kv"
    variable = Variable(info)
    start = ops.parameter([1, 2, -1, 4], ov.Type.f32, name="start")
    read = ops.read_value(start, variable)
    model = ov.Model(results=[ops.result(read)], sinks=[ops.assign(read, variable)], parameters=[start])
    request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    request.infer({"start": np.zeros((1, 2, 1, 4), np.float32)})
    return request


def test_an_f32_state_set_from_bf16_blocks_holds_what_decode_gives() -> None:
    """A paged step hands its bf16 blocks to the f32 KV state as they are and lets the plugin convert them: every
    finite bf16 value (subnormals included) must arrive as ``decode`` reads it, or the decode steps after a prompt
    would attend to other keys than the prompt wrote."""
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    finite = bits[(bits & 0x7F80) != 0x7F80]  # an exponent of all ones is an infinity or a NaN
    blocks = finite[: len(finite) // 8 * 8].reshape(1, 2, -1, 4)
    (state,) = _state_request().query_state()
    state.state = BF16.tensor(blocks)
    held = state.state.data
    assert held.dtype == np.float32
    assert np.array_equal(held.view(np.uint32), decode(BF16, blocks).view(np.uint32))
