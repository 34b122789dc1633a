"""``python -m bench prefill``: the time to the first token of a long prompt, shoal beside what a user would run
instead (issue 26).

Configurations, each in fresh processes of its own, one inference thread per process:

- ``genai``: ``openvino_genai.LLMPipeline`` on the optimum-intel int4 export of the same checkpoint, prefix
  caching off (``bench.worker``'s ``mono``), in the CPU's default precision; ``genai-f32`` the same in f32
  activations (what a CPU without bf16 computes in: with ``1-stage-f32``, the pair such a CPU compares);
- ``torch``: transformers in float32 on a Hugging Face folder of the same checkpoint (a GGUF is dequantized into
  one, kept in the bench cache), the reference a user could fall back to: one forward over the prompt, computing
  the last position's logits only (as ``generate`` does);
- ``1-stage``: shoal's 1-stage int4 export in one process (``LocalPipeline``), prompts through its PagedAttention
  compilation in the CPU's default precision (the defaults); ``1-stage-f32`` the same in f32 activations
  (``fast_prefill=False``, the default before 2026-12-05; the same as ``1-stage`` on a CPU without bf16);
  ``1-stage-sdpa`` every step on the SDPA graph in f32 activations (how shoal prefilled before 2026-12-04);
- ``ringN`` and ``ringN-pipelined``: a ring of N agents (``shoal agent --threads 1``): the agent of stage 0 heads
  chats (on the head core), one agent serves each further stage (``--agent-core``). It is asked through its chat
  endpoint (``shoal ask``'s client) and sends the prompt through the ring as one step (``--prefill-chunk 0``) or
  cut into chunks pipelined through the stages (``--prefill-chunk``, default 512). It keeps no session between
  answers (``--chat-keep 0``) and drafts nothing (``--drafter none``).

Every path gets the same token ids: a fixed text repeated, tokenized with the export's tokenizer and cut after N
ids. A chat agent gets the text of those ids as a completion (no chat template) and tokenizes it back into the
same ids: the bench checks that before it starts, and each answer's prompt size after. A shoal export holds
4,096 positions, so a longer prompt is cut to 4,095 (one position for the answer).

Time to the first token: from the start of the request to the first greedy token (one new token). In-process
configurations time it inside their process (``bench.worker``; genai by its own perf metrics), the rings at the
client, the chat agent's tokenizing and its ring session's opening included. Each configuration first answers a
prompt of ``WARMUP_TOKENS``, untimed (its first inferences), then each of ``--runs`` rounds asks every
length, shortest first.

Goals (issue 26): 1-stage at most 1.1x genai's time (and 1-stage-f32 of genai-f32's) and 1.5x torch's; the 3-agent
ring with pipelined prefill at most 0.6x the 1-stage time where each stage has its own core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ShoalError
from agent.head.prefill import DEFAULT_PREFILL_CHUNK
from bench import BenchError, add_report_arguments, select_configs
from bench.agents import PinnedCores, add_core_arguments, bench_dirs, cores_text, pick_cores, start_chat_ring
from bench.baseline import hf_folder, optimum_export, shoal_export
from bench.shards_bench import command_line, describe_machine, publish, slug
from bench.stats import Summary
from bench.worker import RunSpec, WorkerProcess

if TYPE_CHECKING:
    from agent.chat_client.endpoint import ChatEndpoint

CONFIGS = (
    "genai",
    "genai-f32",
    "torch",
    "1-stage",
    "1-stage-f32",
    "1-stage-sdpa",
    "ring2",
    "ring2-pipelined",
    "ring3",
    "ring3-pipelined",
)
WORKER_KINDS = {
    "genai": "mono",
    "genai-f32": "mono",
    "torch": "torch",
    "1-stage": "shoal",
    "1-stage-f32": "shoal",
    "1-stage-sdpa": "shoal",
}
"""The configurations that run in one ``bench.worker`` process, and the worker's kind for each."""
SHOAL_PREFILLS = {"1-stage": ("paged", True), "1-stage-f32": ("paged", False), "1-stage-sdpa": ("sdpa", False)}
"""Each in-process shoal configuration's ``RuntimeConfig.prefill_attention`` and ``fast_prefill``."""
GENAI_PRECISIONS = {"genai-f32": "f32"}
"""The genai configurations' ``INFERENCE_PRECISION_HINT`` (absent: the device's default)."""
GENAI = ("genai", "genai-f32")
NOT_SHOAL = (*GENAI, "torch")
PIPELINED = "-pipelined"
DEFAULT_LENGTHS = (512, 2048, 4096)
WARMUP_TOKENS = 256
"""The untimed first answer's prompt: long enough for shoal's paged compilation (made on the first step of at least
``agent.runtime.session.PAGED_MIN_POSITIONS`` positions), so that no timed prompt carries its one-time cost."""
HF_FOLDER = "hf-fp32"
"""The Hugging Face folder of a GGUF checkpoint in the model's bench cache (torch runs on it)."""
GOALS = (
    ("1-stage", "genai", 1.1),
    ("1-stage-f32", "genai-f32", 1.1),
    ("1-stage", "torch", 1.5),
    ("ring3-pipelined", "1-stage", 0.6),
)
"""(configuration, reference, the most its time may be as a multiple of the reference's)."""
OWN_CORES_GOAL = "ring3-pipelined"
"""The goal that holds where each stage has its own core."""
FILLER = (
    "The office keeps its old computers running through the night, and each of them holds a slice of the model. "
    "When a question arrives, the first machine reads it and passes what it computed to the next one, which does "
    "its own part of the work and passes it on again, until the last machine picks the first word of the answer. "
)


