"""Benchmark runs in a process of their own, pinned to one core: ``python -m bench.worker``.

Protocol (one JSON object per line): the parent writes a :class:`RunSpec`; the worker pins itself
to the given core *before* importing OpenVINO (so the CPU plugin's thread pool sees one CPU),
compiles the model and answers ``{"ready": true, ...}``. Then each ``run`` line gets an untimed
warm-up generation of ``warmup_tokens`` followed at once by one timed generation of exactly
``tokens`` greedy tokens (stop tokens ignored), answered as a :class:`RunResult`; ``quit`` or end
of input ends the process. A ``{"prefill": [ids]}`` line instead gets one timed generation of a single
token from those prompt ids, with no warm-up (``python -m bench prefill``: time to the first token).
Everything else the worker prints goes to stderr.

Timing: ``ttft_s`` runs from the start of generation to the first token (prefill + first pick);
``decode_s`` from the first token to the last, so ``tok_s = (tokens - 1) / decode_s`` excludes
the prefill. For shoal runs the decode time is split further into the time spent inside
``InferRequest.infer`` (summed over stages) and the rest, which is our own Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from bench import BenchError
from bench.peak import peak_rss_bytes

if TYPE_CHECKING:  # OpenVINO is imported after the worker pinned itself to its core
    from agent.runtime.session import StageSession

KINDS = ("mono", "shoal", "torch")
RUN, QUIT, PREFILL = "run", "quit", "prefill"


@dataclass(frozen=True)
class RunSpec:
    """What one worker process runs."""

    kind: str
    """``mono`` (openvino_genai.LLMPipeline on an optimum-intel export), ``shoal`` (LocalPipeline) or ``torch``
    (transformers in float32 on a Hugging Face folder)."""
    model_dir: str
    prompt_ids: list[int]
    tokens: int
    warmup_tokens: int
    core: int | None
    """CPU to pin the process to; None leaves the affinity alone."""
    ov_cache_dir: str | None = None
    """OpenVINO compiled-model cache (shortens loading only; inference is unaffected)."""
    prefill_attention: str = "paged"
    """``shoal``: what its prompts attend through (``RuntimeConfig.prefill_attention``)."""
    fast_prefill: bool = True
    """``shoal``: prompts in the CPU's default precision (``RuntimeConfig.fast_prefill``)."""
    inference_precision: str | None = None
    """``mono``: its ``INFERENCE_PRECISION_HINT`` (None: the device's default)."""

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
    others_busy: float = 0.0
    """How busy the *other* cores were meanwhile (0-1, from /proc/stat): they share caches and memory
    bandwidth with ours, so a busy neighbour slows a run without taking its core."""
    infer_s: float | None = None
    """Decode phase: wall time of every ``InferRequest.infer`` call, summed over stages (shoal only)."""
    ov_latency_s: float | None = None
    """Decode phase: OpenVINO's own ``InferRequest.latency`` summed (excludes Python input binding)."""
    precision: str | None = None
    """shoal: what each stage decoded in, ``/``-joined (chosen by timing on this PC, ``agent.runtime.tuning``)."""

    @property
    def tok_s(self) -> float:
        return (len(self.tokens) - 1) / self.decode_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunResult:
        return cls(**data)


class TimedRequest:
    """Stands in for an ``ov.InferRequest`` (``StageSession.wrap_requests``) and adds up the time its calls that
    feed and run an inference take (``set_input_tensor``, ``infer``): their wall time, and OpenVINO's own
    ``latency`` of each ``infer``."""

    def __init__(self, request: Any) -> None:
        self._request = request
        self.infer_s = 0.0
        self.latency_s = 0.0

    def set_input_tensor(self, *args: Any) -> None:
        # the inputs' binding, which the infer call's feed dict did before StageSession set them itself
        start = time.perf_counter()
        self._request.set_input_tensor(*args)
        self.infer_s += time.perf_counter() - start

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = self._request.infer(*args, **kwargs)
        self.infer_s += time.perf_counter() - start
        self.latency_s += self._request.latency / 1e3
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


