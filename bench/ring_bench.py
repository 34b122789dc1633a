"""``python -m bench ring``: the ring of agents against the monolithic openvino_genai baseline.

What one "PC" is (issue 3, DESIGN.md "Measuring"): one agent limited to one CPU thread. The head
(tokenizer, drafter, generation loop) lives on the PC that holds stage 0 and shares its thread, so
this process *is* the head: it pins itself to one core (``--head-core``), runs stage 0 in-process
with one OpenVINO thread on a one-worker executor (drafting runs there too), and talks to the other
stages, ``shoal agent`` processes pinned with ``taskset`` to the other core (``--agent-core``; with
3 stages, two agents share that core). The baseline ``mono`` is ``openvino_genai.LLMPipeline`` on
an optimum-intel export of the same int4 checkpoint, one thread, pinned to the head's core, in a
fresh process per run (the ``python -m bench shards`` worker).

Configurations: ``mono`` (1 user), ``pp`` (ring, 1 user, no speculation), ``pp+sd`` (best drafter,
adaptive K), ``pp+mb`` (2 users = 2 concurrent sessions from this head), ``pp+sd+mb``. Aggregate
decode tok/s excludes each user's first token (prefill): tokens stamped after the last user got its
first token, over the time from then to the last token.

Latency: a delay proxy (:mod:`tests.support.delay_proxy`, its own process) sits in front of every
agent's listening port, so a ring token crosses N delayed hops for N stages (head -> stage 1, ...,
last stage -> head, on the head's own connection to the last stage). The delay is changed in place
between latencies; agents and the head stay up for all configurations and latencies of a setup.
The proxy is in the path at 0 ms too.

Per-token time split (single-user configurations): stage 0 on the head (executor time, of which
``InferRequest.infer``), drafting, each agent's compute (``compute_seconds`` from its status),
the head's own Python (CPU time of the event-loop thread, plus executor time outside ``infer``),
and the rest of the wall time: the wire (loopback, proxies, delays) and the agents' event loops.

Runs interleave the configurations in a rotated order per round; each timed run follows an untimed
warm-up of the same configuration (``--warmup-tokens``). Results: median and range over runs;
ratios are taken within one invocation (``mono`` runs in the rounds of the first latency only).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.common import layer_counts
from agent.node.launcher import LocalAgent
from agent.runtime.config import REWINDS
from bench import BenchError, add_report_arguments, select_configs
from bench.agents import (
    PinnedCores,
    add_core_arguments,
    bench_dirs,
    cores_text,
    cpu_seconds,
    pick_cores,
    start_agent,
)
from bench.baseline import PreparedExport, optimum_export, run_measured, shoal_export
from bench.shards_bench import append_markdown, command_line, describe_machine, rotation, slug
from bench.stats import StampFigures, Summary, agreement, paired_ratios
from bench.stats import percentile as percentile  # where tests and older callers import it from
from bench.worker import RequestTimers

if TYPE_CHECKING:  # OpenVINO is loaded once the head is pinned to its core
    from agent.cli.status_link import StatusLink
    from agent.runtime.protocol import KVSession
    from agent.runtime.stage import CompiledStage

CONFIGS = ("mono", "pp", "pp+sd", "pp+mb", "pp+sd+mb")
USERS = {"mono": 1, "pp": 1, "pp+sd": 1, "pp+mb": 2, "pp+sd+mb": 2}
SPECULATIVE = frozenset({"pp+sd", "pp+sd+mb"})
DEFAULT_SETUPS = (("qwen2.5-coder-1.5b", 2), ("smollm2", 2), ("smollm2", 3))
DEFAULT_STAGES = {"smollm2": (2, 3)}
DEFAULT_LATENCIES = (0.0, 10.0, 50.0, 100.0)
DRAFTER_KINDS = ("ngram", "draft", "ngram+draft")
SELF_DRAFT_LAYERS = 8
DEFAULT_DRAFT_MODELS = {"qwen2.5-coder-1.5b": "smollm2"}
"""The best draft model on these machines for a model without a same-tokenizer one (it drafts through text)."""
DEFAULT_WARMUP_TOKENS = 8
DEFAULT_DEPTH = 1
"""Steps of a session in flight: pipelining measured no gain on the benchmark's answer (docs/benchmarks.md)."""
WARMUP_PROMPT_TOKENS = 16
"""A ring warm-up decodes from this many prompt tokens: it only has to wake both cores, not pay a prefill."""
QUIET_BUSY = 0.15
"""With ``--quiet-wait``, a round starts once other processes use at most this share of the machine."""
QUIET_POLL_S = 5.0
GOALS = {
    "pp+sd+mb/mono": 2.0,
    "pp+sd/pp": 1.4,
    "pp+mb/pp": 1.85,
    "pp+sd+mb/pp@100ms": 5.0,
}
PYTHON_SHARE_GOAL = 0.05
DEFAULT_PROMPT = """Add type hints to this Python function. Reply with the complete function.

```python
def summarize_orders(orders, currency="EUR", min_total=0):
    totals = {}
    counts = {}
    for order in orders:
        customer = order["customer"]
        amount = order["amount"]
        if order.get("currency", currency) != currency:
            continue
        totals[customer] = totals.get(customer, 0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    report = []
    for customer, total in sorted(totals.items()):
        if total >= min_total:
            report.append((customer, total, counts[customer]))
    return report
```"""
MARKDOWN_TITLE = "# Benchmarks\n\n"


def _progress(text: str) -> None:
    print(f"bench ring: {text}", file=sys.stderr, flush=True)


# -- settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    model: str
    stages: int
    layers: tuple[int, ...] | None = None
    """Layers per stage pinned with ``--layers`` (None: the split planner's cut)."""

    @property
    def label(self) -> str:
        cut = f" ({'/'.join(map(str, self.layers))} layers)" if self.layers else ""
        return f"{self.model} {self.stages} stages{cut}"

    @property
    def export_name(self) -> str:
        """The folder of this setup's ring export in the model's bench cache."""
        return f"shoal-{self.stages}stage" if self.layers is None else f"shoal-layers-{'-'.join(map(str, self.layers))}"