def _progress(text: str) -> None:
    print(f"bench prefill: {text}", file=sys.stderr, flush=True)


# -- settings --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefillSettings(PinnedCores):
    """What ``python -m bench prefill`` was asked to measure, validated."""

    model: str
    lengths: tuple[int, ...]
    runs: int
    configs: tuple[str, ...]
    prefill_chunk: int
    """Positions per chunk of the pipelined rings."""
    head_core: int
    """The core of the in-process configurations and of each ring's chat agent (stage 0)."""
    agent_cores: tuple[int, ...]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PrefillSettings:
        if args.runs < 1 or args.prefill_chunk < 1:
            raise BenchError("--runs and --prefill-chunk must be at least 1")
        head_core, agent_cores = pick_cores(args.head_core, args.agent_core)
        return cls(
            model=args.model,
            lengths=args.lengths,
            runs=args.runs,
            configs=select_configs(args.configs, CONFIGS),
            prefill_chunk=args.prefill_chunk,
            head_core=head_core,
            agent_cores=agent_cores,
        )

    def own_cores(self, stages: int) -> bool:
        """Whether each stage of a ring of ``stages`` has a core of its own."""
        return len({self.head_core, *(self.agent_core(i) for i in range(1, stages))}) == stages

    def to_json(self) -> dict[str, Any]:
        """The settings as the report holds them, with whether each ring's stages had cores of their own."""
        return {**asdict(self), "own_cores": {str(n): self.own_cores(n) for n in (2, 3)}}


def ring_stages(config: str) -> int:
    """The stages of a configuration: N for ``ringN[-pipelined]``, 1 otherwise."""
    return int(config.removesuffix(PIPELINED)[4:]) if config.startswith("ring") else 1