class RequestTimers:
    """The :class:`TimedRequest` of every InferRequest of the stage sessions given to :meth:`time`, added up."""

    def __init__(self) -> None:
        self.requests: list[TimedRequest] = []

    def time(self, session: StageSession) -> None:
        """Time ``session``'s inferences from now on."""
        session.wrap_requests(self._wrap)

    def _wrap(self, request: Any) -> TimedRequest:
        timer = TimedRequest(request)
        self.requests.append(timer)
        return timer

    @property
    def infer_s(self) -> float:
        """Wall time of every ``infer`` call so far."""
        return sum(r.infer_s for r in self.requests)

    @property
    def latency_s(self) -> float:
        """OpenVINO's own latency of every ``infer`` call so far."""
        return sum(r.latency_s for r in self.requests)


@dataclass(frozen=True)
class Generation:
    """One generation's raw figures, before the process-level ones are added."""

    tokens: list[int]
    ttft_s: float
    decode_s: float
    infer_s: float | None = None
    ov_latency_s: float | None = None
    precision: str | None = None
    """shoal: what each stage decodes in, ``/``-joined (``CompiledStage.decode_precision``)."""


class Runner(Protocol):
    load_s: float

    def generate(self, count: int, prompt_ids: list[int] | None = None) -> Generation:
        """``count`` greedy tokens from ``prompt_ids`` (default: the spec's prompt)."""
        ...


class ShoalRunner:
    """LocalPipeline (every stage in this process, one thread) driven by the head's generate loop."""

    def __init__(self, spec: RunSpec) -> None:
        from agent.runtime.config import RuntimeConfig
        from agent.runtime.stage import LocalPipeline
        from shards.manifest import Manifest

        self.spec = spec
        export_dir = Path(spec.model_dir)
        start = time.perf_counter()
        self.manifest = Manifest.load(export_dir)
        cache = Path(spec.ov_cache_dir) if spec.ov_cache_dir else None
        self.pipeline = LocalPipeline(
            export_dir,
            self.manifest,
            RuntimeConfig(
                device="CPU",
                threads=1,
                cache_dir=cache,
                prefill_attention=spec.prefill_attention,
                fast_prefill=spec.fast_prefill,
                tune_precision=True,  # decode parity (issue 47) is measured with the precision timed on this PC
            ),
        )
        self.load_s = time.perf_counter() - start

    def generate(self, count: int, prompt_ids: list[int] | None = None) -> Generation:
        from agent.runtime.session import StageSession
        from agent.sampling.params import SamplingParams
        from bench.plain_decode import generate

        session = self.pipeline.new_session()
        timers = RequestTimers()
        for stage in session.stages:
            assert isinstance(stage, StageSession)
            timers.time(stage)
        tokens: list[int] = []
        stamps: list[float] = []
        at_first = (0.0, 0.0)
        began = time.perf_counter()
        ids = prompt_ids or self.spec.prompt_ids
        for token in generate(session, ids, count, frozenset(), SamplingParams(), self.manifest.context_tokens):
            stamps.append(time.perf_counter())
            tokens.append(token)
            if len(tokens) == 1:
                at_first = (timers.infer_s, timers.latency_s)
        return Generation(
            tokens=tokens,
            ttft_s=stamps[0] - began,
            decode_s=stamps[-1] - stamps[0],
            infer_s=timers.infer_s - at_first[0],
            ov_latency_s=timers.latency_s - at_first[1],
            precision="/".join(stage.decode_precision for stage in self.pipeline.stages),
        )