@dataclass(frozen=True)
class RingSettings(PinnedCores):
    """What ``python -m bench ring`` was asked to measure, validated."""

    setups: tuple[Setup, ...]
    latencies: tuple[float, ...]
    configs: tuple[str, ...]
    runs: int
    tokens: int
    tokens_at: dict[float, int]
    """Tokens per run at a given latency, where it differs from ``tokens``."""
    latency_setups: frozenset[Setup] | None
    """Setups measured at latencies after the first (None: all)."""
    warmup_tokens: int
    drafter: str
    """``best`` (a pilot of both drafters decides), ``ngram`` or ``draft``."""
    pilot_runs: int
    self_draft: int
    depth: int
    """Speculative steps of one session in flight at once."""
    head_core: int
    agent_cores: tuple[int, ...]
    """The agents' cores in stage order (stage 1 first); with fewer cores than agents, the last is shared."""
    prompt: str
    quiet_wait: float = 0.0
    draft_model: str | None = None
    """SOURCE of a separate draft model (a 1-stage export) for the model drafters; None: the defaults."""
    rewind: str = "auto"
    """How the head's stage and the agents forget rejected drafts (``RuntimeConfig.rewind``)."""
    draft_ahead: bool = False
    """A draft model drafts the next step while a step is answered (``decode(draft_ahead=...)``)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RingSettings:
        if args.runs < 1 or args.tokens < 2:
            raise BenchError("--runs must be at least 1 and --tokens at least 2")
        if args.depth < 1:
            raise BenchError("--depth must be at least 1")
        if args.model:
            stage_counts = args.stages or list(DEFAULT_STAGES.get(args.model, (2,)))
            setups = tuple(Setup(args.model, s) for s in stage_counts)
            if args.layers:
                if len(setups) != 1 or setups[0].stages != len(args.layers):
                    raise BenchError("--layers names the layers of every stage of one --stages count")
                setups = (Setup(args.model, len(args.layers), args.layers),)
        elif args.layers:
            raise BenchError("--layers needs --model")
        else:
            setups = tuple(Setup(m, s) for m, s in DEFAULT_SETUPS if not args.stages or s in args.stages)
        if not setups or any(s.stages < 2 for s in setups):
            raise BenchError("a ring needs at least 2 stages (the head holds stage 0)")
        latencies = tuple(args.latency_ms) if args.latency_ms else DEFAULT_LATENCIES
        if any(latency < 0 for latency in latencies):
            raise BenchError("--latency-ms must not be negative")
        tokens_at: dict[float, int] = {}
        for item in args.tokens_at or []:
            latency, _, count = item.partition("=")
            try:
                tokens_at[float(latency)] = int(count)
            except ValueError as exc:
                raise BenchError(f"--tokens-at takes MS=TOKENS, not {item!r}") from exc
        latency_setups = None
        if args.latency_setups:
            latency_setups = frozenset(_setup(text) for text in args.latency_setups.split(",") if text.strip())
        head_core, agent_cores = pick_cores(args.head_core, args.agent_core)
        return cls(
            setups=setups,
            latencies=latencies,
            configs=select_configs(args.configs, CONFIGS),
            runs=args.runs,
            tokens=args.tokens,
            tokens_at=tokens_at,
            latency_setups=latency_setups,
            warmup_tokens=max(1, args.warmup_tokens if args.warmup_tokens is not None else DEFAULT_WARMUP_TOKENS),
            drafter=args.drafter,
            pilot_runs=max(1, args.pilot_runs),
            self_draft=args.self_draft,
            depth=args.depth,
            head_core=head_core,
            agent_cores=agent_cores,
            prompt=args.prompt or DEFAULT_PROMPT,
            quiet_wait=max(0.0, args.quiet_wait or 0.0),
            rewind=args.rewind,
            draft_model=args.draft_model,
            draft_ahead=args.draft_ahead,
        )

    def draft_model_for(self, model: str) -> str | None:
        """The separate draft model of a setup (``--draft-model``, else the default), None for its self-draft."""
        chosen = self.draft_model or DEFAULT_DRAFT_MODELS.get(model)
        return None if chosen == model else chosen

    def tokens_for(self, latency: float) -> int:
        return self.tokens_at.get(latency, self.tokens)

    def latencies_for(self, setup: Setup) -> tuple[float, ...]:
        if self.latency_setups is None or setup in self.latency_setups:
            return self.latencies
        return self.latencies[:1]


def _setup(text: str) -> Setup:
    model, _, stages = text.strip().rpartition(":")
    if not model or not stages.isdigit():
        raise BenchError(f"--latency-setups takes MODEL:STAGES, not {text!r}")
    return Setup(model, int(stages))


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench ring`` (kept here, next to what reads them)."""
    b.add_argument(
        "--model",
        default=None,
        help="SOURCE to benchmark (default: qwen2.5-coder-1.5b in 2 stages, smollm2 in 2 and 3)",
    )
    b.add_argument(
        "--stages",
        type=int,
        action="append",
        default=None,
        help="ring stages, the head's included (repeatable; default: 2, and 3 for smollm2)",
    )
    b.add_argument(
        "--layers",
        type=layer_counts,
        default=None,
        metavar="N,N,...",
        help="with --model: cut the ring export here (layers per stage) instead of the planner's cut",
    )
    b.add_argument(
        "--latency-ms",
        type=float,
        nargs="+",
        default=None,
        metavar="L",
        help="added one-way latency per hop, one round set each (default: 0 10 50 100)",
    )
    b.add_argument("--runs", type=int, default=5, help="timed runs per configuration and latency")
    b.add_argument("--tokens", type=int, default=128, help="greedy tokens per user and run")
    b.add_argument(
        "--tokens-at",
        action="append",
        default=None,
        metavar="MS=N",
        help="fewer (or more) tokens per run at one latency, e.g. 100=64 (repeatable)",
    )
    b.add_argument(
        "--latency-setups",
        default=None,
        metavar="MODEL:STAGES[,...]",
        help="only these setups get the latencies after the first (default: all)",
    )
    b.add_argument("--configs", default=None, help="comma-separated subset of " + ",".join(CONFIGS))
    b.add_argument(
        "--drafter",
        choices=("best", *DRAFTER_KINDS),
        default="best",
        help="drafter for pp+sd: best = a pilot of both decides (default)",
    )
    b.add_argument("--pilot-runs", type=int, default=2, help="timed pilot runs per drafter")
    b.add_argument(
        "--depth",
        type=int,
        default=DEFAULT_DEPTH,
        help=f"speculative steps of a session in flight at once (default {DEFAULT_DEPTH}; 1: one at a time)",
    )
    b.add_argument(
        "--draft-ahead",
        action="store_true",
        help="a draft model also drafts while the ring computes, on a guess at the answer (opt-in)",
    )
    b.add_argument(
        "--self-draft",
        type=int,
        default=SELF_DRAFT_LAYERS,
        metavar="N",
        help=f"layers of the self-draft exported for the draft drafter (default {SELF_DRAFT_LAYERS})",
    )
    b.add_argument(
        "--draft-model",
        default=None,
        metavar="SOURCE",
        help="a separate draft model instead of the self-draft (another tokenizer drafts through text; "
        "default: smollm2 for qwen2.5-coder-1.5b, the self-draft otherwise)",
    )
    b.add_argument(
        "--warmup-tokens",
        type=int,
        default=None,
        help=f"untimed tokens right before each run (default {DEFAULT_WARMUP_TOKENS})",
    )
    add_core_arguments(b, head_help="core of the head and of mono (default: the first)")
    b.add_argument("--prompt", default=None, help="user message (default: add type hints to a 15-line function)")
    b.add_argument(
        "--quiet-wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="before each round, wait up to SECONDS for other processes to leave the machine (default 0)",
    )
    b.add_argument(
        "--rewind",
        choices=REWINDS,
        default="auto",
        help="how the head and the agents forget rejected drafts (as `shoal agent --rewind`)",
    )
    b.add_argument(
        "--users",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="many users instead (issue 45): N users each decode the prompt, for pp, pp+sd and packed "
        "(the agents pack their sessions' steps), e.g. --users 1 2 4 8; --configs from "
        "mono,cb,pp,pp+sd,paged,packed,packed+sd,packed+2ms (cb: openvino_genai's continuous batching)",
    )
    b.add_argument(
        "--stageless-head",
        action="store_true",
        help="with --users: an agent serves stage 0 (on the head's core) and the head only drives its users",
    )
    add_report_arguments(b)


# -- exports ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SetupExports:
    ring: Path
    """The N-stage export the ring serves (shared with ``python -m bench shards``)."""
    draft: Path | None
    """An export holding the self-draft graph (``--self-draft``)."""
    mono: Path | None
    """The optimum-intel whole-model export."""
    prepared: dict[str, dict[str, Any]]


def selfdraft_export(source: str, layers: int, out: Path, cache_dir: Path) -> PreparedExport:
    """``shoal export SOURCE --stages 2 --self-draft N --out OUT`` in a child process (reused when up to date).

    Only its draft graph is used (by every setup of the model): 2 stages keep the export's peak memory low."""
    manifest = out / "manifest.json"
    before = manifest.stat().st_mtime_ns if manifest.is_file() else None
    measured = run_measured(
        "agent.cli.main",
        [
            "--cache-dir",
            str(cache_dir),
            "export",
            source,
            "--stages",
            "2",
            "--self-draft",
            str(layers),
            "--out",
            str(out),
        ],
    )
    if measured.returncode:
        raise BenchError(f"`shoal export {source} --self-draft {layers}` failed (exit {measured.returncode})")
    reused = before is not None and manifest.stat().st_mtime_ns == before
    return PreparedExport(path=out, reused=reused, steps={} if reused else {"shoal-export": measured})


def prepare_exports(settings: RingSettings, cache_dir: Path) -> dict[Setup, SetupExports]:
    out: dict[Setup, SetupExports] = {}
    need_draft = any(c in SPECULATIVE for c in settings.configs) and settings.drafter != "ngram"
    per_model: dict[str, tuple[Path | None, Path | None, dict[str, Any]]] = {}
    for setup in settings.setups:
        work = cache_dir / "bench" / slug(setup.model)
        work.mkdir(parents=True, exist_ok=True)
        _progress(f"{setup.label}: shoal export (int4)")
        ring = shoal_export(setup.model, setup.stages, work / setup.export_name, cache_dir, setup.layers)
        prepared = {"ring": ring.to_json()}
        if setup.model in per_model:  # checked once per model
            draft, mono, shared = per_model[setup.model]
            out[setup] = SetupExports(ring=ring.path, draft=draft, mono=mono, prepared={**prepared, **shared})
            continue
        draft = None
        draft_model = settings.draft_model_for(setup.model)
        if need_draft and draft_model:
            _progress(f"{draft_model}: draft model export (int4, 1 stage)")
            draft_work = cache_dir / "bench" / slug(draft_model)
            draft_work.mkdir(parents=True, exist_ok=True)
            made = shoal_export(draft_model, 1, draft_work / "shoal-1stage", cache_dir)
            draft, prepared["draft"] = made.path, made.to_json()
        elif need_draft:
            _progress(f"{setup.model}: self-draft export ({settings.self_draft} layers)")
            made = selfdraft_export(
                setup.model, settings.self_draft, work / f"shoal-2stage-selfdraft{settings.self_draft}", cache_dir
            )
            draft, prepared["draft"] = made.path, made.to_json()
        mono = None
        if "mono" in settings.configs:
            _progress(f"{setup.model}: optimum-intel export for mono")
            made = optimum_export(setup.model, work / "optimum-int4", cache_dir)
            mono, prepared["mono"] = made.path, made.to_json()
        out[setup] = SetupExports(ring=ring.path, draft=draft, mono=mono, prepared=prepared)
        per_model[setup.model] = (draft, mono, {k: v for k, v in prepared.items() if k != "ring"})
    return out


