"""Compiling a stage: device choice, threads, precision and the compiled-model cache."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import openvino as ov

from agent.runtime.session import StageSession
from shards.errors import RuntimeStageError
from shards.manifest import LOGITS_INDEX, GraphEntry

log = logging.getLogger(__name__)

KNOWN_DEVICES = ("AUTO", "CPU", "GPU", "NPU")
PRECISIONS = ("auto", "f32", "bf16", "f16")


@dataclass(frozen=True)
class RuntimeConfig:
    """How stages are compiled on this PC."""

    device: str = "AUTO"
    threads: int | None = None
    """CPU inference threads; None lets OpenVINO decide."""
    cache_dir: Path | None = None
    """OpenVINO compiled-model cache; a restart then skips compilation."""
    precision: str = "auto"
    """Inference precision: ``auto``, or ``f32``, ``bf16``, ``f16`` throughout. ``auto`` on the CPU with
    int4/int8 weights computes with f32 activations, which the plugin quantizes to int8 on the fly for
    its int8 kernels (measured on a Xeon with AMX: 15-25 % less time per token than its bf16 default,
    and verifying K+1 positions at once costs far less); elsewhere ``auto`` is the plugin's default.
    In bf16, or with activations quantized on the fly, the CPU plugin rounds differently where a graph
    is cut into stages: only ``f32`` makes a split int4/int8 export token-identical to its 1-stage export."""
    fast_prefill: bool = False
    """With ``auto`` on the CPU and int4/int8 weights: a second compilation in the plugin's default
    precision runs long steps (prompts), the KV state moved across. bf16 prefill is ~1.8x faster on CPUs
    with AMX, for twice the stage's memory (each compilation packs its own copy of the weights). Where the
    plugin's default is f32 anyway (a CPU without bf16 or f16), nothing would be gained and the stage
    compiles once."""
    compact_rewind: bool = False
    """Rewind by dropping rejected positions from the KV state (one copy of the state per rewind) instead
    of masking them out. With activations quantized on the fly the CPU plugin lets masked positions move
    later logits (by up to ~0.6 on SmolLM2: its quantization groups appear to run along the sequence), so
    speculative greedy decoding drifts from plain decoding; compacted, it is token-identical. The KV
    cache is then kept in f16 (u8 would be re-quantized by the copy)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise RuntimeStageError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")


def choose_device(requested: str, available: list[str]) -> str:
    """Resolve AUTO or check an explicit device against ``ov.Core().available_devices``.

    AUTO prefers a GPU (the iGPU of an AI PC), then the CPU. The NPU is never chosen
    automatically: its plugin needs static shapes, and stage graphs have dynamic lengths.
    """
    requested = requested.upper()
    if requested == "AUTO":
        gpus = sorted(d for d in available if d.startswith("GPU"))
        if gpus:
            return gpus[0]
        if "CPU" in available:
            return "CPU"
        raise RuntimeStageError(f"no usable device among {available}")
    family = requested.split(".")[0]
    if family not in KNOWN_DEVICES:
        raise RuntimeStageError(f"unknown device {requested!r}: use one of {', '.join(KNOWN_DEVICES)}")
    if requested in available:
        return requested
    matching = sorted(d for d in available if d.split(".")[0] == requested)
    if matching:
        return matching[0]
    raise RuntimeStageError(f"device {requested} is not available here (available: {', '.join(available) or 'none'})")


def splits_prefill(device: str, weights: str, config: RuntimeConfig, default_precision: str) -> bool:
    """Whether a stage gets a second compilation for long steps (see ``RuntimeConfig.fast_prefill``).

    ``default_precision``: the device's own inference precision (``f32``, ``bf16``, ``f16``), which the
    long-step compilation would run in; at ``f32`` it would be the decode compilation over again, and
    moving the KV state across (u8 by default) would only re-round it.
    """
    return config.fast_prefill and _quantizes_on_the_fly(device, weights, config) and default_precision != "f32"


def default_inference_precision(core: ov.Core, device: str) -> str:
    """The precision ``device`` computes in when not told otherwise (``f32``, ``bf16``, ``f16``)."""
    return core.get_property(device, "INFERENCE_PRECISION_HINT").to_string()


