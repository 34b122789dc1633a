"""KV blocks in the paged compilation's own precision: the kept positions cross from the f32 state into bf16 blocks
and back. A rounding unlike the plugin's, or a lossy way back, would move every later logit."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from agent.runtime.paged_prefill import BLOCK_PRECISIONS

BF16 = BLOCK_PRECISIONS["bf16"]
LIMIT = float(np.float32(1e38))  # beyond about 3.39e38 bf16 rounds to infinity
FINITE = st.floats(width=32, allow_subnormal=False, min_value=-LIMIT, max_value=LIMIT)


def test_bf16_rounds_to_the_nearest_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: to the even one, 1; 1 + 3 * 2^-8 halfway up to 1 + 2^-6
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.0, 0.0], dtype=np.float32)
    assert BF16.decode(BF16.encode(values)).tolist() == [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.0, 0.0]
    assert BF16.encode(values).dtype == np.uint16


@given(arrays(np.float32, st.integers(1, 64), elements=FINITE))
def test_bf16_blocks_keep_what_a_bf16_state_held(values: np.ndarray) -> None:
    """A bf16 KV state reads out as f32 values bf16 can hold: they must cross into blocks and back unchanged,
    or a prompt sent in chunks would attend to other keys than the same prompt in one step."""
    held = BF16.decode(BF16.encode(values))
    assert np.array_equal(BF16.decode(BF16.encode(held)), held)
    assert np.all(np.abs(held - values) <= np.abs(values) * 2**-8)


def test_f32_and_f16_blocks_are_numpy_casts() -> None:
    values = np.array([1.0, 1 / 3, -65504.0], dtype=np.float32)
    assert np.array_equal(BLOCK_PRECISIONS["f32"].decode(BLOCK_PRECISIONS["f32"].encode(values)), values)
    f16 = BLOCK_PRECISIONS["f16"]
    assert f16.encode(values).dtype == np.float16
    assert f16.decode(f16.encode(values)).tolist() == values.astype(np.float16).astype(np.float32).tolist()