# -- processes: agents and the delay proxy ---------------------------------------------------------
def _read_line(proc: subprocess.Popen[str], timeout: float, what: str) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BenchError(f"{what} did not answer within {timeout:.0f} s")
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise BenchError(f"{what} ended (exit {proc.wait()})")
            return line.strip()
        if proc.poll() is not None:
            raise BenchError(f"{what} ended (exit {proc.returncode})")


class ProxyProcess:
    """The delay proxies of one ring, in one process that may run on any core."""

    def __init__(self, spare_cores: list[int]) -> None:
        # off the head's and the agents' cores where the machine has spare ones, else on any core
        cores = set(spare_cores) or (os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.delay_proxy"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            preexec_fn=lambda: os.sched_setaffinity(0, cores),
        )
        line = _read_line(self._proc, 60, "the delay proxy")
        if not line.startswith("ready"):
            raise BenchError(f"the delay proxy said {line!r}")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _ask(self, command: str) -> str:
        assert self._proc.stdin is not None
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        answer = _read_line(self._proc, 30, "the delay proxy")
        if answer.startswith("error"):
            raise BenchError(f"delay proxy: {command}: {answer}")
        return answer

    def add(self, target: tuple[str, int]) -> tuple[str, int]:
        host, _, port = self._ask(f"add {target[0]}:{target[1]}").split()[1].rpartition(":")
        return host, int(port)

    def set_delay(self, ms: float) -> None:
        self._ask(f"delay {ms:g}")

    def stats(self) -> list[dict[str, Any]]:
        return list(json.loads(self._ask("stats").split(" ", 1)[1]))

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(OSError, BenchError):
                assert self._proc.stdin is not None
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# -- the head --------------------------------------------------------------------------------------
class TimingExecutor(ThreadPoolExecutor):
    """The head's one worker thread, adding up the wall time of what runs on it, by function name."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="head")
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        name = getattr(fn, "__name__", "other")

        def timed() -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return super().submit(timed)


@dataclass
class _Snapshot:
    """Cumulative counters at one instant (the head's synchronously, the agents' just after)."""

    at: float
    loop_cpu: float
    loop_kernel: float
    """Of ``loop_cpu``, time in the kernel (socket sends and receives: the wire's share of the head's core)."""
    executor: dict[str, float]
    infer: float
    ov_latency: float
    kv_cut: float = 0.0
    """Time the head's stage sessions spent cutting rejected drafts out of their KV state."""
    agent_compute: list[float] = field(default_factory=list)
    agent_kv_cut: list[float] = field(default_factory=list)
    agent_steps: list[int] = field(default_factory=list)
    agent_cpu: list[float] = field(default_factory=list)


@dataclass
class RingRun:
    """One timed run of one configuration."""

    config: str
    latency_ms: float
    tokens: list[list[int]]
    tok_s: float
    per_user_tok_s: list[float]
    ttft_s: list[float]
    window_s: float
    window_tokens: int
    steps: int
    drafted: int
    accepted: int
    k_chosen: list[int]
    drafter: str | None
    drafted_ahead: int = 0
    """Drafts the head made while a step was answered, and of those the ones sent as made."""
    ahead_used: int = 0
    head_stage_s: float = 0.0
    head_infer_s: float = 0.0
    head_kv_cut_s: float = 0.0
    """Of ``head_stage_s``, OpenVINO state copies that cut rejected drafts out of the KV cache."""
    head_ov_latency_s: float = 0.0
    draft_s: float = 0.0
    loop_cpu_s: float = 0.0
    loop_kernel_s: float = 0.0
    agent_compute_s: list[float] = field(default_factory=list)
    agent_kv_cut_s: list[float] = field(default_factory=list)
    """Of ``agent_compute_s``: each agent's cutting of rejected drafts out of its KV state."""
    agent_steps: list[int] = field(default_factory=list)
    agent_cpu_s: list[float] = field(default_factory=list)
    cpu_share: float | None = None
    others_busy: float | None = None
    foreign_busy: float | None = None
    """Share of the machine's CPU time (all cores) that processes other than this benchmark's used meanwhile."""
    wire_sent_bytes: int | None = None
    wire_received_bytes: int | None = None
    """Payload bytes of every user's decode steps (the prompt's step left out) to the ring and back."""
    gap_p50_s: float | None = None
    gap_p99_s: float | None = None
    """The time between one user's consecutive tokens, over every user's tokens after its first: median and 99th
    percentile (a token that came with others of one speculative step counts a gap of 0)."""

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def median_k(self) -> float | None:
        return float(statistics.median(self.k_chosen)) if self.k_chosen else None


