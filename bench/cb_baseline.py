"""``cb``: openvino_genai's ``ContinuousBatchingPipeline`` serving N users in one process, on the ring's cores.

What an office would run instead of a ring on one PC (issue 45): genai's own continuous batching (paged KV, one
``infer`` over the rows of every scheduled sequence) on the optimum-intel export ``mono`` runs, with one inference
thread per core it is given (``python -m bench ring --users``: the head's and the agents' cores, so both cores here).

A resident child process (``python -m bench.cb_baseline``) pins itself to those cores *before* it imports OpenVINO
(the CPU plugin sizes its thread pool from the affinity), loads the pipeline once and answers one JSON line per
line it reads: a :class:`CbSpec` first (answered ``{"ready": true, "load_s": ...}``), then ``{"users": N}`` per run,
``quit`` at the end. A run adds N requests for the same prompt ids (greedy, exactly ``tokens`` tokens, EOS ignored)
and drives the pipeline with ``step()``; after each step it reads every request's handle, so a token's time stamp
is the end of the step that computed it (the tokens of one step share a stamp, as the rows of a packed ring step
do). Each timed run follows an untimed warm-up of N users from the prompt's first ``warmup_prompt_tokens`` tokens.

The scheduler (:data:`SCHEDULER`): genai's default token budget per step (256, as shoal's packer), prefill split
into chunks within it (``dynamic_split_fuse``), prefix caching off (every user sends the same prompt: a cached
prefix would make every prefill after the first free, and ``mono`` runs with it off too), and a 1 GB KV cache
(:data:`CACHE_SIZE_GB`), far more than the users fill, so that no request waits for blocks or is preempted: 8 users
of Qwen2.5-Coder-1.5B at 286 tokens each peaked at 2.4 % of it. Each run records genai's peak cache usage.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from bench import BenchError
from bench.stats import StampFigures
from bench.worker import QUIT, ChildProcess

CACHE_SIZE_GB = 1
MAX_NUM_BATCHED_TOKENS = 256
SCHEDULER = {
    "cache_size": CACHE_SIZE_GB,
    "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
    "dynamic_split_fuse": True,
    "enable_prefix_caching": False,
}
"""The ``SchedulerConfig`` fields the baseline sets (the rest keep genai's defaults)."""


@dataclass(frozen=True)
class CbSpec:
    """What one baseline process serves."""

    model_dir: str
    """The optimum-intel export (``openvino_model.xml``, tokenizer and detokenizer IRs)."""
    prompt_ids: list[int]
    tokens: int
    warmup_tokens: int
    cores: list[int]
    """The cores the process is pinned to; one inference thread each."""
    warmup_prompt_tokens: int = 16
    ov_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.tokens < 2 or not self.prompt_ids or not self.cores:
            raise ValueError("a cb run needs a prompt, at least 2 tokens and at least one core")


@dataclass(frozen=True)
class CbRun:
    """One timed run of N users: their tokens, the stamps (seconds from the run's start) and genai's figures."""

    tokens: list[list[int]]
    stamps: list[list[float]]
    steps: int
    cpu_share: float
    """CPU time / (wall time x cores) of the run: below ~0.95 something else took the cores."""
    max_cache_usage: float
    """genai's peak KV cache usage in the run, in % of the cache."""
    kv_cache_bytes: int

    @property
    def figures(self) -> StampFigures:
        return StampFigures.of(self.stamps, 0.0)


# -- the child process -------------------------------------------------------------------------------
class CbServer:
    """The pipeline of one :class:`CbSpec`, in the child (OpenVINO is imported once the process is pinned)."""

    def __init__(self, spec: CbSpec) -> None:
        import openvino_genai as ov_genai

        self._genai = ov_genai
        self.spec = spec
        scheduler = ov_genai.SchedulerConfig()
        for name, value in SCHEDULER.items():
            setattr(scheduler, name, value)
        properties: dict[str, Any] = {"INFERENCE_NUM_THREADS": len(spec.cores)}
        if spec.ov_cache_dir:
            properties["CACHE_DIR"] = spec.ov_cache_dir
        start = time.perf_counter()
        self.pipe = ov_genai.ContinuousBatchingPipeline(spec.model_dir, scheduler, "CPU", properties)
        self.load_s = time.perf_counter() - start
        self._next_id = 0

    def run(self, users: int, tokens: int, prompt_ids: list[int]) -> CbRun:
        """``users`` requests of ``prompt_ids``, ``tokens`` greedy tokens each, stepped to the end."""
        import numpy as np
        import openvino as ov

        config = self._genai.GenerationConfig()
        config.max_new_tokens = config.min_new_tokens = tokens
        config.ignore_eos = True
        config.do_sample = False
        input_ids = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
        outputs: list[list[int]] = [[] for _ in range(users)]
        stamps: list[list[float]] = [[] for _ in range(users)]
        steps, peak = 0, 0.0
        cpu, started = time.process_time(), time.perf_counter()
        handles = []
        for _ in range(users):
            handles.append(self.pipe.add_request(self._next_id, input_ids, config))
            self._next_id += 1
        while self.pipe.has_non_finished_requests():
            self.pipe.step()
            steps += 1
            now = time.perf_counter() - started
            for user, handle in enumerate(handles):
                # a finished request's last tokens are still readable; read() hands each token out once
                while handle.can_read():
                    for output in handle.read().values():
                        outputs[user] += [int(t) for t in output.generated_ids]
                        stamps[user] += [now] * (len(outputs[user]) - len(stamps[user]))
            peak = max(peak, float(self.pipe.get_metrics().cache_usage))
        wall = time.perf_counter() - started
        short = [len(o) for o in outputs if len(o) != tokens]
        if short:
            raise RuntimeError(f"ContinuousBatchingPipeline produced {short} tokens instead of {tokens}")
        metrics = self.pipe.get_metrics()
        return CbRun(
            tokens=outputs,
            stamps=stamps,
            steps=steps,
            cpu_share=(time.process_time() - cpu) / (wall * len(self.spec.cores)) if wall > 0 else 0.0,
            max_cache_usage=max(peak, float(metrics.max_cache_usage)),
            kv_cache_bytes=int(metrics.kv_cache_size_in_bytes),
        )


def main() -> int:
    """Serve the parent: a spec line, then one warm-up and one timed run per ``{"users": N}`` line."""
    # replies get the real stdout; anything else printed (by Python or by C++ libraries) goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    spec = CbSpec(**json.loads(sys.stdin.readline()))
    os.sched_setaffinity(0, set(spec.cores))
    server = CbServer(spec)
    _reply(replies, {"ready": True, "load_s": server.load_s})
    for line in sys.stdin:
        if line.strip() == QUIT:
            break
        users = int(json.loads(line)["users"])
        server.run(users, spec.warmup_tokens, spec.prompt_ids[: spec.warmup_prompt_tokens])
        _reply(replies, asdict(server.run(users, spec.tokens, spec.prompt_ids)))
    return 0


def _reply(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


# -- the parent's end --------------------------------------------------------------------------------
class CbWorker(ChildProcess):
    """The parent's end of one baseline process, up for every run of a benchmark."""

    def __init__(self, spec: CbSpec) -> None:
        super().__init__("cb", "bench.cb_baseline", json.dumps(asdict(spec)), {"TOKENIZERS_PARALLELISM": "false"})
        self.load_s = float(self.ready["load_s"])

    def run(self, users: int) -> CbRun:
        """One warm-up and one timed run of ``users`` users."""
        self._send(json.dumps({"users": users}))
        try:
            return CbRun(**self._receive())
        except TypeError as exc:
            raise BenchError(f"the cb baseline sent a malformed result ({exc})") from exc


if __name__ == "__main__":
    sys.exit(main())
