"""Compiling a stage: device choice, threads, precision and the compiled-model cache."""

from __future__ import annotations

import hashlib
import logging
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import openvino as ov

from agent.errors import RuntimeStageError
from agent.runtime.config import DEFAULT_KV_POSITIONS, KNOWN_DEVICES, RuntimeConfig
from agent.runtime.hidden_precision import narrow_output, narrows_hidden_states
from agent.runtime.kernel_caches import bound_primitive_cache, cpu_cache_properties
from agent.runtime.paged_kv import (
    PagedKV,
    PagedKVSession,
    paged_computes_alike,
    paged_packs_alike,
    paged_pads,
    paged_speculation_is_exact,
    pool_blocks,
)
from agent.runtime.paged_prefill import PagedPrefill, PagedStep, compile_paged_prefill
from agent.runtime.pipeline import PipelineSession
from agent.runtime.protocol import new_sessions
from agent.runtime.repeatable import ALIKE
from agent.runtime.session import StageSession
from agent.runtime.tuning import PrecisionChoice, choose_precision
from shards.manifest import LOGITS_INDEX, GraphEntry, Manifest

log = logging.getLogger(__name__)

COMPILE_RECIPE = "r3"
"""What shoal does to a stage graph before compiling it, in the key of a timed precision choice: a change that
moves what a precision costs times the candidates again. r2: hidden states narrowed
(``agent.runtime.hidden_precision``); r3: 5 rounds of 32 steps (were 3 of 16)."""


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


def pages_prefill(device: str, config: RuntimeConfig) -> bool:
    """Whether a stage's long steps run on a PagedAttention compilation (see ``RuntimeConfig.prefill_attention``):
    on the CPU, whose plugin lays KV blocks out as ``agent.runtime.paged_prefill`` reads them."""
    return config.prefill_attention == "paged" and device == "CPU"


def splits_prefill(device: str, weights: str, config: RuntimeConfig, default_precision: str) -> bool:
    """Whether long steps compute in the device's default precision (see ``RuntimeConfig.fast_prefill``).

    ``default_precision``: the device's own inference precision (``f32``, ``bf16``, ``f16``), which the
    long-step compilation would run in; at ``f32`` it would be the decode compilation's precision anyway.
    """
    return (
        config.fast_prefill
        and pages_prefill(device, config)
        and _quantizes_on_the_fly(device, weights, config)
        and default_precision != "f32"
    )


def default_inference_precision(core: ov.Core, device: str) -> str:
    """The precision ``device`` computes in when not told otherwise (``f32``, ``bf16``, ``f16``)."""
    return core.get_property(device, "INFERENCE_PRECISION_HINT").to_string()


def compacts_on_rewind(device: str, weights: str, config: RuntimeConfig) -> bool:
    """Whether sessions of a stage cut rejected drafts out of the KV state (see ``RuntimeConfig.rewind``)."""
    if config.rewind != "auto":
        return config.rewind == "compact"
    return device == "CPU" and config.threads == 1 and not _computes_in_f32(weights, config)


def speculation_is_exact(device: str, weights: str, config: RuntimeConfig) -> bool | None:
    """Whether speculative greedy decoding on this stage equals plain greedy decoding (None: not measured,
    another device). See ``RuntimeConfig.rewind`` for the measurements behind it."""
    if device != "CPU":
        return None
    return _computes_in_f32(weights, config) or (config.threads == 1 and compacts_on_rewind(device, weights, config))


def computes_alike(device: str, weights: str, config: RuntimeConfig) -> str:
    """What a stage computes the same however positions are grouped into steps (``agent.runtime.repeatable``):
    ``all`` in f32 on the CPU; ``prompts`` on one CPU thread below f32 with the paged prefill, on which its
    sessions then run every prompt step; else ``none`` (several threads, other devices: not alike, not measured)."""
    if device != "CPU":
        return "none"
    if _computes_in_f32(weights, config):
        return "all"
    return "prompts" if config.threads == 1 and pages_prefill(device, config) else "none"


def decode_candidates(device: str, weights: str, config: RuntimeConfig, default_precision: str) -> tuple[str, ...]:
    """The precisions (``RuntimeConfig.precision`` values) a stage's decoding may be timed in on this PC, the
    rule's own first: where ``auto`` quantizes activations on the fly, also the device's default precision, unless
    that would claim less exactness (``speculation_is_exact``, ``computes_alike``) than the rule's choice. A
    precision the user named, float weights, other devices: the one given, nothing timed."""
    if not _quantizes_on_the_fly(device, weights, config) or default_precision == "f32":
        return (config.precision,)
    default = replace(config, precision=default_precision)
    exact = speculation_is_exact(device, weights, config)
    if (exact is True and speculation_is_exact(device, weights, default) is not True) or ALIKE.index(
        computes_alike(device, weights, default)
    ) < ALIKE.index(computes_alike(device, weights, config)):
        return (config.precision,)
    return (config.precision, default_precision)