class Ring:
    """Agents, proxies and the head's side of one (model, stages) setup, up for all its measurements."""

    def __init__(
        self,
        setup: Setup,
        exports: SetupExports,
        settings: RingSettings,
        cache_dir: Path,
        fleet_dir: Path,
        log_dir: Path,
        agent_args: Sequence[str] = (),
        users: int = 1,
        head_stage: bool = True,
        head_kv: str = "state",
        head_packs: bool = True,
    ) -> None:
        """``agent_args``: further ``shoal agent`` flags of every agent (``--config`` with packing off, say);
        ``users``: the most users a run may have (each a drafter of its own); ``head_stage``: the head holds stage
        0 (else an agent serves it, pinned to the head's core, and the head only drives its users); ``head_kv``:
        where that stage keeps its sessions' KV; ``head_packs``: whether the head packs its users' steps there."""
        self.head_kv = head_kv
        self.head_packs = head_packs
        self.agent_args = tuple(agent_args)
        self.users = users
        self.head_stage = head_stage
        self.setup = setup
        self.exports = exports
        self.settings = settings
        self.cache_dir = cache_dir
        self.fleet_dir = fleet_dir
        self.log_dir = log_dir
        self.agents: list[LocalAgent] = []
        self.proxy: ProxyProcess | None = None
        self.proxied: list[tuple[str, int]] = []
        self.stages: list[CompiledStage] = []
        """The head's own stages (stage 0)."""
        self.client: Any = None
        self.status_links: list[StatusLink] = []
        """Held open to each agent (straight to its port, not through the proxy): its counters in one round trip."""
        self.executor = TimingExecutor()
        self.drafters: dict[str, list[Any]] = {}
        self.local_sessions: list[KVSession] = []
        """The head's stage sessions of the running (or last) configuration, their inferences timed by ``timers``."""
        self.timers = RequestTimers()

    # bring-up ------------------------------------------------------------------------------------
    def start_processes(self) -> None:
        from agent.fleet import issue_node

        self.proxy = ProxyProcess(self.settings.spare_cores())
        addresses: dict[int, tuple[str, int]] = {}
        stages = self.setup.stages
        first = 1 if self.head_stage else 0
        # last stage first: each agent is told the proxied address of the next one
        for index in range(stages - 1, first - 1, -1):
            identity = issue_node(self.fleet_dir, f"stage-{index}", force=True)  # the bench fleet outlives runs
            core = self.settings.agent_core(index) if index else self.settings.head_core
            _progress(f"{self.setup.label}: starting the agent of stage {index} on core {core}")
            agent = start_agent(
                self.exports.ring,
                index,
                identity.cert.parent,
                core,
                self.cache_dir,
                self.log_dir / f"{slug(self.setup.model)}-{stages}stage-agent{index}.log",
                addresses.get(index + 1),
                extra=["--rewind", self.settings.rewind, *self.agent_args],
            )
            self.agents.insert(0, agent)
            addresses[index] = self.proxy.add(agent.address)
        self.proxied = [addresses[i] for i in range(first, stages)]

    async def connect(self) -> None:
        from agent.cli.status_link import StatusLink
        from agent.fleet import issue_node
        from agent.head.drafting import make_drafter
        from agent.head.local_packer import HEAD_PACKING
        from agent.head.ring_client import RingClient
        from agent.runtime.config import RuntimeConfig
        from agent.runtime.stage import CompiledStage
        from agent.sampling.params import SamplingParams
        from agent.transport.network import TlsNetwork
        from shards.manifest import Manifest

        identity = issue_node(self.fleet_dir, "head", force=True)
        self.identity = identity
        export = self.exports.ring
        self.manifest = Manifest.load(export)
        config = RuntimeConfig(
            device="CPU",
            threads=1,
            cache_dir=self.cache_dir / "ov-cache",
            rewind=self.settings.rewind,
            kv=self.head_kv,
        )
        if self.head_stage:
            _progress(f"{self.setup.label}: compiling stage 0 on the head (core {self.settings.head_core})")
            # off the event loop: another ring's client (``--users``) may be connected already, and an agent drops a
            # head that sends no heartbeat for 5 s (a 1.5B stage compiles for longer than that on a loaded core)
            self.stages = [
                await asyncio.to_thread(CompiledStage, export, self.manifest.stages[0], self.manifest.weights, config)
            ]
        self.client = RingClient(
            self.manifest,
            self.proxied[0],
            self.proxied[-1],
            TlsNetwork.of(identity),
            identity.name,
            local_stages=self.stages,
            executor=self.executor,
            packing=HEAD_PACKING if self.head_packs else None,
        )
        await self.client.connect(timeout=120.0)
        self.status_links = [await StatusLink.open(agent.address, identity) for agent in self.agents]
        params = SamplingParams()
        users = max(self.users, *(USERS[c] for c in self.settings.configs))
        kinds = DRAFTER_KINDS if self.settings.drafter == "best" else (self.settings.drafter,)
        if any(c in SPECULATIVE for c in self.settings.configs):
            for kind in kinds:
                draft_export = self.exports.draft if kind != "ngram" else None
                self.drafters[kind] = [
                    make_drafter(kind, export, self.manifest, params, config, draft_export) for _ in range(users)
                ]

    async def close(self) -> None:
        for link in self.status_links:
            with contextlib.suppress(Exception):
                await link.close()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        self.executor.shutdown(wait=True)

    def stop_processes(self) -> None:
        for agent in self.agents:
            agent.stop(timeout=30)
        if self.proxy is not None:
            self.proxy.close()

    # measuring -------------------------------------------------------------------------------------
    def our_cpu_seconds(self) -> float:
        """CPU time used so far by the head process, the agents and the proxy process."""
        import psutil

        total = sum(cpu_seconds(agent) for agent in self.agents)
        pids = [os.getpid()] + ([self.proxy.pid] if self.proxy is not None else [])
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
        return total

    def load_mark(self) -> tuple[float, float, float]:
        """(wall, machine busy CPU seconds, our CPU seconds) now; two marks give the foreign load between them."""
        return time.perf_counter(), _machine_busy_seconds(), self.our_cpu_seconds()

    @staticmethod
    def foreign_between(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
        wall = b[0] - a[0]
        cores = len(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
        if wall <= 0:
            return 0.0
        return max(0.0, ((b[1] - a[1]) - (b[2] - a[2])) / (wall * cores))

    async def wait_quiet(self, patience: float, threshold: float = QUIET_BUSY) -> None:
        """Wait (at most ``patience`` seconds) until other processes use at most ``threshold`` of the machine."""
        if patience <= 0:
            return
        deadline = time.monotonic() + patience
        announced = False
        while True:
            mark = self.load_mark()
            await asyncio.sleep(1.0)
            foreign = self.foreign_between(mark, self.load_mark())
            if foreign <= threshold:
                return
            if time.monotonic() >= deadline:
                _progress(
                    f"other processes still use {100 * foreign:.0f} % of the machine after {patience:.0f} s, "
                    "measuring anyway"
                )
                return
            if not announced:
                _progress(f"other processes use {100 * foreign:.0f} % of the machine, waiting for quiet")
                announced = True
            await asyncio.sleep(QUIET_POLL_S)

    async def snapshot(self) -> _Snapshot:
        """The head's counters now, then the agents' (their status arrives within a loopback round trip)."""
        return await self._with_agents(self._head_snapshot())

    async def _with_agents(self, shot: _Snapshot) -> _Snapshot:
        """``shot`` with the agents' counters (their status and their processes' CPU time) read now."""
        statuses = await asyncio.gather(*(link.get() for link in self.status_links))
        shot.agent_compute = [float(s["compute_seconds"]) for s in statuses]
        shot.agent_kv_cut = [float(s.get("kv_cut_seconds", 0.0)) for s in statuses]
        shot.agent_steps = [int(s["steps_served"]) for s in statuses]
        shot.agent_cpu = [cpu_seconds(agent) for agent in self.agents]
        return shot

    def _head_snapshot(self) -> _Snapshot:
        cpu = resource.getrusage(resource.RUSAGE_THREAD)  # this thread's: the event loop's
        return _Snapshot(
            at=time.perf_counter(),
            loop_cpu=cpu.ru_utime + cpu.ru_stime,
            loop_kernel=cpu.ru_stime,
            executor=dict(self.executor.seconds),
            infer=self.timers.infer_s,
            ov_latency=self.timers.latency_s,
            kv_cut=sum(s.kv_cut_seconds for s in self.local_sessions),
        )

    async def generate(
        self,
        config: str,
        latency_ms: float,
        tokens: int,
        drafter_kind: str | None,
        prompt_ids: list[int],
        users: int | None = None,
    ) -> RingRun:
        """One run of ``config``: its users (``users``, else the configuration's) decode ``tokens`` tokens each,
        concurrently."""
        from agent.head.adaptive_k import AdaptiveK
        from agent.head.decode import DecodeStats, decode
        from agent.runtime.session import StageSession
        from agent.sampling.params import SamplingParams

        users = users or USERS[config]
        params = SamplingParams()
        # the head's own stage sessions, their inferences timed
        self.timers = RequestTimers()
        self.local_sessions = []
        sessions = []
        for _ in range(users):
            local = [stage.new_session() for stage in self.stages]
            for stage_session in local:
                if isinstance(stage_session, StageSession):  # a paged one shares its stage's request: not timed
                    self.timers.time(stage_session)
            self.local_sessions += local
            sessions.append(self.client.session(params, local))
        drafters: list[Any] = [None] * users
        if drafter_kind is not None:
            drafters = self.drafters[drafter_kind][:users]
            for drafter in drafters:
                drafter.reset()
        stats = [DecodeStats() for _ in range(users)]
        load_start = self.load_mark()
        outputs: list[list[int]] = [[] for _ in range(users)]
        stamps: list[list[float]] = [[] for _ in range(users)]
        started = time.perf_counter()
        first_shot: list[asyncio.Task[_Snapshot]] = []
        last_shot: list[_Snapshot] = []

        async def user(i: int) -> None:
            async for token in decode(
                sessions[i],
                prompt_ids,
                max_tokens=tokens,
                stop_ids=frozenset(),
                params=params,
                context_tokens=self.manifest.context_tokens,
                drafter=drafters[i],
                k_policy=AdaptiveK(),
                executor=self.executor,
                stats=stats[i],
                depth=self.settings.depth,
                turn=self.client.turn,
                draft_ahead=self.settings.draft_ahead,
            ):
                stamps[i].append(time.perf_counter())
                outputs[i].append(token)
                if len(outputs[i]) == 1 and all(stamps):
                    # every user has its first token: the decode window starts
                    first_shot.append(asyncio.get_running_loop().create_task(self.snapshot()))
                if len(outputs[i]) == tokens:
                    last_shot[:] = [self._head_snapshot()]

        try:
            await asyncio.gather(*(user(i) for i in range(users)))
        finally:
            for session in sessions:
                with contextlib.suppress(Exception):
                    await session.close()
        foreign = self.foreign_between(load_start, self.load_mark())
        wire_sent = sum(s.bytes_sent - s.prompt_bytes_sent for s in sessions)
        wire_received = sum(s.bytes_received - s.prompt_bytes_received for s in sessions)
        if self.client.failure is not None:
            raise BenchError(f"the ring failed: {self.client.failure}")
        begin = await first_shot[0]
        end = await self._with_agents(last_shot[0])

        figures = StampFigures.of(stamps, started)
        executor = {
            name: end.executor.get(name, 0.0) - begin.executor.get(name, 0.0)
            for name in set(end.executor) | set(begin.executor)
        }
        return RingRun(
            config=config,
            latency_ms=latency_ms,
            tokens=outputs,
            tok_s=figures.tok_s,
            per_user_tok_s=figures.per_user_tok_s,
            ttft_s=figures.ttft_s,
            window_s=figures.window_s,
            window_tokens=figures.window_tokens,
            steps=sum(s.steps for s in stats),
            drafted=sum(s.drafted for s in stats),
            accepted=sum(s.accepted for s in stats),
            k_chosen=[k for s in stats for k in s.k_chosen],
            drafter=drafter_kind,
            drafted_ahead=sum(s.drafted_ahead for s in stats),
            ahead_used=sum(s.ahead_used for s in stats),
            head_stage_s=executor.get("_run_local", 0.0),
            head_infer_s=end.infer - begin.infer,
            head_kv_cut_s=end.kv_cut - begin.kv_cut,
            head_ov_latency_s=end.ov_latency - begin.ov_latency,
            draft_s=executor.get("propose", 0.0) + executor.get("propose_sized", 0.0),  # ModelDrafter, HybridDrafter
            loop_cpu_s=end.loop_cpu - begin.loop_cpu,
            loop_kernel_s=end.loop_kernel - begin.loop_kernel,
            agent_compute_s=[b - a for a, b in zip(begin.agent_compute, end.agent_compute, strict=True)],
            agent_kv_cut_s=[b - a for a, b in zip(begin.agent_kv_cut, end.agent_kv_cut, strict=True)],
            agent_steps=[b - a for a, b in zip(begin.agent_steps, end.agent_steps, strict=True)],
            agent_cpu_s=[b - a for a, b in zip(begin.agent_cpu, end.agent_cpu, strict=True)],
            foreign_busy=foreign,
            wire_sent_bytes=wire_sent,
            wire_received_bytes=wire_received,
            gap_p50_s=figures.gap_p50_s,
            gap_p99_s=figures.gap_p99_s,
        )


# -- the measurement -------------------------------------------------------------------------------
def _machine_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (all cores, from /proc/stat)."""
    from bench.worker import cpu_times

    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return sum(busy for busy, _ in cpu_times().values()) / ticks


def _prompt_ids(export: Path, prompt: str, tokens: int) -> list[int]:
    from agent.head.chat import ChatTokenizer
    from shards.manifest import Manifest

    manifest = Manifest.load(export)
    ids = ChatTokenizer(export / "tokenizer").encode_chat([{"role": "user", "content": prompt}])
    if len(ids) + tokens + 32 > manifest.context_tokens:
        raise BenchError(
            f"prompt ({len(ids)} tokens) + {tokens} tokens exceeds the {manifest.context_tokens}-token context"
        )
    return ids


def _mono_run(export: Path, prompt_ids: list[int], tokens: int, settings: RingSettings, ov_cache: Path) -> RingRun:
    from bench.worker import RunSpec, WorkerProcess

    spec = RunSpec(
        kind="mono",
        model_dir=str(export),
        prompt_ids=prompt_ids,
        tokens=tokens,
        warmup_tokens=settings.warmup_tokens,
        core=settings.head_core,
        ov_cache_dir=str(ov_cache),
    )
    with contextlib.closing(WorkerProcess("mono", spec)) as worker:
        result = worker.run()
    return RingRun(
        config="mono",
        latency_ms=0.0,
        tokens=[result.tokens],
        tok_s=result.tok_s,
        per_user_tok_s=[result.tok_s],
        ttft_s=[result.ttft_s],
        window_s=result.decode_s,
        window_tokens=len(result.tokens) - 1,
        steps=len(result.tokens),
        drafted=0,
        accepted=0,
        k_chosen=[],
        drafter=None,
        cpu_share=result.cpu_share,
        others_busy=result.others_busy,
    )


async def _measure_setup(
    ring: Ring, settings: RingSettings, prompt_ids: list[int], on_latency_done: Any
) -> dict[str, Any]:
    """Pilot, then every latency's rounds; returns this setup's raw results."""
    assert ring.proxy is not None
    await ring.connect()
    loop = asyncio.get_running_loop()
    result: dict[str, Any] = {
        "model": ring.setup.model,
        "stages": ring.setup.stages,
        "layers": [len(stage.layers) for stage in ring.manifest.stages],
        "latencies": {},
    }
    try:
        first_latency = settings.latencies[0]
        speculative = any(c in SPECULATIVE for c in settings.configs)
        result["pilots"], result["drafters"] = {}, {}
        mono_runs: list[RingRun] = []
        for latency in settings.latencies_for(ring.setup):
            ring.proxy.set_delay(latency)
            tokens = settings.tokens_for(latency)
            drafter = None
            if speculative:
                # the best drafter depends on the latency: a draft model's time pays off only on a slow link
                drafter, pilot = await _pilot(ring, settings, latency, prompt_ids)
                result["pilots"][latency], result["drafters"][latency] = pilot, drafter
            configs = tuple(c for c in settings.configs if c != "mono" or latency == first_latency)
            runs: dict[str, list[RingRun]] = {c: [] for c in configs}
            _progress(
                f"{ring.setup.label}: {latency:g} ms per hop, {tokens} tokens, {settings.runs} rounds of "
                f"{', '.join(configs)}"
            )
            for round_index in range(settings.runs):
                await ring.wait_quiet(settings.quiet_wait)
                for config in rotation(configs, round_index):
                    if config == "mono":
                        assert ring.exports.mono is not None
                        ov_cache = ring.cache_dir / "bench" / slug(ring.setup.model) / "ov-cache"
                        done = await loop.run_in_executor(
                            None, _mono_run, ring.exports.mono, prompt_ids, tokens, settings, ov_cache
                        )
                        mono_runs.append(done)
                    else:
                        kind = drafter if config in SPECULATIVE else None
                        await ring.generate(
                            config, latency, settings.warmup_tokens, kind, prompt_ids[:WARMUP_PROMPT_TOKENS]
                        )
                        done = await ring.generate(config, latency, tokens, kind, prompt_ids)
                    runs[config].append(done)
                    extra = (
                        ""
                        if done.acceptance is None
                        else (f", acceptance {_pct(done.acceptance)}, median K {done.median_k:g}")
                    )
                    if done.drafted_ahead:
                        extra += f", drafts ahead used {done.ahead_used}/{done.drafted_ahead}"
                    users = (
                        ""
                        if len(done.per_user_tok_s) < 2
                        else (" (per user " + ", ".join(f"{v:.2f}" for v in done.per_user_tok_s) + ")")
                    )
                    load = "" if done.foreign_busy is None else f", others {100 * done.foreign_busy:.0f} % busy"
                    if done.others_busy is not None:
                        load = f", other core {100 * done.others_busy:.0f} % busy"
                    _progress(
                        f"{ring.setup.label} @{latency:g} ms round {round_index + 1}/{settings.runs} "
                        f"{config:<9} {done.tok_s:7.2f} tok/s{users}{extra}{load}"
                    )
            result["latencies"][latency] = {
                "tokens": tokens,
                "runs": {c: [dataclasses.asdict(r) for r in rs] for c, rs in runs.items()},
            }
            on_latency_done(result)
        result["proxy_stats"] = ring.proxy.stats()
    finally:
        await ring.close()
    return result


async def _pilot(
    ring: Ring, settings: RingSettings, latency: float, prompt_ids: list[int]
) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The drafter for pp+sd at one latency: ``--drafter``, or the fastest in a pilot of every kind."""
    if settings.drafter != "best":
        return settings.drafter, {}
    pilot: dict[str, list[dict[str, Any]]] = {}
    tokens = settings.tokens_for(latency)
    for run in range(settings.pilot_runs):
        for kind in rotation(DRAFTER_KINDS, run):
            await ring.generate("pp+sd", latency, settings.warmup_tokens, kind, prompt_ids[:WARMUP_PROMPT_TOKENS])
            done = await ring.generate("pp+sd", latency, tokens, kind, prompt_ids)
            pilot.setdefault(kind, []).append({"tok_s": done.tok_s, "acceptance": done.acceptance, "k": done.median_k})
            _progress(
                f"{ring.setup.label} @{latency:g} ms: pilot {kind:<11} {done.tok_s:7.2f} tok/s, acceptance "
                f"{_pct(done.acceptance)}, median K {done.median_k}"
            )
    best = max(pilot, key=lambda k: statistics.median(p["tok_s"] for p in pilot[k]))
    _progress(f"{ring.setup.label} @{latency:g} ms: best drafter: {best}")
    return best, pilot


def _pilot_text(pilot: dict[str, list[dict[str, Any]]]) -> str:
    return "; ".join(
        f"{kind} {statistics.median(p['tok_s'] for p in runs):.2f} tok/s, acceptance "
        f"{_pct(_median([p['acceptance'] for p in runs]))}, K {_opt(_median([p['k'] for p in runs]), 'g')}"
        for kind, runs in pilot.items()
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a CI timeout) end the benchmark as Ctrl-C does: through the ``finally`` that
    stops its agents and proxies, which the default action would leave running."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_bench_ring(args: argparse.Namespace, cache_dir: Path) -> int:
    """Prepare (or reuse) the exports, bring each ring up, measure it, report."""
    if args.users:
        from bench.ring_users import run_users

        return run_users(args, cache_dir)
    settings = RingSettings.from_args(args)
    _stop_on_sigterm()
    exports = prepare_exports(settings, cache_dir)
    # pin before OpenVINO is loaded here, so that its thread pool sees one CPU
    os.sched_setaffinity(0, {settings.head_core})
    fleet_dir, log_dir = bench_dirs(cache_dir, "ring-logs")
    partial = log_dir / "results.json"
    machine = describe_machine(settings.head_core)
    machine.update({"head_core": settings.head_core, "agent_cores": list(settings.agent_cores)})
    raw: dict[str, Any] = {"settings": _settings_json(settings), "machine": machine, "setups": []}
    _progress(f"logs and partial results in {log_dir}")

    for setup in settings.setups:
        setup_exports = exports[setup]
        prompt_ids = _prompt_ids(
            setup_exports.ring, settings.prompt, max(settings.tokens, *settings.tokens_at.values(), settings.tokens)
        )
        ring = Ring(setup, setup_exports, settings, cache_dir, fleet_dir, log_dir)
        current: dict[str, Any] = {}

        def save(result: dict[str, Any], current: dict[str, Any] = current) -> None:
            current.clear()
            current.update(result)
            partial.write_text(json.dumps({**raw, "setups": [*raw["setups"], current]}, default=str))

        try:
            ring.start_processes()
            result = asyncio.run(_measure_setup(ring, settings, prompt_ids, save))
        finally:
            ring.stop_processes()
        result["prompt_tokens"] = len(prompt_ids)
        result["exports"] = setup_exports.prepared
        raw["setups"].append(result)
        partial.write_text(json.dumps(raw, default=str))

    report = build_report(raw)
    return publish(args, log_dir, report, render_table(report), render_markdown(report, command_line()))


def publish(args: argparse.Namespace, log_dir: Path, report: dict[str, Any], table: str, markdown: str) -> int:
    """Keep ``report`` in the run's logs, print it (``--json``, else ``table``), append ``markdown`` to the file
    ``--markdown`` names."""
    (log_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    if args.json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        print(table)
    if args.markdown is not None:
        append_markdown(args.markdown, markdown)
        _progress(f"results appended to {args.markdown}")
    return 0


def _settings_json(settings: RingSettings) -> dict[str, Any]:
    data = dataclasses.asdict(settings)
    data["spare_cores"] = settings.spare_cores()
    data["setups"] = [dataclasses.asdict(s) for s in settings.setups]
    data["latency_setups"] = (
        None if settings.latency_setups is None else [dataclasses.asdict(s) for s in settings.latency_setups]
    )
    data["tokens_at"] = {f"{k:g}": v for k, v in settings.tokens_at.items()}
    return data


# -- the report ------------------------------------------------------------------------------------
def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def config_figures(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median / min / max aggregate tok/s of one configuration at one latency, and its other figures."""
    speed = Summary.of([r["tok_s"] for r in runs])
    per_user = [statistics.fmean(r["per_user_tok_s"]) for r in runs]
    figures: dict[str, Any] = {
        "tok_s": speed.median,
        "min": speed.min,
        "max": speed.max,
        "runs": speed.runs,
        "tok_s_runs": [r["tok_s"] for r in runs],
        "per_user_tok_s": statistics.median(per_user),
        "per_user_min": min(per_user),
        "per_user_max": max(per_user),
        "acceptance": _median([r["accepted"] / r["drafted"] if r["drafted"] else None for r in runs]),
        "k": _median([statistics.median(r["k_chosen"]) if r["k_chosen"] and r["drafter"] else None for r in runs]),
        "k_max": _median([max(r["k_chosen"]) if r["k_chosen"] and r["drafter"] else None for r in runs]),
        "drafter": runs[0]["drafter"],
        "users": len(runs[0]["per_user_tok_s"]),
        "ttft_s": statistics.median(statistics.fmean(r["ttft_s"]) for r in runs),
        "tokens_per_step": _median(
            [(len(r["tokens"][0]) - 1) * len(r["tokens"]) / r["steps"] if r["steps"] else None for r in runs]
        )
        if runs[0]["config"] != "mono"
        else None,
    }
    if runs[0]["config"] == "mono":
        figures["cpu_share_min"] = min(r["cpu_share"] for r in runs)
        figures["other_core_busy_max"] = max(r["others_busy"] for r in runs)
        return figures
    figures["foreign_busy_median"] = statistics.median(r["foreign_busy"] or 0.0 for r in runs)
    figures["foreign_busy_max"] = max(r["foreign_busy"] or 0.0 for r in runs)
    # how busy each stage was during the decode window (pipelining fills the stages)
    figures["stage_busy"] = [statistics.median([r["head_stage_s"] / r["window_s"] for r in runs])] + [
        statistics.median([r["agent_compute_s"][i] / r["window_s"] for r in runs])
        for i in range(len(runs[0]["agent_compute_s"]))
    ]

    # compute per decoded token of each stage: with two users it rises where the stages' cores slow each other
    def compute_s(run: dict[str, Any], stage: int) -> float:
        return float(run["head_stage_s"] if stage == 0 else run["agent_compute_s"][stage - 1])

    figures["stage_ms_per_token"] = [
        statistics.median([1e3 * compute_s(r, i) / r["window_s"] / r["tok_s"] for r in runs])
        for i in range(1 + len(runs[0]["agent_compute_s"]))
    ]
    if figures["users"] == 1:
        figures["time_split"] = time_split(runs)
    return figures


def time_split(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Where one decoded token's wall time went (ms per token, medians over runs).

    The event loop's CPU time in the kernel (socket sends and receives; on loopback a send also runs the
    receiver's TCP processing) is wire, not our Python: it is counted with the rest.
    """

    def per_token(fn: Any) -> float:
        return 1e3 * statistics.median(fn(r) / r["window_tokens"] for r in runs)

    def loop_user(r: dict[str, Any]) -> float:
        return float(r["loop_cpu_s"] - r.get("loop_kernel_s", 0.0))  # results saved before the split: all user

    def executor_python(r: dict[str, Any]) -> float:
        return max(0.0, r["head_stage_s"] - r["head_infer_s"] - r.get("head_kv_cut_s", 0.0))

    def rest(r: dict[str, Any]) -> float:
        return r["window_s"] - r["head_stage_s"] - r["draft_s"] - sum(r["agent_compute_s"]) - loop_user(r)

    split = {
        "wall_ms": per_token(lambda r: r["window_s"]),
        "head_stage_ms": per_token(lambda r: r["head_stage_s"]),
        "head_infer_ms": per_token(lambda r: r["head_infer_s"]),
        "head_kv_cut_ms": per_token(lambda r: r.get("head_kv_cut_s", 0.0)),
        "head_ov_latency_ms": per_token(lambda r: r["head_ov_latency_s"]),
        "draft_ms": per_token(lambda r: r["draft_s"]),
        "agents_compute_ms": [
            1e3 * statistics.median(r["agent_compute_s"][i] / r["window_tokens"] for r in runs)
            for i in range(len(runs[0]["agent_compute_s"]))
        ],
        "agents_kv_cut_ms": [
            1e3 * statistics.median(_agent_kv_cut(r, i) / r["window_tokens"] for r in runs)
            for i in range(len(runs[0]["agent_compute_s"]))
        ],
        "agents_other_cpu_ms": [
            1e3
            * statistics.median(
                max(0.0, r["agent_cpu_s"][i] - r["agent_compute_s"][i]) / r["window_tokens"] for r in runs
            )
            for i in range(len(runs[0]["agent_compute_s"]))
        ],
        "head_loop_cpu_ms": per_token(lambda r: r["loop_cpu_s"]),
        "head_loop_kernel_ms": per_token(lambda r: r.get("loop_kernel_s", 0.0)),
        "head_loop_python_ms": per_token(loop_user),
        "head_executor_python_ms": per_token(executor_python),
        "wire_and_rest_ms": per_token(rest),
        "steps_per_token": statistics.median(r["steps"] / (len(r["tokens"][0])) for r in runs),
        # results saved before bytes were counted have none
        "wire_bytes_per_step": [
            _median([r[key] / r["steps"] if r.get(key) is not None and r["steps"] else None for r in runs])
            for key in ("wire_sent_bytes", "wire_received_bytes")
        ],
    }
    split["head_python_ms"] = split["head_loop_python_ms"] + split["head_executor_python_ms"]
    split["python_share"] = statistics.median((loop_user(r) + executor_python(r)) / r["window_s"] for r in runs)
    return split


def _agent_kv_cut(run: dict[str, Any], agent: int) -> float:
    """One agent's KV-cut seconds in ``run`` (0 in runs saved before agents reported it)."""
    cuts = run.get("agent_kv_cut_s") or []
    return float(cuts[agent]) if agent < len(cuts) else 0.0


def _drafters_by_latency(setup: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """The pp+sd drafter and its pilot per latency (``"100"``: ...), also from raw results saved before
    per-latency pilots, which held one drafter and one pilot, run at the first latency."""
    if "drafters" in setup:
        return (
            {f"{float(k):g}": v for k, v in setup["drafters"].items()},
            {f"{float(k):g}": v for k, v in setup.get("pilots", {}).items()},
        )
    if not setup.get("drafter") or not setup.get("latencies"):
        return {}, {}
    first = f"{float(next(iter(setup['latencies']))):g}"
    return {first: setup["drafter"]}, {first: setup.get("pilot") or {}}


def build_report(raw: dict[str, Any]) -> dict[str, Any]:
    """The one JSON object ``--json`` prints: shaped like ``python -m bench shards --json`` for the first setup at
    the first latency (``configs``), with every setup and latency under ``setups``."""
    setups = []
    for setup in raw["setups"]:
        latencies = list(setup["latencies"])
        first = latencies[0]
        mono_runs = setup["latencies"][first]["runs"].get("mono")
        mono = config_figures(mono_runs) if mono_runs else None
        cells = []
        for latency in latencies:
            block = setup["latencies"][latency]
            runs = block["runs"]
            configs = {name: config_figures(rs) for name, rs in runs.items()}
            if mono is not None:
                configs.setdefault("mono", mono)
            cell: dict[str, Any] = {"latency_ms": float(latency), "tokens": block["tokens"], "configs": configs}
            ratios: dict[str, float] = {}
            paired: dict[str, Any] = {}
            for name, figures in configs.items():
                if mono is not None and name != "mono":
                    ratios[f"{name}/mono"] = figures["tok_s"] / mono["tok_s"]
                if "pp" in configs and name not in ("pp", "mono"):
                    ratios[f"{name}/pp"] = figures["tok_s"] / configs["pp"]["tok_s"]
                    pair = Summary.of(paired_ratios([r["tok_s"] for r in runs[name]], [r["tok_s"] for r in runs["pp"]]))
                    paired[f"{name}/pp"] = {"median": pair.median, "min": pair.min, "max": pair.max}
            cell["ratios"] = ratios
            cell["paired_ratios"] = paired
            cell["agreement"] = _agreements(runs)
            cells.append(cell)
        drafters, pilots = _drafters_by_latency(setup)
        first_piloted = next(iter(drafters), None)
        entry = {
            "model": setup["model"],
            "stages": setup["stages"],
            "layers": setup.get("layers"),
            "prompt_tokens": setup.get("prompt_tokens"),
            # drafter / pilot: those of the first latency, as reports had them before per-latency pilots
            "drafter": drafters.get(first_piloted or ""),
            "pilot": pilots.get(first_piloted or "", {}),
            "drafters": drafters,
            "pilots": pilots,
            "cells": cells,
            "proxy_stats": setup.get("proxy_stats"),
            "exports": setup.get("exports"),
        }
        entry["goals"] = _goals(cells)
        setups.append(entry)
    report: dict[str, Any] = {"settings": raw["settings"], "machine": raw["machine"], "setups": setups}
    if setups and setups[0]["cells"]:
        first = setups[0]["cells"][0]
        report.update(
            {
                "model": setups[0]["model"],
                "stages": setups[0]["stages"],
                "latency_ms": first["latency_ms"],
                "tokens": first["tokens"],
                "runs": raw["settings"]["runs"],
                "configs": first["configs"],
                "ratios": first["ratios"],
                "goals": setups[0]["goals"],
            }
        )
    return report


def _agreements(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Greedy tokens of every user of every configuration against pp's (speculation must not change them)."""
    out: dict[str, Any] = {}
    if "pp" not in runs:
        return out
    reference = runs["pp"][0]["tokens"][0]
    for name, rs in runs.items():
        if name in ("pp", "mono"):
            continue
        worst = None
        for r in rs:
            for user_tokens in r["tokens"]:
                agreed = agreement(user_tokens, reference)
                if worst is None or agreed.same < worst.same:
                    worst = agreed
        if worst is not None:
            out[f"{name}/pp"] = dataclasses.asdict(worst)
    return out


def _goals(cells: list[dict[str, Any]]) -> dict[str, Any]:
    goals: dict[str, Any] = {}
    if not cells:
        return goals
    base = cells[0]
    for key in ("pp+sd+mb/mono", "pp+sd/pp", "pp+mb/pp"):
        ratio = base["ratios"].get(key)
        if ratio is not None:
            goals[f"{key}@{base['latency_ms']:g}ms"] = {
                "target": GOALS[key],
                "ratio": ratio,
                "pass": ratio >= GOALS[key],
            }
    at_100 = next((c for c in cells if c["latency_ms"] == 100.0), None)
    if at_100 is not None and "pp+sd+mb/pp" in at_100["ratios"]:
        ratio = at_100["ratios"]["pp+sd+mb/pp"]
        goals["pp+sd+mb/pp@100ms"] = {
            "target": GOALS["pp+sd+mb/pp@100ms"],
            "ratio": ratio,
            "pass": ratio >= GOALS["pp+sd+mb/pp@100ms"],
        }
    shares = {name: f["time_split"]["python_share"] for name, f in base["configs"].items() if "time_split" in f}
    if shares:
        worst = max(shares.values())
        goals[f"python_share@{base['latency_ms']:g}ms"] = {
            "target": PYTHON_SHARE_GOAL,
            "share": worst,
            "by_config": shares,
            "pass": worst < PYTHON_SHARE_GOAL,
        }
    return goals


# -- rendering -------------------------------------------------------------------------------------
def _speed(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _goal_text(name: str, goal: dict[str, Any]) -> str:
    if "share" in goal:
        figure = f"{100 * goal['share']:.1f} % (< {100 * goal['target']:.0f} %)"
    else:
        # a ratio that rounds onto its target is shown to three places, so that "FAIL" never reads as equal
        places = 3 if round(goal["ratio"], 2) == round(goal["target"], 2) else 2
        figure = f"{goal['ratio']:.{places}f}× (≥ {goal['target']:.2f}×)"
    return f"{name}: {figure} {'pass' if goal['pass'] else 'FAIL'}"


def _two_users_compute_text(setup: dict[str, Any]) -> list[str]:
    """How much more compute each stage spent per token with two users than with one (first latency)."""
    configs = setup["cells"][0]["configs"] if setup["cells"] else {}
    one, two = (configs.get(name, {}).get("stage_ms_per_token") for name in ("pp", "pp+mb"))
    if not one or not two:
        return []
    ratios = " / ".join(f"{b / a:.2f}×" for a, b in zip(one, two, strict=True))
    return [
        f"Compute per token of each stage (head / agents) at {setup['cells'][0]['latency_ms']} ms/hop: pp "
        f"{' / '.join(f'{a:.1f}' for a in one)} ms, pp+mb {' / '.join(f'{b:.1f}' for b in two)} ms ({ratios}): "
        "two users make the stages compute at the same time, and where the PCs are cores of one machine they "
        "slow each other (`shoal bench stages --together` measures it).",
        "",
    ]


def _rows(setup: dict[str, Any]) -> Iterator[list[str]]:
    for cell in setup["cells"]:
        latency = cell["latency_ms"]
        for name, f in cell["configs"].items():
            if name == "mono" and latency != setup["cells"][0]["latency_ms"]:
                continue
            paired = cell["paired_ratios"].get(f"{name}/pp")
            yield [
                f"{latency:g}",
                name,
                f"{_speed(f['tok_s'])} ({_speed(f['min'])}-{_speed(f['max'])})",
                "-" if f["users"] < 2 else f"{_speed(f['per_user_tok_s'])}",
                _opt(None if f["acceptance"] is None else 100 * f["acceptance"], ".0f")
                + (" %" if f["acceptance"] is not None else ""),
                "-" if f["k"] is None else f"{f['k']:g} ({f.get('k_max', 0):g})",
                _opt(cell["ratios"].get(f"{name}/mono"), ".2f") if name != "mono" else "1.00",
                ("1.00" if name == "pp" else _opt(cell["ratios"].get(f"{name}/pp"), ".2f")) if name != "mono" else "-",
                "-" if paired is None else f"{paired['median']:.2f} ({paired['min']:.2f}-{paired['max']:.2f})",
                "-" if "stage_busy" not in f else " / ".join(f"{100 * b:.0f}" for b in f["stage_busy"]),
                (
                    f"{100 * f['foreign_busy_median']:.0f} ({100 * f['foreign_busy_max']:.0f})"
                    if "foreign_busy_median" in f
                    else f"core {100 * f['other_core_busy_max']:.0f} max"
                    if "other_core_busy_max" in f
                    else "-"
                ),
            ]


HEADER = [
    "ms/hop",
    "config",
    "tok/s median (min-max)",
    "per user",
    "acceptance",
    "K median (max)",
    "× mono",
    "× pp",
    "paired × pp (min-max)",
    "stage busy % (head / agents)",
    "others busy % median (max)",
]


def _rewind_sentence(settings: dict[str, Any]) -> str:
    """How the run's stages forgot rejected drafts (results from before ``--rewind`` masked, or compacted)."""
    rewind = settings.get("rewind") or ("compact" if settings.get("compact_rewind") else "mask")
    return {
        "auto": " Stages cut rejected drafts out of the KV state wherever masking them would be inexact "
        "(`--rewind auto`: every one-thread CPU stage computing below f32).",
        "compact": " Stages cut rejected drafts out of the KV state (`--rewind compact`).",
        "mask": " Stages mask rejected drafts out of attention (`--rewind mask`).",
    }[rewind]


def _bytes_per_step(split: dict[str, Any]) -> str:
    sent, received = split.get("wire_bytes_per_step") or (None, None)
    if sent is None or received is None:
        return "-"
    return f"{sent:,.0f}, {received:,.0f}"


def _cores_text(agent_cores: list[int], report: dict[str, Any]) -> str:
    """Which cores the agents of the report's largest ring ran on, in words."""
    return cores_text(agent_cores, max(s["stages"] for s in report["setups"]) - 1)


def render_table(report: dict[str, Any]) -> str:
    lines = [
        f"python -m bench ring: {report['settings']['runs']} runs per configuration; "
        f"{report['machine'].get('cpu', '?')}"
    ]
    for setup in report["setups"]:
        lines += [
            "",
            f"{setup['model']}, {setup['stages']} stages (drafter for pp+sd: {setup['drafter']})",
            "  ".join(HEADER),
        ]
        lines += ["  ".join(row) for row in _rows(setup)]
        lines += [_goal_text(name, goal) for name, goal in setup["goals"].items()]
    return "\n".join(lines)


def render_markdown(report: dict[str, Any], command: str) -> str:
    settings = report["settings"]
    machine = report["machine"]
    lines = [
        f"## python -m bench ring, {machine.get('date', '')}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores (`nproc`), "
        f"{machine.get('memory_gb', 0):.0f} GB RAM; OpenVINO {machine.get('openvino', '?')}, openvino-genai "
        f"{machine.get('openvino_genai', '?')}. The head (this process: stage 0, tokenizer, drafter, loop on one "
        f"OpenVINO thread and one worker thread) and `mono` are pinned to core {settings['head_core']}; the agents "
        f"(`shoal agent --threads 1`) with taskset to {_cores_text(settings['agent_cores'], report)}"
        + ". The delay proxies run in one process, "
        + (f"on the spare cores {spare}" if (spare := settings.get("spare_cores")) else "on any core")
        + ".",
        "",
        f"Method: greedy decoding, stop tokens ignored, {settings['tokens']} tokens per user and run"
        + ("".join(f", {v} at {k} ms" for k, v in settings["tokens_at"].items()))
        + f"; {settings['runs']} rounds per latency, each running every configuration once in rotated order, each "
        "timed run right after an untimed warm-up of the same configuration "
        f"({settings['warmup_tokens']} tokens from the first {WARMUP_PROMPT_TOKENS} prompt tokens; `mono`: from the "
        "whole prompt); `mono` runs in the rounds "
        "of the first latency only (a fresh `openvino_genai.LLMPipeline` process per run, one thread). Aggregate "
        "tok/s excludes each user's first token; 2-user configurations are two concurrent sessions of the same "
        "prompt from the one head. Latency = one-way delay per hop added by a userspace proxy in front of each "
        "agent's port (in the path at 0 ms too); N stages = N hops per ring token." + _rewind_sentence(settings),
        "",
        "Prompt (user message, chat template applied): " + json.dumps(settings["prompt"]),
        "",
    ]
    for setup in report["setups"]:
        pilots = setup["pilots"]
        drafter_text = "; ".join(
            f"at {latency} ms **{kind}**" + (f" (pilot: {_pilot_text(pilots[latency])})" if pilots.get(latency) else "")
            for latency, kind in setup["drafters"].items()
        )
        lines += [
            f"### {setup['model']}, {setup['stages']} stages",
            "",
            (f"Layers per stage {'/'.join(map(str, setup['layers']))}. " if setup.get("layers") else "")
            + f"Prompt {setup.get('prompt_tokens')} tokens."
            + (f" Drafter for pp+sd: {drafter_text}." if drafter_text else ""),
            "",
            "| " + " | ".join(HEADER) + " |",
            "|" + "---:|" * 2 + "---:|" * (len(HEADER) - 2),
        ]
        lines += ["| " + " | ".join(row) + " |" for row in _rows(setup)]
        lines += [
            "",
            "× mono: ratio of medians against `mono` at the first latency; × pp: against pp at the same "
            "latency; paired: median of the per-round ratios. K: medians over runs of the median and the "
            "maximum K of a run (the last steps of a run draft at most the tokens still to go; a step where "
            "the n-gram drafter found no match chooses no K). Stage busy: "
            "compute time / decode wall time of "
            "stage 0 on the head and of each agent. Others busy: share of the whole machine's CPU time (both "
            "cores) used by processes other than this benchmark's during the run (for mono: the busiest the "
            "other core was).",
            "",
            "Goals: " + "; ".join(_goal_text(n, g) for n, g in setup["goals"].items()) + ".",
            "",
        ]
        lines += _two_users_compute_text(setup)
        split_rows = []
        for cell in setup["cells"]:
            for name, f in cell["configs"].items():
                s = f.get("time_split")
                if s is None:
                    continue
                split_rows.append(
                    f"| {cell['latency_ms']:g} | {name} | {s['wall_ms']:.2f} | {s['head_stage_ms']:.2f} "
                    f"({s['head_infer_ms']:.2f}, {s.get('head_kv_cut_ms', 0.0):.2f}) | {s['draft_ms']:.2f} | "
                    + " / ".join(
                        f"{v:.2f} ({c:.2f})" for v, c in zip(s["agents_compute_ms"], s["agents_kv_cut_ms"], strict=True)
                    )
                    + f" | {s['head_loop_python_ms']:.2f} + {s['head_executor_python_ms']:.2f} = "
                    f"{100 * s['python_share']:.1f} % | {s['head_loop_kernel_ms']:.2f} | {s['wire_and_rest_ms']:.2f} | "
                    + " / ".join(f"{v:.2f}" for v in s["agents_other_cpu_ms"])
                    + f" | {s['steps_per_token']:.2f} | {_bytes_per_step(s)} |"
                )
        if split_rows:
            lines += [
                "Per decoded token (ms, medians; 1-user configurations): stage 0 on the head (of which in "
                "`InferRequest.infer`, and in cutting rejected drafts out of the KV state: OpenVINO state reads "
                "and writes, not counted as Python), drafting on the head's worker thread (a draft model; the "
                "n-gram drafter runs on the event loop and counts as Python), agents' compute (`compute_seconds` "
                "from their status; of which KV cut), our own Python on the head (event-loop thread CPU in user "
                "space + "
                "worker-thread time outside `infer` and the KV cut; share of the token's wall time), the "
                "event-loop thread's CPU in the kernel (socket sends and receives, on loopback the receiver's TCP "
                "work included; part of the next column), the rest (wire, delays, proxies, agents' event loops, "
                "scheduling), agents' CPU outside compute, ring steps per token, payload bytes of a decode step "
                "to the first agent and of its answer from the last.",
                "",
                "| ms/hop | config | wall | stage 0 (infer, KV cut) | draft | agents' compute (KV cut) | head Python "
                "| head kernel | wire + rest | agents' other CPU | steps/token | bytes/step out, back |",
                "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                *split_rows,
                "",
            ]
        disagreements = [
            f"{pair} at {cell['latency_ms']:g} ms: {a['same']}/{a['total']}"
            for cell in setup["cells"]
            for pair, a in cell["agreement"].items()
            if a["first_difference"] is not None
        ]
        lines.append(
            "- Greedy tokens of every user of every configuration identical to pp's: "
            + ("yes." if not disagreements else "no: " + "; ".join(disagreements) + ".")
        )
        lines.append("")
    return "\n".join(lines) + "\n"


def main_json_to_markdown(argv: list[str]) -> int:
    """``python -m bench.ring_bench RESULTS.json COMMAND``: render saved (partial) results again."""
    raw = json.loads(Path(argv[0]).read_text())
    print(render_markdown(build_report(raw), argv[1] if len(argv) > 1 else "python -m bench ring"))
    return 0


if __name__ == "__main__":
    sys.exit(main_json_to_markdown(sys.argv[1:]))