def _quantizes_on_the_fly(device: str, weights: str, config: RuntimeConfig) -> bool:
    return config.precision == "auto" and device == "CPU" and weights in ("int4", "int8")


def compile_properties(device: str, weights: str, config: RuntimeConfig, *, prefill: bool = False) -> dict[str, str]:
    """OpenVINO properties for compiling one stage graph (``prefill``: its long-step compilation)."""
    props = {"PERFORMANCE_HINT": "LATENCY"}
    if config.cache_dir is not None:
        props["CACHE_DIR"] = str(config.cache_dir)
    if device == "CPU" and config.threads:
        props["INFERENCE_NUM_THREADS"] = str(config.threads)
    if config.compact_rewind and device == "CPU":
        # The state is read and written back on every rewind: u8 would be quantized anew each time.
        props["KV_CACHE_PRECISION"] = "f16"
    if _quantizes_on_the_fly(device, weights, config) and not prefill:
        # f32 activations: the plugin then quantizes them to int8 on the fly (its default) for int8 kernels
        props["INFERENCE_PRECISION_HINT"] = "f32"
        return props
    precision = config.precision
    if weights in ("fp32", "fp16"):
        # Float exports must reproduce the float reference: by default the CPU plugin computes in
        # bf16 where the CPU has it and keeps the KV cache in u8 (logits then drift by ~0.3 from
        # the second step on). Measured here with OpenVINO 2026.4: float weights in bf16 on one
        # thread also crash the CPU plugin's compilation with SIGFPE.
        precision = "f32"
    if precision != "auto":
        props["INFERENCE_PRECISION_HINT"] = precision
    if precision == "f32":
        props["KV_CACHE_PRECISION"] = "f32"
        # The CPU plugin also quantizes activations of int4/int8 matmuls on the fly (groups of 32);
        # that turns the tiny differences a mask-rewound cache leaves into logit changes of ~1, so
        # speculative greedy decoding stopped matching plain decoding (measured by the ring bench).
        props["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = "0"
    return props


class CompiledStage:
    """One stage graph compiled for this PC; hands out per-session :class:`StageSession` s."""

    def __init__(
        self,
        export_dir: Path,
        graph: GraphEntry,
        weights: str,
        config: RuntimeConfig,
        core: ov.Core | None = None,
    ) -> None:
        self.graph = graph
        self.compact_rewind = config.compact_rewind
        self.core = core or ov.Core()
        self.device = choose_device(config.device, self.core.available_devices)
        if config.cache_dir is not None:
            config.cache_dir.mkdir(parents=True, exist_ok=True)
        props = compile_properties(self.device, weights, config)
        xml = export_dir / graph.xml
        self.prefill_compiled: ov.CompiledModel | None = None
        try:
            # Compiling from the path (not a read model) lets OpenVINO use its model cache.
            self.compiled = self.core.compile_model(str(xml), self.device, props)
            if config.fast_prefill:
                default = default_inference_precision(self.core, self.device)
                if splits_prefill(self.device, weights, config, default):
                    self.prefill_compiled = self.core.compile_model(
                        str(xml), self.device, compile_properties(self.device, weights, config, prefill=True))
                else:
                    log.info("%s: no prefill compilation (%s weights, precision %s, %s computes in %s by default)",
                             graph.name, weights, config.precision, self.device, default)
        except RuntimeError as exc:
            raise RuntimeStageError(f"{graph.name}: cannot compile {xml} on {self.device}: {exc}") from exc
        log.info("compiled %s (layers %d-%d) on %s", graph.name, graph.layer_start, graph.layer_stop - 1,
                 self.device)

    def new_session(self) -> StageSession:
        """A fresh KV state for one conversation."""
        output = self.graph.outputs[0]
        prefill = None
        if self.prefill_compiled is not None:
            prefill = (self.prefill_compiled.create_infer_request(), self.prefill_compiled.output(output))
        return StageSession(self.compiled.create_infer_request(), self.graph.inputs[0], self.compiled.output(output),
                            holds_head=self.graph.head, selects_positions=LOGITS_INDEX in self.graph.inputs,
                            prefill=prefill, compact_rewind=self.compact_rewind)