TIMED_PROMPT = 32
"""Positions in the cache before a candidate precision's decode steps are timed."""
TIMED_STEPS = (8, 32)
"""Untimed one-position steps before a candidate's first timing, and timed ones per timing (``TIMING_ROUNDS``
of them): about half a second a candidate on a SmolLM2 stage, once per PC."""


def decode_timer(
    compiled: ov.CompiledModel, graph: GraphEntry, clock: Callable[[], float] = time.perf_counter
) -> Callable[[], float]:
    """A timing of ``graph`` compiled as ``compiled``: each call gives the median ms of ``TIMED_STEPS`` one-position
    steps of one session, which first took a ``TIMED_PROMPT``-position prompt (token ids, or hidden states of the
    graph's width) and a few untimed steps."""
    session = StageSession(
        compiled.create_infer_request(),
        graph.inputs[0],
        compiled.output(graph.outputs[0]),
        holds_head=graph.head,
        selects_positions=LOGITS_INDEX in graph.inputs,
    )

    def inputs(n: int) -> np.ndarray:
        if graph.embeddings:
            return np.full((1, n), 300, dtype=np.int64)  # a step's cost does not depend on the token
        hidden = compiled.input(graph.inputs[0]).get_partial_shape()[2].get_length()
        return (0.1 * np.random.default_rng(n).standard_normal((1, n, hidden))).astype(np.float32)

    session.step(inputs(TIMED_PROMPT), last_only=True)
    one = inputs(1)
    warm, timed = TIMED_STEPS
    for _ in range(warm):
        session.step(one, last_only=True)

    def time_steps() -> float:
        seconds = []
        for _ in range(timed):
            started = clock()
            session.step(one, last_only=True)
            seconds.append(clock() - started)
        return 1e3 * statistics.median(seconds)

    return time_steps


def _computes_in_f32(weights: str, config: RuntimeConfig) -> bool:
    """f32 activations, KV cache and matmuls throughout (``compile_properties`` makes it so)."""
    return config.precision == "f32" or weights in ("fp32", "fp16")


def _quantizes_on_the_fly(device: str, weights: str, config: RuntimeConfig) -> bool:
    return config.precision == "auto" and device == "CPU" and weights in ("int4", "int8")


def compile_properties(
    device: str, weights: str, config: RuntimeConfig, *, prefill: bool = False, default_precision: str = "f32"
) -> dict[str, str]:
    """OpenVINO properties for compiling one stage graph (``prefill``: its long-step compilation;
    ``default_precision``: what the device computes in when not told, see ``default_inference_precision``)."""
    props = {"PERFORMANCE_HINT": "LATENCY"}
    if config.cache_dir is not None:
        props["CACHE_DIR"] = str(config.cache_dir)
    if device == "CPU" and config.threads:
        props["INFERENCE_NUM_THREADS"] = str(config.threads)
    if device == "CPU":
        props.update(cpu_cache_properties())
    if device == "CPU" and compacts_on_rewind(device, weights, config):
        # The state is read out and written back on every rewind: u8 would be quantized anew each time.
        # bf16 where the CPU computes in it (its state copies and steps were the fastest measured: f16
        # made both slower on a Xeon with AMX), f32 elsewhere; an f32 graph overrides this below.
        props["KV_CACHE_PRECISION"] = "bf16" if default_precision == "bf16" else "f32"
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


def _compiled_precision(compiled: ov.CompiledModel) -> str | None:
    """The precision a compiled model computes in (``f32``, ``bf16``, ``f16``), None where the device does
    not say."""
    try:
        return str(compiled.get_property("INFERENCE_PRECISION_HINT").to_string())
    except RuntimeError:
        return None