def token_counts(text: str) -> tuple[int, ...]:
    """An argparse type: ``512,2048`` -> prompt lengths in tokens."""
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected token counts such as 512,2048, not {text!r}")
    return counts


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench prefill``."""
    b.add_argument("--model", default="smollm2", help="SOURCE to benchmark (default smollm2)")
    b.add_argument(
        "--lengths",
        type=token_counts,
        default=DEFAULT_LENGTHS,
        metavar="N[,N...]",
        help="prompt lengths in tokens (default 512,2048,4096; at most the export's context less one)",
    )
    b.add_argument("--runs", type=int, default=1, help="timed answers per configuration and length (default 1)")
    b.add_argument("--configs", default=None, help="comma-separated subset of " + ",".join(CONFIGS))
    b.add_argument(
        "--prefill-chunk",
        type=int,
        default=DEFAULT_PREFILL_CHUNK,
        metavar="POSITIONS",
        help=f"chunk size of the pipelined rings (default {DEFAULT_PREFILL_CHUNK}, the agent's default)",
    )
    add_core_arguments(b, head_help="core of genai, torch, 1-stage and each ring's chat agent (default: the first)")
    add_report_arguments(b)


# -- prompts ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompt:
    """A prompt's token ids, and a text that the export's tokenizer encodes into exactly those ids."""

    text: str
    ids: list[int]


def prompt_of(
    n: int, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str], text: str = FILLER
) -> Prompt:
    """A prompt of exactly ``n`` token ids: ``text`` repeated, encoded and cut after ``n`` ids, with the text of
    those ids, which must encode back into them (as a chat agent will). Where a cut does not (a word cut in two
    encodes otherwise alone), the repeated text starts one word later, for another cut."""
    if n < 1:
        raise ValueError("a prompt has at least one token")
    words = text.split()
    copies = n // max(1, len(encode(text))) + 2
    for skip in range(len(words)):
        ids = encode(" ".join(words[skip:]) + " " + text * copies)[:n]
        prompt = decode(ids)
        if len(ids) == n and encode(prompt) == ids:
            return Prompt(prompt, ids)
    raise BenchError(f"found no text of exactly {n} tokens that the tokenizer encodes back into the same ids")


def prompt_lengths(requested: Sequence[int], context_tokens: int | None) -> tuple[int, ...]:
    """The prompt lengths to measure, shortest first: each requested one, cut to leave one position of the
    context for the answer (``context_tokens``: the smallest context of the shoal exports; None: no limit)."""
    cap = context_tokens - 1 if context_tokens else None
    return tuple(sorted({n if cap is None else min(n, cap) for n in requested}))


# -- measuring -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefillRun:
    """One timed answer."""

    config: str
    tokens: int
    """Prompt tokens."""
    run: int
    ttft_s: float
    first_token: int | None
    """The first greedy token (None: the ring's answer ended at once, on a stop token)."""


Ask = Callable[[Prompt], tuple[float, int | None]]
"""Times one answer to a prompt: (seconds to the first token, that token)."""


def _rounds(config: str, runs: int, prompts: Sequence[Prompt], ask: Ask, results: list[PrefillRun]) -> None:
    """``runs`` rounds of every prompt, each answer added to ``results`` as it comes."""
    for run in range(runs):
        for prompt in prompts:
            ttft, token = ask(prompt)
            _progress(f"{config} run {run + 1}/{runs}: {len(prompt.ids)} tokens, first token after {ttft:.3f} s")
            results.append(PrefillRun(config, len(prompt.ids), run, ttft, token))


@dataclass(frozen=True)
class Measuring:
    """What every configuration's measurement shares."""

    settings: PrefillSettings
    warmup: Prompt
    prompts: list[Prompt]
    cache_dir: Path
    ov_cache: Path
    fleet_dir: Path
    log_dir: Path


def _in_process(config: str, model_dir: Path, m: Measuring, results: list[PrefillRun]) -> None:
    """A configuration in one ``bench.worker`` process pinned to the head core."""
    # tokens and warmup_tokens serve only the worker's `run` command, which this bench does not send
    core = m.settings.head_core
    attention, fast = SHOAL_PREFILLS.get(config, ("paged", True))
    spec = RunSpec(
        WORKER_KINDS[config],
        str(model_dir),
        m.warmup.ids,
        2,
        1,
        core,
        str(m.ov_cache),
        attention,
        fast,
        GENAI_PRECISIONS.get(config),
    )
    _progress(f"{config}: loading it in a process on core {core}")
    with contextlib.closing(WorkerProcess(config, spec)) as worker:
        worker.prefill(m.warmup.ids)

        def ask(prompt: Prompt) -> tuple[float, int | None]:
            result = worker.prefill(prompt.ids)
            return result.ttft_s, result.tokens[0]

        _rounds(config, m.settings.runs, m.prompts, ask, results)


def _ring(config: str, export: Path, m: Measuring, results: list[PrefillRun]) -> None:
    """A ring of fresh agents, asked through its chat agent's endpoint."""
    from agent.chat_client.endpoint import ChatEndpoint

    chunk = m.settings.prefill_chunk if config.endswith(PIPELINED) else 0
    flags = ["--chat-keep", "0", "--drafter", "none", "--prefill-chunk", str(chunk)]
    logs = m.log_dir / config
    logs.mkdir(parents=True, exist_ok=True)
    stages = ring_stages(config)
    agents, endpoints = start_chat_ring(export, stages, m.settings, m.fleet_dir, m.cache_dir, logs, {config: flags})
    try:
        endpoint = ChatEndpoint.load(endpoints[config])
        asyncio.run(_ask_ring(endpoint, m.warmup))
        _rounds(config, m.settings.runs, m.prompts, lambda prompt: asyncio.run(_ask_ring(endpoint, prompt)), results)
    finally:
        for agent in reversed(agents):
            agent.stop(timeout=30)


async def _ask_ring(endpoint: ChatEndpoint, prompt: Prompt) -> tuple[float, int | None]:
    from agent.chat_client.protocol import ChatRequest
    from bench.chat_bench import timed_answer

    request = ChatRequest(token=endpoint.token, messages=(), prompt=prompt.text, max_tokens=1)
    first, _, _, ids, stats = await timed_answer(endpoint, request)
    if stats.get("prompt_tokens") != len(prompt.ids):
        raise BenchError(f"the chat agent read {stats.get('prompt_tokens')} prompt tokens, not {len(prompt.ids)}")
    return first, ids[0] if ids else None


def _prepare(settings: PrefillSettings, work: Path, cache_dir: Path) -> dict[str, Path]:
    """Each configuration's model folder, exported (or reused from the bench cache)."""
    paths: dict[str, Path] = {}
    shoal: dict[int, Path] = {}
    for config in settings.configs:
        if config in GENAI:
            _progress(f"{settings.model}: optimum-intel export (int4)")
            paths[config] = optimum_export(settings.model, work / "optimum-int4", cache_dir, work / HF_FOLDER).path
        elif config == "torch":
            paths[config] = hf_folder(settings.model, work / HF_FOLDER, cache_dir).path
        else:
            stages = ring_stages(config)
            if stages not in shoal:
                _progress(f"{settings.model}: shoal export (int4, {stages} stage{'s' if stages != 1 else ''})")
                shoal[stages] = shoal_export(settings.model, stages, work / f"shoal-{stages}stage", cache_dir).path
            paths[config] = shoal[stages]
    return paths


def _prompts(paths: Mapping[str, Path], lengths: Sequence[int]) -> tuple[tuple[int, ...], Prompt, list[Prompt]]:
    """The lengths measured, the warm-up prompt and the measured prompts, from the first export's tokenizer."""
    from agent.head.chat import ChatTokenizer
    from shards.manifest import Manifest

    shoal = [path for config, path in paths.items() if config not in NOT_SHOAL]
    folder = next(iter(paths.values()))
    tokenizer = ChatTokenizer(shoal[0] / "tokenizer" if shoal else folder)
    context = min((Manifest.load(path).context_tokens for path in shoal), default=None)
    measured = prompt_lengths(lengths, context)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=True)  # as a chat agent encodes a completion

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids)

    return measured, prompt_of(WARMUP_TOKENS, encode, decode), [prompt_of(n, encode, decode) for n in measured]


