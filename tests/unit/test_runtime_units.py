from __future__ import annotations

import numpy as np
import pytest

from agent.errors import RuntimeStageError, ShoalError
from agent.runtime.stage import (
    RuntimeConfig,
    choose_device,
    compacts_on_rewind,
    compile_properties,
    speculation_is_exact,
    splits_prefill,
)
from agent.sampling.params import Sampler, SamplingParams


@pytest.mark.parametrize(
    ("requested", "available", "chosen"),
    [
        ("AUTO", ["CPU"], "CPU"),
        ("AUTO", ["CPU", "GPU.1", "GPU.0", "NPU"], "GPU.0"),
        ("AUTO", ["CPU", "NPU"], "CPU"),
        ("gpu", ["CPU", "GPU.0"], "GPU.0"),
        ("GPU.1", ["CPU", "GPU.0", "GPU.1"], "GPU.1"),
        ("NPU", ["CPU", "NPU"], "NPU"),
    ],
)
def test_choose_device(requested: str, available: list[str], chosen: str) -> None:
    assert choose_device(requested, available) == chosen


@pytest.mark.parametrize(("requested", "message"), [("GPU", "not available"), ("TPU", "unknown device")])
def test_choose_device_refuses(requested: str, message: str) -> None:
    with pytest.raises(RuntimeStageError, match=message):
        choose_device(requested, ["CPU"])


def test_float_exports_compile_exact() -> None:
    props = compile_properties("CPU", "fp32", RuntimeConfig(threads=1))
    assert props["INFERENCE_PRECISION_HINT"] == "f32" and props["KV_CACHE_PRECISION"] == "f32"
    assert props["INFERENCE_NUM_THREADS"] == "1"
    assert compile_properties("GPU.0", "fp32", RuntimeConfig())["INFERENCE_PRECISION_HINT"] == "f32"
    assert compile_properties("GPU.0", "int4", RuntimeConfig(precision="f16"))["INFERENCE_PRECISION_HINT"] == "f16"
    with pytest.raises(RuntimeStageError):
        RuntimeConfig(precision="f8")


def test_compressed_exports_on_the_cpu_decode_with_f32_activations() -> None:
    """int4/int8 on the CPU: f32 activations quantized on the fly (no KV or dynamic-quantization overrides);
    long steps compile a second time in the plugin's default precision unless told not to."""
    decode = compile_properties("CPU", "int4", RuntimeConfig(rewind="mask"))
    assert decode["INFERENCE_PRECISION_HINT"] == "f32"
    assert "KV_CACHE_PRECISION" not in decode and "DYNAMIC_QUANTIZATION_GROUP_SIZE" not in decode
    assert splits_prefill("CPU", "int4", RuntimeConfig(), "bf16")
    assert not splits_prefill("CPU", "int4", RuntimeConfig(fast_prefill=False), "bf16")
    assert not splits_prefill("CPU", "int4", RuntimeConfig(prefill_attention="sdpa"), "bf16")
    assert splits_prefill("CPU", "int8", RuntimeConfig(fast_prefill=True), "bf16")
    # a CPU that computes in f32 by default (no bf16 or f16): a second compilation would be the first again
    assert not splits_prefill("CPU", "int8", RuntimeConfig(fast_prefill=True), "f32")
    assert "INFERENCE_PRECISION_HINT" not in compile_properties("CPU", "int4", RuntimeConfig(), prefill=True)
    # an explicit precision, another device or float weights: one compilation, as asked
    assert not splits_prefill("CPU", "int4", RuntimeConfig(precision="bf16", fast_prefill=True), "bf16")
    assert compile_properties("CPU", "int4", RuntimeConfig(precision="bf16"))["INFERENCE_PRECISION_HINT"] == "bf16"
    assert not splits_prefill("GPU.0", "int4", RuntimeConfig(fast_prefill=True), "f16")
    assert "INFERENCE_PRECISION_HINT" not in compile_properties("GPU.0", "int4", RuntimeConfig())
    assert not splits_prefill("CPU", "fp32", RuntimeConfig(fast_prefill=True), "bf16")