class MonoRunner:
    """``openvino_genai.LLMPipeline`` (one thread, prefix caching off) on the same prompt ids."""

    def __init__(self, spec: RunSpec) -> None:
        import openvino_genai as ov_genai

        self._genai = ov_genai
        self.spec = spec
        scheduler = ov_genai.SchedulerConfig()
        scheduler.enable_prefix_caching = False
        properties: dict[str, Any] = {"scheduler_config": scheduler, "INFERENCE_NUM_THREADS": 1}
        if spec.inference_precision:
            properties["INFERENCE_PRECISION_HINT"] = spec.inference_precision
        if spec.ov_cache_dir:
            properties["CACHE_DIR"] = spec.ov_cache_dir
        start = time.perf_counter()
        self.pipe = ov_genai.LLMPipeline(spec.model_dir, "CPU", **properties)
        self.load_s = time.perf_counter() - start

    def generate(self, count: int, prompt_ids: list[int] | None = None) -> Generation:
        import numpy as np
        import openvino as ov

        input_ids = ov.Tensor(np.asarray([prompt_ids or self.spec.prompt_ids], dtype=np.int64))
        config = self._genai.GenerationConfig()
        config.max_new_tokens = count
        config.min_new_tokens = count
        config.ignore_eos = True
        config.do_sample = False
        config.eos_token_id = self.pipe.get_generation_config().eos_token_id
        result = self.pipe.generate(input_ids, config)
        tokens = [int(t) for t in result.tokens[0]]
        if len(tokens) != count:
            raise RuntimeError(f"LLMPipeline produced {len(tokens)} tokens instead of {count}")
        raw = result.perf_metrics.raw_metrics
        # genai's own clock: time to the first token, then the gaps between consecutive tokens (µs)
        return Generation(
            tokens=tokens, ttft_s=float(raw.m_times_to_first_token[0]) / 1e6, decode_s=float(sum(raw.m_durations)) / 1e6
        )


class TorchRunner:
    """transformers' ``AutoModelForCausalLM`` in float32 (one thread) on a Hugging Face folder: what a user could
    fall back to. Greedy, with the KV cache; only the last position's logits are computed, as ``generate`` does."""

    def __init__(self, spec: RunSpec) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.spec = spec
        start = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=torch.float32).eval()
        self.load_s = time.perf_counter() - start

    def generate(self, count: int, prompt_ids: list[int] | None = None) -> Generation:
        import torch

        tokens: list[int] = []
        stamps: list[float] = []
        began = time.perf_counter()
        with torch.inference_mode():
            inputs, past = torch.tensor([prompt_ids or self.spec.prompt_ids]), None
            while len(tokens) < count:
                out = self.model(input_ids=inputs, past_key_values=past, use_cache=count > 1, logits_to_keep=1)
                tokens.append(int(out.logits[0, -1].argmax()))
                stamps.append(time.perf_counter())
                inputs, past = torch.tensor([tokens[-1:]]), out.past_key_values
        return Generation(tokens=tokens, ttft_s=stamps[0] - began, decode_s=stamps[-1] - stamps[0])


RUNNERS: dict[str, type[MonoRunner | ShoalRunner | TorchRunner]] = {
    "mono": MonoRunner,
    "shoal": ShoalRunner,
    "torch": TorchRunner,
}


def timed_run(runner: Runner, tokens: int, prompt_ids: list[int] | None = None) -> RunResult:
    """One measured generation of exactly ``tokens`` tokens (from ``prompt_ids``, default: the spec's prompt)."""
    with _CpuShare() as share:
        gen = runner.generate(tokens, prompt_ids)
    return RunResult(
        tokens=gen.tokens,
        ttft_s=gen.ttft_s,
        decode_s=gen.decode_s,
        load_s=runner.load_s,
        peak_rss_bytes=peak_rss_bytes(),
        threads=_threads(),
        cpu_share=share.value,
        others_busy=share.others_busy,
        infer_s=gen.infer_s,
        ov_latency_s=gen.ov_latency_s,
        precision=gen.precision,
    )


class _CpuShare:
    """Measures how much of the wall time this process spent on a CPU (pinned: on its one core), and
    how busy the other cores of the machine were meanwhile."""

    def __init__(self) -> None:
        self.value = 0.0
        self.others_busy = 0.0

    def __enter__(self) -> _CpuShare:
        self._stat = cpu_times()
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall
        self.value = (time.process_time() - self._cpu) / wall if wall > 0 else 0.0
        mine = os.sched_getaffinity(0)
        after = cpu_times()
        busy = total = 0
        for cpu, (busy_after, total_after) in after.items():
            if cpu not in mine and cpu in self._stat:
                busy += busy_after - self._stat[cpu][0]
                total += total_after - self._stat[cpu][1]
        self.others_busy = busy / total if total else 0.0


