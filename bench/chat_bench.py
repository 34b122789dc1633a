"""``python -m bench chat``: a multi-turn conversation through a chat agent that keeps its sessions between
turns, side by side with one that starts every turn afresh.

One ring of one-thread agents (stages 1.., on one core each in stage order, ``--agent-core`` as for
``python -m bench ring``) serves two stage-0 agents with a chat endpoint, both on the head core: one
keeps a finished answer's session (``--chat-keep``), the other does not (``--chat-keep 0``). Each
round holds the same conversation with both, in rotated order; a turn sends every turn before it
with its answer, as a chat client does. Measured per turn, from the client: the time to the first
token (the prompt's step: with a kept session only the new message is computed) and the whole turn.
The answers must be identical token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.node.launcher import LocalAgent
from bench import BenchError, add_report_arguments
from bench.agents import PinnedCores, add_core_arguments, bench_dirs, cores_text, pick_cores, start_chat_ring
from bench.baseline import shoal_export
from bench.ring_bench import DEFAULT_PROMPT
from bench.shards_bench import command_line, describe_machine, publish, rotation, slug
from bench.stats import Summary, paired_ratios

if TYPE_CHECKING:
    from agent.chat_client.endpoint import ChatEndpoint
    from agent.chat_client.protocol import ChatRequest

MODES = ("kept", "afresh")
DEFAULT_FOLLOW_UPS = (
    "Now add a docstring that explains each parameter.",
    "Rewrite the function to use collections.defaultdict, with the same type hints and docstring.",
)


def _progress(text: str) -> None:
    print(f"bench chat: {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ChatBenchSettings(PinnedCores):
    """What ``python -m bench chat`` was asked to measure, validated."""

    model: str
    stages: int
    runs: int
    tokens: int
    turns: tuple[str, ...]
    head_core: int
    """The core of both chat agents (stage 0)."""
    agent_cores: tuple[int, ...]
    """The other agents' cores in stage order (stage 1 first); with fewer cores than agents, the last is shared."""
    precision: str = "auto"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ChatBenchSettings:
        if args.runs < 1 or args.tokens < 1:
            raise BenchError("--runs and --tokens must be at least 1")
        if args.stages < 2:
            raise BenchError("a ring needs at least 2 stages (the chat agent holds stage 0)")
        turns = (args.prompt or DEFAULT_PROMPT, *(args.follow_up or DEFAULT_FOLLOW_UPS))
        head_core, agent_cores = pick_cores(args.head_core, args.agent_core)
        return cls(
            model=args.model,
            stages=args.stages,
            runs=args.runs,
            tokens=args.tokens,
            turns=turns,
            head_core=head_core,
            agent_cores=agent_cores,
            precision=args.precision,
        )


def add_arguments(b: argparse.ArgumentParser) -> None:
    """The options of ``python -m bench chat``."""
    b.add_argument("--model", default="qwen2.5-coder-1.5b", help="SOURCE to benchmark (default qwen2.5-coder-1.5b)")
    b.add_argument("--stages", type=int, default=2, help="ring stages, the chat agent's included (default 2)")
    b.add_argument("--runs", type=int, default=5, help="timed conversations per agent (after one untimed)")
    b.add_argument("--tokens", type=int, default=64, help="most tokens of each answer (default 64)")
    b.add_argument("--prompt", default=None, help="the first user message (default: the ring benchmark's)")
    b.add_argument(
        "--follow-up",
        action="append",
        default=None,
        metavar="MESSAGE",
        help="a later user message (repeatable; default: two follow-ups on the first answer)",
    )
    b.add_argument(
        "--precision",
        choices=("auto", "f32", "bf16", "f16"),
        default="auto",
        help="every agent's inference precision (as `shoal agent --precision`; default auto)",
    )
    add_core_arguments(b, head_help="core of the chat agents (default: the first)")
    add_report_arguments(b)


@dataclass(frozen=True)
class TurnResult:
    """One turn of one conversation, as the client saw it."""

    round: int
    mode: str
    turn: int
    first_token_seconds: float
    seconds: float
    prompt_tokens: int
    cached_tokens: int
    tokens: tuple[int, ...]


