"""One benchmark run in a process of its own, pinned to one core: ``python -m agent.bench.worker``.

The parent writes a :class:`RunSpec` as JSON on stdin; the worker pins itself to the given core
*before* importing OpenVINO (so the CPU plugin's thread pool sees one CPU), compiles the model,
runs one untimed warm-up generation (the CPU plugin compiles kernels lazily on the first call of
each shape) and one timed generation of exactly ``tokens`` greedy tokens, stop tokens ignored.
It prints one :class:`RunResult` as a JSON line on stdout; everything else goes to stderr.

Timing: ``ttft_s`` runs from the start of generation to the first token (prefill + first pick);
``decode_s`` from the first token to the last, so ``tok_s = (tokens - 1) / decode_s`` excludes
the prefill. For shoal runs the decode time is split further into the time spent inside
``InferRequest.infer`` (summed over stages) and the rest, which is our own Python.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.bench.peak import peak_rss_bytes

KINDS = ("mono", "shoal")


@dataclass(frozen=True)
class RunSpec:
    """What one worker process runs."""

    kind: str
    """``mono`` (openvino_genai.LLMPipeline on an optimum-intel export) or ``shoal`` (LocalPipeline)."""
    model_dir: str
    prompt_ids: list[int]
    tokens: int
    warmup_tokens: int
    core: int | None
    """CPU to pin the process to; None leaves the affinity alone."""
    ov_cache_dir: str | None = None
    """OpenVINO compiled-model cache (shortens loading only; inference is unaffected)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.tokens < 2 or not self.prompt_ids:
            raise ValueError("a run needs a prompt and at least 2 tokens (one prefill, one decode step)")


@dataclass(frozen=True)
class RunResult:
    """The figures of one timed generation."""

    tokens: list[int]
    ttft_s: float
    decode_s: float
    load_s: float
    peak_rss_bytes: int
    threads: int
    """Threads the process had when it finished (OpenVINO's pool included)."""
    cpu_share: float
    """CPU time / wall time of the timed generation: below ~0.95 another process took the core."""
    infer_s: float | None = None
    """Decode phase: wall time of every ``InferRequest.infer`` call, summed over stages (shoal only)."""
    ov_latency_s: float | None = None
    """Decode phase: OpenVINO's own ``InferRequest.latency`` summed (excludes Python input binding)."""

    @property
    def tok_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        return cls(**data)


class TimedRequest:
    """Stands in for an ``ov.InferRequest`` and adds up the time its ``infer`` calls take."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self.infer_s = 0.0
        self.latency_s = 0.0

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._request.infer(*args, **kwargs)
        self.infer_s += time.perf_counter() - start
        self.latency_s += self._request.latency / 1e3
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def run_shoal(spec: RunSpec) -> RunResult:
    """Time LocalPipeline (every stage in this process, one thread) through the head's generate loop."""
    from agent.head.generate import generate
    from agent.head.sampling import SamplingParams
    from agent.runtime import LocalPipeline, RuntimeConfig
    from shards.manifest import Manifest

    export_dir = Path(spec.model_dir)
    start = time.perf_counter()
    manifest = Manifest.load(export_dir)
    cache = Path(spec.ov_cache_dir) if spec.ov_cache_dir else None
    pipeline = LocalPipeline(export_dir, manifest, RuntimeConfig(device="CPU", threads=1, cache_dir=cache))
    load_s = time.perf_counter() - start

    def once(count: int) -> tuple[list[int], list[float], float, list[TimedRequest], tuple[float, float]]:
        session = pipeline.new_session()
        timers = []
        for stage in session.stages:
            # the benchmark's only reach into a session's internals: time its InferRequest
            timer = TimedRequest(stage._request)
            stage._request = timer  # type: ignore[assignment]
            timers.append(timer)
        tokens: list[int] = []
        stamps: list[float] = []
        at_first = (0.0, 0.0)
        began = time.perf_counter()
        for token in generate(session, spec.prompt_ids, count, frozenset(), SamplingParams(),
                              manifest.context_tokens):
            stamps.append(time.perf_counter())
            tokens.append(token)
            if len(tokens) == 1:
                at_first = (sum(t.infer_s for t in timers), sum(t.latency_s for t in timers))
        return tokens, stamps, began, timers, at_first

    once(spec.warmup_tokens)
    with _CpuShare() as share:
        tokens, stamps, began, timers, at_first = once(spec.tokens)
    return RunResult(
        tokens=tokens,
        ttft_s=stamps[0] - began,
        decode_s=stamps[-1] - stamps[0],
        load_s=load_s,
        peak_rss_bytes=peak_rss_bytes(),
        threads=_threads(),
        cpu_share=share.value,
        infer_s=sum(t.infer_s for t in timers) - at_first[0],
        ov_latency_s=sum(t.latency_s for t in timers) - at_first[1],
    )


def run_mono(spec: RunSpec) -> RunResult:
    """Time ``openvino_genai.LLMPipeline`` (one thread, prefix caching off) on the same prompt ids."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    scheduler = ov_genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    properties: dict[str, Any] = {"scheduler_config": scheduler, "INFERENCE_NUM_THREADS": 1}
    if spec.ov_cache_dir:
        properties["CACHE_DIR"] = spec.ov_cache_dir
    start = time.perf_counter()
    pipe = ov_genai.LLMPipeline(spec.model_dir, "CPU", **properties)
    load_s = time.perf_counter() - start
    input_ids = ov.Tensor(np.asarray([spec.prompt_ids], dtype=np.int64))

    def once(count: int) -> tuple[list[int], Any]:
        config = ov_genai.GenerationConfig()
        config.max_new_tokens = count
        config.min_new_tokens = count
        config.ignore_eos = True
        config.do_sample = False
        config.eos_token_id = pipe.get_generation_config().eos_token_id
        result = pipe.generate(input_ids, config)
        tokens = [int(t) for t in result.tokens[0]]
        if len(tokens) != count:
            raise RuntimeError(f"LLMPipeline produced {len(tokens)} tokens instead of {count}")
        return tokens, result.perf_metrics.raw_metrics

    once(spec.warmup_tokens)
    with _CpuShare() as share:
        tokens, raw = once(spec.tokens)
    # genai's own clock: time to the first token, then the gaps between consecutive tokens (µs)
    return RunResult(
        tokens=tokens,
        ttft_s=float(raw.m_times_to_first_token[0]) / 1e6,
        decode_s=float(sum(raw.m_durations)) / 1e6,
        load_s=load_s,
        peak_rss_bytes=peak_rss_bytes(),
        threads=_threads(),
        cpu_share=share.value,
    )


class _CpuShare:
    """Measures how much of the wall time this process spent on a CPU (pinned: on its one core)."""

    def __init__(self) -> None:
        self.value = 0.0

    def __enter__(self) -> _CpuShare:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall
        self.value = (time.process_time() - self._cpu) / wall if wall > 0 else 0.0


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


def main() -> int:
    spec = RunSpec(**json.loads(sys.stdin.read()))
    if spec.core is not None:
        os.sched_setaffinity(0, {spec.core})
    result = run_mono(spec) if spec.kind == "mono" else run_shoal(spec)
    sys.stdout.write(json.dumps(result.to_json()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