class CompiledStage:
    """One stage graph compiled for this PC; hands out per-session :class:`StageSession` s."""

    def __init__(
        self,
        export_dir: Path,
        graph: GraphEntry,
        weights: str,
        config: RuntimeConfig,
        core: ov.Core | None = None,
        *,
        drafts: bool = False,
    ) -> None:
        """``drafts``: a draft model's graph. Its rounding never reaches the output (the target judges every
        token), so it masks its rewinds (free) and makes no claim about exactness."""
        self.graph = graph
        if drafts:
            config = replace(config, rewind="mask")
        bound_primitive_cache()  # before this process's first compilation
        self.core = core or ov.Core()
        self.device = choose_device(config.device, self.core.available_devices)
        if config.cache_dir is not None:
            config.cache_dir.mkdir(parents=True, exist_ok=True)
        default = default_inference_precision(self.core, self.device)
        xml = export_dir / graph.xml
        pages_kv = config.kv == "paged" and self.device == "CPU" and not drafts
        timed = config.tune_precision and not drafts and not pages_kv  # the timing runs on the SDPA compilation
        candidates = decode_candidates(self.device, weights, config, default) if timed else (config.precision,)
        compiled: dict[str, ov.CompiledModel] = {}
        timers: dict[str, Callable[[], float]] = {}

        def measure(precision: str) -> float:
            if precision not in timers:
                compiled[precision] = self._compile(xml, weights, replace(config, precision=precision), default)
                timers[precision] = decode_timer(compiled[precision], graph)
            return timers[precision]()

        key = self._choice_key(graph, weights, config)
        self.precision_choice: PrecisionChoice = choose_precision(key, candidates, measure, config.cache_dir)
        """The precision this stage decodes in, and each candidate's timing where it was chosen by timing."""
        self.decode_precision = self.precision_choice.precision
        """What this stage decodes in (``RuntimeConfig.precision``: ``auto``, ``f32``, ``bf16``, ``f16``)."""
        config = replace(config, precision=self.decode_precision)
        self.paged_kv = self._compile_paged_kv(xml, weights, config, default) if pages_kv else None
        """Where this stage's sessions keep their KV with ``kv = "paged"`` (None: each in its own state)."""
        self.kv = "state" if self.paged_kv is None else "paged"
        """Where its sessions keep their KV (``RuntimeConfig.kv``): ``paged`` only where asked for and compiled."""
        self.compiled = (
            self.paged_kv.compiled.compiled
            if self.paged_kv is not None
            else compiled.pop(config.precision, None) or self._compile(xml, weights, config, default)
        )
        compiled.clear()  # the candidates not kept, and their timing sessions
        timers.clear()
        self.compact_rewind = compacts_on_rewind(self.device, weights, config)
        if self.precision_choice.ms_per_token:
            log.info("%s: decodes in %s", graph.name, self.precision_choice.describe())
        self._paged_prefill: PagedPrefill | None = None
        self._paged_props: dict[str, str] | None = None
        if pages_prefill(self.device, config) and self.paged_kv is None:
            fast = splits_prefill(self.device, weights, config, default)
            self._paged_props = compile_properties(
                self.device, weights, config, prefill=fast, default_precision=default
            )
        elif config.fast_prefill:
            log.info(
                "%s: no prefill compilation on %s (prefill attention %s)",
                graph.name,
                self.device,
                config.prefill_attention,
            )
        self._xml = xml
        self._paged_lock = threading.Lock()
        self.exact_speculation = None if drafts else speculation_is_exact(self.device, weights, config)
        self._alike = "none" if drafts else computes_alike(self.device, weights, config)
        self.packs_alike = True
        """Whether a session's numbers here are those it gets alone, whatever is packed beside it (``kv = "state"``
        never packs; ``agent.runtime.paged_kv.packs_alike``)."""
        if self.paged_kv is not None:
            f32 = _computes_in_f32(weights, config)
            self.compact_rewind = False  # a rewind truncates a block table: nothing is masked, nothing copied
            self.exact_speculation = paged_speculation_is_exact(config.threads, f32)
            self._alike = paged_computes_alike(config.threads, f32)
            self.packs_alike = paged_packs_alike(config.threads, f32)
        self.wire_dtype = "f16" if _compiled_precision(self.compiled) == "f16" else "f32"
        """What this stage's hidden states cross the wire in when not told (``auto``): f16 where the device
        computes in f16 (the values are f16 already; half the bytes), else f32 (f32 or bf16 values)."""
        self._log_compiled(config)

    def _log_compiled(self, config: RuntimeConfig) -> None:
        graph = self.graph
        log.info(
            "compiled %s (layers %d-%d) on %s, rewind by %s",
            graph.name,
            graph.layer_start,
            graph.layer_stop - 1,
            self.device,
            "compaction" if self.compact_rewind else "mask",
        )
        if self.exact_speculation is False:
            log.warning(
                "%s: speculative greedy decoding may differ from plain decoding here (precision %s, "
                "%s threads, KV %s): for token-identical output use %s",
                graph.name,
                config.precision,
                config.threads or "all",
                self.kv,
                "--precision f32" if self.kv == "paged" else "--threads 1 or --precision f32",
            )

    def _compile(self, xml: Path, weights: str, config: RuntimeConfig, default: str) -> ov.CompiledModel:
        props = compile_properties(self.device, weights, config, default_precision=default)
        computes_in = props.get("INFERENCE_PRECISION_HINT", default)
        try:
            if not narrows_hidden_states(self.core, self.device, self.graph.head, computes_in):
                return self.core.compile_model(str(xml), self.device, props)
            # a read model keeps OpenVINO's model cache (CACHE_DIR) too: ~0.1 s more to read and convert it
            model = narrow_output(self.core.read_model(xml), self.graph.outputs[0], computes_in)
            return self.core.compile_model(model, self.device, props)
        except RuntimeError as exc:
            raise RuntimeStageError(f"{self.graph.name}: cannot compile {xml} on {self.device}: {exc}") from exc

    def _compile_paged_kv(self, xml: Path, weights: str, config: RuntimeConfig, default: str) -> PagedKV | None:
        """The PagedAttention compilation and block pool its sessions share (``kv = "paged"``); None, logged, where
        the graph does not take it (its sessions then keep their KV in state)."""
        props = compile_properties(self.device, weights, config, default_precision=default)
        started = time.perf_counter()
        try:
            compiled = compile_paged_prefill(
                self.core, str(xml), self.graph.inputs[0], self.graph.outputs[0], self.device, props
            )
        except RuntimeStageError as exc:
            log.warning("%s: sessions keep their KV in state, not paged: %s", self.graph.name, exc)
            return None
        blocks = pool_blocks(config.kv_positions or DEFAULT_KV_POSITIONS, compiled.block_size)
        log.info(
            "%s: paged KV compiled in %.1f s, a pool of %d blocks of %d positions",
            self.graph.name,
            time.perf_counter() - started,
            blocks,
            compiled.block_size,
        )
        pads = paged_pads(config.threads, _computes_in_f32(weights, config))
        return PagedKV(compiled, blocks, self.graph.name, pads=pads)

    def _choice_key(self, graph: GraphEntry, weights: str, config: RuntimeConfig) -> str:
        """What a timed precision choice holds for: the graph's files, this device and its settings, OpenVINO."""
        try:
            cpu = str(self.core.get_property(self.device, "FULL_DEVICE_NAME"))
        except RuntimeError:
            cpu = "?"
        files = hashlib.sha256("".join(sorted(f.sha256 for f in graph.files)).encode()).hexdigest()[:16]
        return (
            f"{graph.name}:{files}:{weights}:{self.device}:{cpu}:{config.threads}:{config.rewind}:{ov.get_version()}"
            f":{COMPILE_RECIPE}"
        )

    def paged_prefill(self) -> PagedPrefill | None:
        """The paged compilation long steps run on, compiled on the first call (a stage that never sees a long
        prompt never pays for it: about 1 s per SmolLM2 stage here); None where there is none, or it failed
        (logged once; long steps then stay on the decode compilation)."""
        with self._paged_lock:
            if self._paged_props is not None and self._paged_prefill is None:
                props, self._paged_props = self._paged_props, None
                started = time.perf_counter()
                try:
                    self._paged_prefill = compile_paged_prefill(
                        self.core, str(self._xml), self.graph.inputs[0], self.graph.outputs[0], self.device, props
                    )
                    log.info("%s: paged prefill compiled in %.1f s", self.graph.name, time.perf_counter() - started)
                except RuntimeStageError as exc:
                    log.warning("%s: long steps stay on the decode compilation: %s", self.graph.name, exc)
            return self._paged_prefill

    @property
    def kv_pool(self) -> PagedKV | None:
        """Its sessions' shared KV block pool (``agent.runtime.packed.PackingStage``); None: each keeps its own."""
        return self.paged_kv

    @property
    def alike(self) -> str:
        """What this stage computes the same however positions are grouped into steps (``computes_alike``)."""
        if (
            self._alike == "prompts"
            and self.paged_kv is None
            and self._paged_props is None
            and self._paged_prefill is None
        ):
            return "none"  # its paged compilation failed: prompts run on the SDPA one, which rounds them by step
        return self._alike

    def _new_paged_step(self) -> PagedStep | None:
        prefill = self.paged_prefill()
        return prefill.new_step() if prefill is not None else None

    def new_session(self) -> StageSession | PagedKVSession:
        """A fresh KV state for one conversation (a block table in the stage's pool with ``kv = "paged"``)."""
        if self.paged_kv is not None:
            return self.paged_kv.new_session()
        output = self.graph.outputs[0]
        return StageSession(
            self.compiled.create_infer_request(),
            self.graph.inputs[0],
            self.compiled.output(output),
            holds_head=self.graph.head,
            selects_positions=LOGITS_INDEX in self.graph.inputs,
            paged=self._new_paged_step,
            paged_prompts=self._alike == "prompts",
            compact_rewind=self.compact_rewind,
        )


class LocalPipeline:
    """Every stage of an export compiled in this process."""

    def __init__(self, export_dir: Path, manifest: Manifest, config: RuntimeConfig) -> None:
        self.manifest = manifest
        self.stages = [CompiledStage(export_dir, g, manifest.weights, config) for g in manifest.stages]

    def new_session(self) -> PipelineSession:
        return PipelineSession(new_sessions(self.stages))
