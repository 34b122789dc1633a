"""``python -m bench tui``: what the TUI costs an answer (issue 25's benchmark).

The demo's fleet (SmolLM2-135M int4 in 3 stages, one agent per stage on this PC, one thread each) answers
the same greedy question through ``shoal ask``'s client and through the TUI (``ChatApp`` under Textual's
Pilot, headless, in this process). Reported, side by side:

- tokens/s as the client sees them (tokens after the first over the time from the first to the last), and
  the TUI's over ``shoal ask``'s: goal >= 0.98 (the TUI must not slow the answer);
- while a long answer streams, how long a key press takes to reach the prompt (from the key queued on the
  app's loop to the prompt holding it): goal < 50 ms;
- the CPU time of this process (the TUI, its Textual loop and the Pilot) per 1,000 streamed tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.errors import BenchError
from agent.fleet import NodeIdentity

if TYPE_CHECKING:
    from tui.app import ChatApp

QUESTION = "Write a long story about a lighthouse keeper, a storm and a lost ship."
KEY_GOAL_MS = 50.0
RATE_GOAL = 0.98
ANSWER_TIMEOUT = 300.0
"""Seconds one answer through the TUI may take before the bench gives up with an error."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="answers through each client (median reported)")
    parser.add_argument("--tokens", type=int, default=300, help="max tokens of each answer")
    parser.add_argument("--keys", type=int, default=20, help="key presses timed while an answer streams")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_tui_bench(args: argparse.Namespace, cache_dir: Path) -> int:
    """Start the demo's fleet, measure, print the table (or JSON), stop the fleet."""
    from agent.cli.demo_cmd import serve_export, wait_for_ring
    from agent.fleet import init_fleet, issue_node
    from agent.node.launcher import launch_fleet
    from shards.export.exporter import ExportRequest, export

    folder = cache_dir / "bench" / "smollm2-3stage"
    export(ExportRequest(source="smollm2", out_dir=folder, stages=3), cache_dir)
    with tempfile.TemporaryDirectory(prefix="shoal-tui-bench-") as scratch:
        root = Path(scratch)
        init_fleet(root / "fleet", name="tui-bench")
        pcs = [issue_node(root / "fleet", f"pc{i}") for i in (1, 2, 3)]
        identities = [pc.cert.parent for pc in pcs]
        admin = issue_node(root / "fleet", "admin")
        chat_file = root / "chat.json"
        agents = launch_fleet(identities, cache_dir, extra_args=["--threads", "1"], chat_file=chat_file)
        try:
            asyncio.run(serve_export(root / "fleet", folder, agents[0], admin))
            asyncio.run(wait_for_ring(agents, admin, time.monotonic()))
            report = asyncio.run(_measure(chat_file, root, agents[0].address, pcs[0], args))
        finally:
            for agent in agents:
                agent.stop()
    report["machine"] = _machine()
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(report))
    return 0


async def _measure(
    chat_file: Path, root: Path, head: tuple[str, int], identity: NodeIdentity, args: argparse.Namespace
) -> dict[str, Any]:
    endpoint = ChatEndpoint.load(chat_file)
    await _ask_rate(endpoint, args.tokens)  # untimed: the agents' first inferences
    ask_rates, tui_rates, cpu_per_1000, tokens_seen = [], [], [], []
    keys_ms: list[float] = []
    for run in range(args.runs):
        rate, tokens = await _ask_rate(endpoint, args.tokens)
        ask_rates.append(rate)
        rate, tokens, cpu, keys = await _tui_rate(
            chat_file, root / f"run{run}.sqlite", head, identity, args.tokens, args.keys
        )
        tui_rates.append(rate)
        tokens_seen.append(tokens)
        cpu_per_1000.append(1000 * cpu / max(tokens, 1))
        keys_ms.extend(keys)
    ask_rate, tui_rate = statistics.median(ask_rates), statistics.median(tui_rates)
    return {
        "runs": args.runs,
        "tokens_per_answer": statistics.median(tokens_seen),
        "ask_tok_s": round(ask_rate, 2),
        "tui_tok_s": round(tui_rate, 2),
        "tui_over_ask": round(tui_rate / ask_rate, 3),
        "key_ms_median": round(statistics.median(keys_ms), 1),
        "key_ms_max": round(max(keys_ms), 1),
        "cpu_s_per_1000_tokens": round(statistics.median(cpu_per_1000), 2),
        "all": {"ask": ask_rates, "tui": tui_rates, "keys_ms": keys_ms},
    }


def _rate(stamps: list[float]) -> float:
    """Tokens after the first over the seconds from the first to the last, as a client sees them."""
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        return 0.0
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