def cpu_times() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy, total) jiffies from /proc/stat (empty where there is no /proc)."""
    times: dict[int, tuple[int, int]] = {}
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return times
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            times[int(name[3:])] = (sum(values[:8]) - idle, sum(values[:8]))
    return times


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0


class ChildProcess:
    """The parent's end of a benchmark process (``python -m MODULE``) that answers each line it reads with one JSON
    object: sent ``first`` (its spec) at start, its first answer is :attr:`ready`."""

    def __init__(self, name: str, module: str, first: str, env: dict[str, str]) -> None:
        self.name = name
        # the worker's stderr (OpenVINO warnings, tracebacks) is kept here and shown if it fails
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by close()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            encoding="utf-8",
            errors="replace",
            env=dict(os.environ, **env),
        )
        if self._proc.stdin is None or self._proc.stdout is None:  # never: both are pipes
            raise BenchError("cannot talk to a worker process")
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        try:
            self._send(first)
            self.ready = self._receive()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Ask the worker to quit (kill it if it does not) and forget its log."""
        if self._proc.poll() is None:
            try:
                self._send(QUIT)
                self._proc.wait(timeout=60)
            except (OSError, BenchError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stdin.close()
        self._stdout.close()
        self._log.close()

    def _send(self, line: str) -> None:
        try:
            self._stdin.write(line + "\n")
            self._stdin.flush()
        except OSError as exc:
            raise self._died() from exc

    def _receive(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            raise self._died()
        try:
            message = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"{self.name} worker sent {line[:200]!r} instead of JSON") from exc
        if not isinstance(message, dict):
            raise BenchError(f"{self.name} worker sent {line[:200]!r} instead of a JSON object")
        return message

    def _died(self) -> BenchError:
        code = self._proc.wait()
        self._log.seek(0)
        tail = "\n".join(self._log.read().strip().splitlines()[-15:])
        return BenchError(f"{self.name} worker ended (exit {code}):\n{tail}")


class WorkerProcess(ChildProcess):
    """The parent's end: a worker process serving one configuration's timed runs."""

    def __init__(self, name: str, spec: RunSpec) -> None:
        super().__init__(
            name, "bench.worker", json.dumps(asdict(spec)), {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        )
        self.load_s = float(self.ready["load_s"])

    def run(self) -> RunResult:
        """One timed generation."""
        return self._result(RUN)

    def prefill(self, prompt_ids: list[int]) -> RunResult:
        """One timed generation of a single token from ``prompt_ids`` (no warm-up): its ``ttft_s``."""
        return self._result(json.dumps({PREFILL: prompt_ids}))

    def _result(self, command: str) -> RunResult:
        self._send(command)
        try:
            return RunResult.from_json(self._receive())
        except TypeError as exc:
            raise BenchError(f"{self.name} worker sent a malformed result ({exc})") from exc


def main() -> int:
    """Serve the parent: a spec line, then one timed run per ``run`` or ``prefill`` line, until ``quit`` or EOF."""
    # replies get the real stdout; anything else printed (by Python or by C++ libraries) goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    spec = RunSpec(**json.loads(sys.stdin.readline()))
    if spec.core is not None:
        os.sched_setaffinity(0, {spec.core})
    runner: Runner = RUNNERS[spec.kind](spec)
    _reply(replies, {"ready": True, "load_s": runner.load_s})
    for line in sys.stdin:
        command = line.strip()
        if command == RUN:
            # Warm up right before every timed run, with no pause in between: on the first call of
            # a shape the CPU plugin compiles kernels, and here (a VM) the first few hundred ms of
            # work after the core idled for even half a second run at a fraction of full speed.
            runner.generate(spec.warmup_tokens)
            _reply(replies, timed_run(runner, spec.tokens).to_json())
        elif command.startswith("{"):
            _reply(replies, timed_run(runner, 1, [int(i) for i in json.loads(command)[PREFILL]]).to_json())
        elif command == QUIT:
            break
        else:
            raise ValueError(f"unknown command {command!r}")
    return 0


def _reply(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