def run_bench_prefill(args: argparse.Namespace, cache_dir: Path) -> int:
    """Prepare (or reuse) the exports, measure each configuration in its own processes, report."""
    settings = PrefillSettings.from_args(args)
    work = cache_dir / "bench" / slug(settings.model)
    work.mkdir(parents=True, exist_ok=True)
    paths = _prepare(settings, work, cache_dir)
    lengths, warmup, prompts = _prompts(paths, settings.lengths)
    fleet_dir, log_dir = bench_dirs(cache_dir, "prefill-logs")
    _progress(f"logs and the answers so far (runs.json) in {log_dir}")
    machine = describe_machine(settings.head_core, ("torch", "transformers"))
    measuring = Measuring(settings, warmup, prompts, cache_dir, work / "ov-cache", fleet_dir, log_dir)
    runs: list[PrefillRun] = []
    failures: dict[str, str] = {}
    for config in settings.configs:
        try:
            if config in WORKER_KINDS:
                _in_process(config, paths[config], measuring, runs)
            else:
                _ring(config, paths[config], measuring, runs)
        except (ShoalError, OSError) as exc:  # the other configurations are still worth measuring
            failures[config] = f"{type(exc).__name__}: {exc}"
            _progress(f"{config} failed: {failures[config]}")
        (log_dir / "runs.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    report = build_report(settings.to_json(), lengths, runs, machine, failures)
    report["exports"] = {config: str(path) for config, path in paths.items()}
    publish(args, report, render_markdown(report, command_line()), log_dir)
    return 0


# -- the report ------------------------------------------------------------------------------------
def goal_ratios(medians: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """Each goal whose two configurations were measured: per prompt length, the ratio of their median times and
    whether it is within the goal."""
    goals = []
    for config, reference, target in GOALS:
        if config not in medians or reference not in medians:
            continue
        ratios = {n: t / medians[reference][n] for n, t in medians[config].items() if medians[reference].get(n)}
        goals.append(
            {
                "config": config,
                "reference": reference,
                "target": target,
                "lengths": {n: {"ratio": r, "pass": r <= target} for n, r in ratios.items()},
            }
        )
    return goals


def build_report(
    settings: Mapping[str, Any],
    lengths: Sequence[int],
    runs: Sequence[PrefillRun],
    machine: Mapping[str, Any],
    failures: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The one JSON object ``python -m bench prefill --json`` prints: per configuration and prompt length the
    time to the first token over the runs, the goals, the first tokens (keys are lengths, as text) and the
    configurations that failed, with why."""
    configs = [c for c in CONFIGS if any(r.config == c for r in runs)]
    ttft: dict[str, dict[str, dict[str, Any]]] = {}
    first_tokens: dict[str, dict[str, int | None]] = {}
    for config in configs:
        for n in lengths:
            times = [r.ttft_s for r in runs if r.config == config and r.tokens == n]
            if times:
                ttft.setdefault(config, {})[str(n)] = asdict(Summary.of(times))
                first = next(r.first_token for r in runs if r.config == config and r.tokens == n)
                first_tokens.setdefault(str(n), {})[config] = first
    medians = {config: {n: s["median"] for n, s in by_length.items()} for config, by_length in ttft.items()}
    return {
        "settings": dict(settings),
        "machine": dict(machine),
        "lengths": [str(n) for n in lengths],
        "ttft_s": ttft,
        "goals": goal_ratios(medians),
        "first_tokens": first_tokens,
        "failures": dict(failures or {}),
        "runs": [asdict(r) for r in runs],
    }


def _seconds(summary: Mapping[str, Any] | None) -> str:
    if summary is None:
        return "-"
    if summary["runs"] == 1:
        return f"{summary['median']:.3f}"
    return f"{summary['median']:.3f} ({summary['min']:.3f}-{summary['max']:.3f})"


def _cores(settings: Mapping[str, Any]) -> str:
    head = settings["head_core"]
    alone = [c for c in settings["configs"] if c in WORKER_KINDS]
    text = f"{', '.join(alone)}: a process each, pinned to core {head}" if alone else ""
    for stages in sorted({ring_stages(c) for c in settings["configs"] if c.startswith("ring")}):
        text += (
            f"{'; ' if text else ''}the ring of {stages}: stage 0 (the chat agent) on core {head}, stage"
            f"{'s' if stages > 2 else ''} 1{f'-{stages - 1}' if stages > 2 else ''} on "
            f"{cores_text(settings['agent_cores'], stages - 1)}"
        )
    return text + "; every process with one inference thread"


def _goal_note(goal: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    if goal["config"] == OWN_CORES_GOAL and not settings["own_cores"]["3"]:
        return " (the stages shared cores here: the goal is for one core each)"
    return ""


def render_markdown(report: Mapping[str, Any], command: str) -> str:
    """A section for docs/benchmarks.md: date, command, machine and cores, the times, the goals."""
    settings, machine, lengths = report["settings"], report["machine"], report["lengths"]
    configs = list(report["ttft_s"])
    lines = [
        f"## {settings['model']}: time to the first token of a long prompt, {machine['date']}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']:.0f} GB RAM, load average "
        f"{machine['load_average']:.2f} at the start; OpenVINO {machine['openvino']}, openvino-genai "
        f"{machine['openvino_genai']}, optimum-intel {machine['optimum_intel']}, torch {machine.get('torch', '?')}, "
        f"transformers {machine.get('transformers', '?')}. Cores: {_cores(settings)}.",
        "",
        "Method: the same prompt token ids on every path (a fixed text repeated, cut after N tokens), one greedy "
        "token; time from the start of the request to that token, after an untimed answer to a "
        f"{WARMUP_TOKENS}-token prompt in the same processes. genai: `openvino_genai.LLMPipeline` (prefix caching "
        "off) on the optimum-intel int4 export (genai-f32: in f32 activations); torch: transformers float32 on the "
        "dequantized checkpoint, one forward; 1-stage: shoal's 1-stage int4 export in one process, its defaults "
        "(1-stage-f32: prompts in f32 activations, not the CPU's default precision; 1-stage-sdpa: also on the SDPA "
        "graph, not the PagedAttention one); ringN: N agents, the chat agent (stage 0) asked through its endpoint, "
        "the prompt sent as one step (`--prefill-chunk 0`) or, `-pipelined`, in "
        f"chunks of at most {settings['prefill_chunk']} positions.",
        "",
        "| prompt tokens | " + " | ".join(configs) + " |",
        "|---:|" + "---:|" * len(configs),
    ]
    for n in lengths:
        cells = [_seconds(report["ttft_s"][c].get(n)) for c in configs]
        lines.append(f"| {int(n):,} | " + " | ".join(cells) + " |")
    runs = settings["runs"]
    lines += ["", f"Seconds: {'one run' if runs == 1 else f'median (min-max) of {runs} runs'}.", ""]
    if report["goals"]:
        lines += [
            "| goal | " + " | ".join(f"{int(n):,} tokens" for n in lengths) + " |",
            "|---|" + "---|" * len(lengths),
        ]
        for goal in report["goals"]:
            cells = []
            for n in lengths:
                result = goal["lengths"].get(n)
                cells.append("-" if result is None else f"{result['ratio']:.2f} {'pass' if result['pass'] else 'FAIL'}")
            lines.append(
                f"| {goal['config']} ≤ {goal['target']}× {goal['reference']}{_goal_note(goal, settings)} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
    asked = [int(n) for n in settings["lengths"]]
    if sorted(asked) != [int(n) for n in lengths]:
        lines.append(
            f"- Prompt lengths asked: {', '.join(f'{n:,}' for n in asked)}, each cut to leave one position of "
            "the shoal exports' context for the answer."
        )
    for config, why in report["failures"].items():
        lines.append(f"- {config} failed: {why}")
    for n, tokens in report["first_tokens"].items():
        distinct = set(tokens.values())
        same = f"all {next(iter(distinct))}" if len(distinct) == 1 else ", ".join(f"{c} {t}" for c, t in tokens.items())
        lines.append(f"- First token at {int(n):,} prompt tokens: {same}.")
    return "\n".join(lines) + "\n\n"