class ChatRing:
    """The ring's agents, and the two chat agents in front of it."""

    def __init__(self, settings: ChatBenchSettings, export: Path, cache_dir: Path, log_dir: Path) -> None:
        self.settings = settings
        self.export = export
        self.cache_dir = cache_dir
        self.log_dir = log_dir
        self.agents: list[LocalAgent] = []
        self.endpoints: dict[str, Path] = {}

    def start(self, fleet_dir: Path) -> None:
        precision = ["--precision", self.settings.precision]
        heads = {"kept": ["--chat-keep", "3600", "--chat-keep-max", "1"], "afresh": ["--chat-keep", "0"]}
        self.agents, self.endpoints = start_chat_ring(
            self.export, self.settings.stages, self.settings, fleet_dir, self.cache_dir, self.log_dir, heads, precision
        )

    def stop(self) -> None:
        for agent in reversed(self.agents):
            agent.stop(timeout=30)


async def timed_answer(
    endpoint: ChatEndpoint, request: ChatRequest
) -> tuple[float, float, str, list[int], dict[str, Any]]:
    """Ask ``request`` of a chat agent: the seconds to its first token and to the end,
    the answer's text and token ids, and the ``done`` event's stats."""
    from agent.chat_client.client import ask

    started = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    ids: list[int] = []
    async for event in ask(endpoint, request):
        if event.event == "token":
            first = first if first is not None else time.perf_counter() - started
            text.append(event.text)
            assert event.id is not None
            ids.append(event.id)
        elif event.event == "error":
            raise BenchError(f"the chat agent answered {event.code}: {event.text}")
        elif event.event == "done":
            return (
                first if first is not None else time.perf_counter() - started,
                time.perf_counter() - started,
                "".join(text),
                ids,
                event.stats,
            )
    raise BenchError("the chat agent closed the connection without finishing its answer")


async def _measure(ring: ChatRing, settings: ChatBenchSettings) -> list[TurnResult]:
    from agent.chat_client.endpoint import ChatEndpoint
    from agent.chat_client.protocol import ChatRequest

    endpoints = {mode: ChatEndpoint.load(path) for mode, path in ring.endpoints.items()}
    results: list[TurnResult] = []
    for round_ in range(settings.runs + 1):  # round 0: untimed (the chat agents join the ring, first inferences)
        for mode in rotation(MODES, round_):
            endpoint = endpoints[mode]
            history: tuple[tuple[str, str], ...] = ()
            for index, message in enumerate(settings.turns):
                history = (*history, ("user", message))
                request = ChatRequest(token=endpoint.token, messages=history, max_tokens=settings.tokens)
                first, seconds, text, ids, stats = await timed_answer(endpoint, request)
                history = (*history, ("assistant", text))
                _progress(
                    f"round {round_} {mode}: turn {index + 1} first token {first:.2f} s, {seconds:.2f} s, "
                    f"{stats['cached_tokens']} of {stats['prompt_tokens']} prompt tokens kept"
                )
                if round_ > 0:
                    results.append(
                        TurnResult(
                            round_,
                            mode,
                            index + 1,
                            first,
                            seconds,
                            int(stats["prompt_tokens"]),
                            int(stats["cached_tokens"]),
                            tuple(ids),
                        )
                    )
    return results


def build_report(results: Sequence[TurnResult], settings: ChatBenchSettings, machine: dict[str, Any]) -> dict[str, Any]:
    """Per turn: medians of each agent's first-token and whole-turn times, their paired ratios, tokens."""
    turns = []
    for turn in range(1, len(settings.turns) + 1):
        by_mode = {
            mode: sorted((r for r in results if r.turn == turn and r.mode == mode), key=lambda r: r.round)
            for mode in MODES
        }
        kept, afresh = by_mode["kept"], by_mode["afresh"]
        first_ratio = paired_ratios([r.first_token_seconds for r in afresh], [r.first_token_seconds for r in kept])
        whole_ratio = paired_ratios([r.seconds for r in afresh], [r.seconds for r in kept])
        turns.append(
            {
                "turn": turn,
                "prompt_tokens": Summary.of([r.prompt_tokens for r in kept]).median,
                "cached_tokens": {mode: Summary.of([r.cached_tokens for r in by_mode[mode]]).median for mode in MODES},
                "first_token_seconds": {
                    mode: asdict(Summary.of([r.first_token_seconds for r in by_mode[mode]])) for mode in MODES
                },
                "seconds": {mode: asdict(Summary.of([r.seconds for r in by_mode[mode]])) for mode in MODES},
                "first_token_afresh_over_kept": asdict(Summary.of(first_ratio)),
                "turn_afresh_over_kept": asdict(Summary.of(whole_ratio)),
                "same_tokens": all(a.tokens == k.tokens for a, k in zip(afresh, kept, strict=True)),
                "answer_tokens": Summary.of([len(r.tokens) for r in kept]).median,
            }
        )
    return {"settings": asdict(settings), "machine": machine, "turns": turns}