def test_rewinds_compact_where_that_makes_speculation_exact() -> None:
    """Measured (``RuntimeConfig.rewind``): f32 graphs are exact with masking on any thread count; below
    f32 only compaction on one thread is; on several threads nothing is, so ``auto`` masks (it is free)."""
    one = RuntimeConfig(threads=1)
    assert compacts_on_rewind("CPU", "int4", one) and speculation_is_exact("CPU", "int4", one)
    assert compacts_on_rewind("CPU", "int8", RuntimeConfig(threads=1, precision="bf16"))
    assert not compacts_on_rewind("CPU", "int4", RuntimeConfig(threads=1, precision="f32"))
    assert speculation_is_exact("CPU", "int4", RuntimeConfig(precision="f32"))
    assert not compacts_on_rewind("CPU", "fp32", one) and speculation_is_exact("CPU", "fp32", RuntimeConfig())
    assert not compacts_on_rewind("CPU", "int4", RuntimeConfig())  # all cores
    assert speculation_is_exact("CPU", "int4", RuntimeConfig(threads=2)) is False
    assert speculation_is_exact("CPU", "int4", RuntimeConfig(threads=1, rewind="mask")) is False
    assert not compacts_on_rewind("GPU.0", "int4", one) and speculation_is_exact("GPU.0", "int4", one) is None
    assert compacts_on_rewind("GPU.0", "fp32", RuntimeConfig(rewind="compact"))
    with pytest.raises(RuntimeStageError, match="rewind"):
        RuntimeConfig(rewind="trim")


def test_compacted_sessions_keep_a_kv_cache_that_survives_the_copy() -> None:
    """u8 KV would be quantized anew by every compaction: bf16 where the CPU computes in it, else f32."""

    def kv(weights: str, config: RuntimeConfig, **kwargs: object) -> str | None:
        return compile_properties("CPU", weights, config, **kwargs).get("KV_CACHE_PRECISION")  # type: ignore[arg-type]

    one = RuntimeConfig(threads=1)
    assert kv("int4", one, default_precision="bf16") == "bf16"
    assert kv("int4", one, prefill=True, default_precision="bf16") == "bf16"
    assert kv("int4", one, default_precision="f32") == "f32"
    assert kv("int4", RuntimeConfig(rewind="compact", precision="f32"), default_precision="bf16") == "f32"
    assert kv("int4", RuntimeConfig(rewind="mask")) is None  # the plugin's own choice (u8)
    assert "KV_CACHE_PRECISION" not in compile_properties("GPU.0", "int4", RuntimeConfig(rewind="compact"))


def test_greedy_picks_argmax() -> None:
    logits = np.array([0.1, 3.0, -1.0, 2.9])
    assert Sampler(SamplingParams()).pick(logits) == 1


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    probs = Sampler(SamplingParams(temperature=1.0, top_k=2)).probabilities(logits)
    assert np.count_nonzero(probs) == 2 and probs[0] == pytest.approx(0.5 / 0.8)
    probs = Sampler(SamplingParams(temperature=1.0, top_p=0.85)).probabilities(logits)
    assert np.count_nonzero(probs) == 3


def test_seeded_sampling_is_repeatable_and_follows_the_distribution() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1]))
    draws = [Sampler(SamplingParams(temperature=1.0, seed=5)).pick(logits) for _ in range(3)]
    assert len(set(draws)) == 1
    sampler = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = np.bincount([sampler.pick(logits) for _ in range(6000)], minlength=3) / 6000
    assert np.allclose(counts, [0.6, 0.3, 0.1], atol=0.03)


def test_bad_sampling_params() -> None:
    with pytest.raises(ShoalError):
        SamplingParams(temperature=-1)
    with pytest.raises(ShoalError):
        SamplingParams(top_p=0)