async def _ask_rate(endpoint: ChatEndpoint, tokens: int) -> tuple[float, int]:
    request = ChatRequest(token=endpoint.token, messages=(("user", QUESTION),), max_tokens=tokens)
    stamps = [time.perf_counter() async for event in ask(endpoint, request) if event.event == "token"]
    return _rate(stamps), len(stamps)


async def _tui_rate(
    chat_file: Path, store_file: Path, head: tuple[str, int], identity: NodeIdentity, tokens: int, keys: int
) -> tuple[float, int, float, list[float]]:
    """One answer through the TUI (polling the head's status as it does for a user): its client-side rate,
    tokens, this process's CPU seconds while it streamed, and the milliseconds each of ``keys`` presses took
    to reach the prompt meanwhile."""
    from agent.cli.status_link import StatusLink
    from tui import app as tui_app
    from tui.app import ChatApp
    from tui.events import AnswerToken
    from tui.generation import GenerationSettings
    from tui.sources import EndpointChatSource, LinkStatusSource
    from tui.store import ConversationStore

    async def connect() -> StatusLink:
        return await StatusLink.open(head, identity, timeout=3.0)

    stamps: list[float] = []
    pressed: list[float] = []

    class StampedApp(ChatApp):
        """The app, noting when each token's message is handled on its loop (shown, not only read)."""

        CSS_PATH = str(Path(tui_app.__file__).with_name("app.tcss"))  # a subclass's path is its own module's

        async def on_answer_token(self, message: AnswerToken) -> None:
            await super().on_answer_token(message)
            stamps.append(time.perf_counter())

    app = StampedApp(EndpointChatSource(chat_file), LinkStatusSource(connect), ConversationStore(store_file))
    deadline = time.monotonic() + ANSWER_TIMEOUT
    async with app.run_test(size=(120, 40)) as pilot:
        app.settings = GenerationSettings(max_tokens=tokens)
        app.prompt.text = QUESTION
        cpu = time.process_time()
        await pilot.press("enter")
        while not stamps:
            _before(deadline, "the TUI's first token")
            await asyncio.sleep(0.01)
        for index in range(keys):
            if not app.streaming:
                break
            letter = "abcdefghijklmnopqrstuvwxyz"[index % 26]
            pressed.append(1000 * await key_to_prompt(app, letter, deadline - time.monotonic()))
            await asyncio.sleep(0.2)
        while app.streaming:
            _before(deadline, "the TUI's answer to end")
            await asyncio.sleep(0.01)
        cpu = time.process_time() - cpu
    return _rate(stamps), len(stamps), cpu, pressed


async def key_to_prompt(app: ChatApp, letter: str, timeout: float) -> float:
    """Seconds from ``letter`` queued on the app's loop, as a terminal's key arrives, to the prompt ending
    with it. (``Pilot.press`` times something else: after each key it waits up to a second, twice, for this
    process to look idle, which it never does while an answer streams or a ring is replayed.)"""
    before = time.perf_counter()
    app.simulate_key(letter)
    while not app.prompt.text.endswith(letter):
        if time.perf_counter() - before > timeout:
            raise BenchError(f"a key press did not reach the prompt within {timeout:.0f} s")
        await asyncio.sleep(0.001)
    return time.perf_counter() - before


def _before(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise BenchError(f"timed out after {ANSWER_TIMEOUT:.0f} s waiting for {what}")


def _machine() -> str:
    import os
    import platform

    return f"{platform.node()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"


def _table(report: dict[str, Any]) -> str:
    rate_ok = "pass" if report["tui_over_ask"] >= RATE_GOAL else "FAIL"
    key_ok = "pass" if report["key_ms_max"] < KEY_GOAL_MS else "FAIL"
    return "\n".join(
        [
            f"TUI vs shoal ask, {report['runs']} answers each of ~{report['tokens_per_answer']:.0f} tokens "
            f"({report['machine']}, {report['date']})",
            "",
            "| measure | value | goal | result |",
            "|---|---:|---|---|",
            f"| shoal ask, tokens/s (client side) | {report['ask_tok_s']} | | |",
            f"| TUI, tokens/s (client side) | {report['tui_tok_s']} | | |",
            f"| TUI / shoal ask | {report['tui_over_ask']}x | >= {RATE_GOAL}x | {rate_ok} |",
            f"| key press to prompt while streaming, median / max | {report['key_ms_median']} / "
            f"{report['key_ms_max']} ms | < {KEY_GOAL_MS:.0f} ms | {key_ok} |",
            f"| CPU of the TUI process per 1,000 tokens | {report['cpu_s_per_1000_tokens']} s | | |",
        ]
    )