def render_markdown(report: dict[str, Any], command: str) -> str:
    settings, machine = report["settings"], report["machine"]
    lines = [
        f"## python -m bench chat, {machine['date']}",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']:.0f} GB RAM; OpenVINO "
        f"{machine['openvino']}. Two stage-0 chat agents on core {settings['head_core']} (one keeping a finished "
        f"answer's session, `--chat-keep`, the other not, `--chat-keep 0`), the other stages' agents on "
        f"{cores_text(settings['agent_cores'], settings['stages'] - 1)}; every agent `--threads 1`.",
        "",
        f"Method: {settings['model']} in {settings['stages']} stages; a conversation of {len(settings['turns'])} "
        f"user turns, each sent with every turn and answer before it (greedy, at most {settings['tokens']} tokens "
        f"an answer, ending at a stop token); {settings['runs']} timed conversations with each agent after an "
        "untimed one, the two agents alternating in rotated order (a conversation's first turn does not "
        "continue the last one's, so it starts afresh with both). "
        f"Stages compute in precision `{settings['precision']}`. Times are the client's "
        "(`agent.chat_client.client.ask`): first token = request to first token, the prompt's "
        "step included; turn = request to the end of the answer. Paired: median of the per-round ratios.",
        "",
        "| turn | prompt tokens | kept from the last turn | first token, kept (s) | first token, afresh (s) "
        "| afresh / kept, paired (min-max) | turn, kept (s) | turn, afresh (s) | afresh / kept, paired | answer "
        "tokens | same tokens |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for turn in report["turns"]:
        first, whole = turn["first_token_seconds"], turn["seconds"]
        ratio, turn_ratio = turn["first_token_afresh_over_kept"], turn["turn_afresh_over_kept"]
        lines.append(
            f"| {turn['turn']} | {turn['prompt_tokens']:.0f} | {turn['cached_tokens']['kept']:.0f} "
            f"| {first['kept']['median']:.3f} | {first['afresh']['median']:.3f} "
            f"| {ratio['median']:.2f}× ({ratio['min']:.2f}-{ratio['max']:.2f}) "
            f"| {whole['kept']['median']:.2f} | {whole['afresh']['median']:.2f} | {turn_ratio['median']:.2f}× "
            f"| {turn['answer_tokens']:.0f} | {'yes' if turn['same_tokens'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n\n"


def run_bench_chat(args: argparse.Namespace, cache_dir: Path) -> int:
    """Prepare (or reuse) the export, bring the ring and both chat agents up, hold the conversations, report."""
    settings = ChatBenchSettings.from_args(args)
    work = cache_dir / "bench" / slug(settings.model)
    work.mkdir(parents=True, exist_ok=True)
    _progress(f"{settings.model}: shoal export (int4, {settings.stages} stages)")
    export = shoal_export(settings.model, settings.stages, work / f"shoal-{settings.stages}stage", cache_dir).path
    fleet_dir, log_dir = bench_dirs(cache_dir, "chat-logs")
    _progress(f"logs in {log_dir}")
    machine = describe_machine(settings.head_core)
    ring = ChatRing(settings, export, cache_dir, log_dir)
    try:
        ring.start(fleet_dir)
        results = asyncio.run(_measure(ring, settings))
    finally:
        ring.stop()
    report = build_report(results, settings, machine)
    publish(args, report, render_markdown(report, command_line()), log_dir)
    return 0
