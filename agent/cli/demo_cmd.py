"""``shoal demo``: the built-in default fleet on this one PC, a fleet that forms itself.

Exports SmolLM2-135M-Instruct into stage shards (once; reused afterwards) and creates a demo fleet CA and
node certificates. Then it starts one ``shoal agent`` per stage on loopback with nothing but its identity
(the first agent is the others' seed: loopback carries no multicast, and the demo must not multicast onto a
real network), and names the export as the fleet's model (``shoal fleet serve``). The agents do the rest:
the coordinator plans, each agent checks and compiles the stage the plan gives it and links to the next,
and once every stage is ready the first agent (the PC the user sits at) heads the conversations through
the plan's ring, with speculative decoding. In a terminal the TUI (``shoal chat``) opens on that agent, and
quitting it (ctrl+q) stops every agent the demo started; with ``--headless`` (or without a terminal) one
answer is printed, as ``shoal ask`` would, then the plan, and the demo stops.

The agents keep the fleet document in their identity folders and OpenVINO keeps the compiled stages in its
cache, so a second run forms the ring in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.cli.ask_cmd import answer_summary, stream_chat
from agent.cli.common import Subcommands, exit_on_sigterm
from agent.cli.export_cmd import export_unless_current
from agent.cli.plan_cmd import print_plan
from agent.errors import RingError
from agent.fleet import FleetPaths, NodeIdentity, init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_fleet

# Greedy SmolLM2-135M loops on some prompts (the one before this, on a one-thread Xeon with AMX, repeated
# a made-up name to the token limit); this one ends in a sentence there.
DEFAULT_PROMPT = "What are the benefits of running a language model on computers you already own? Answer briefly."
FORM_TIMEOUT = 300.0
"""Seconds the demo waits for the ring to form (a first run compiles every stage on this PC's cores)."""


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal demo``."""
    p = sub.add_parser("demo", help="the built-in demo: SmolLM2 in stage shards, a local fleet of agents, the TUI")
    p.add_argument("--model", default="smollm2", help="SOURCE to export (default smollm2)")
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("exports/smollm2-3stage"), help="export folder (reused)")
    p.add_argument("--prompt", default=None, help="with --headless: the question (default: the demo's own)")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--headless", action="store_true", help="one answer on stdout and exit, instead of the TUI")


def run_demo(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    from shards.export.request import ExportRequest

    with exit_on_sigterm():
        export_unless_current(ExportRequest(source=args.model, out_dir=args.out, stages=args.stages), cache_dir)
    fleet_dir = data_dir / "demo-fleet"
    if not FleetPaths(fleet_dir).ca_cert.exists():
        init_fleet(fleet_dir, name="shoal-demo")
    identities = [_identity(fleet_dir, f"demo-pc{i + 1}") for i in range(args.stages)]
    admin = NodeIdentity.load(_identity(fleet_dir, "demo-admin"))
    print(f"starting {args.stages} agents on loopback (mutual TLS, fleet {fleet_dir}) ...", file=sys.stderr)
    chat_file = data_dir / "demo-chat.json"
    started = time.monotonic()
    agents = launch_fleet(identities, cache_dir, extra_args=["--threads", "1"], chat_file=chat_file)
    try:
        for agent in agents:
            print(f"  agent pid {agent.process.pid} on {agent.address[0]}:{agent.address[1]}", file=sys.stderr)
        asyncio.run(serve_export(fleet_dir, Path(args.out), agents[0], admin))
        plan = asyncio.run(wait_for_ring(agents, admin, started))
        if not args.headless and sys.stdin.isatty() and sys.stdout.isatty():
            from agent.cli.chat_cmd import open_chat

            # the TUI heads the chats of the first agent, the PC the user sits at; quitting it ends the demo
            return open_chat(chat_file, str(identities[0]), data_dir, data_dir / "demo-conversations.sqlite", fleet_dir)
        endpoint = ChatEndpoint.load(chat_file)
        print(f"asking the first agent (chat endpoint {endpoint.host}:{endpoint.port}) ...", file=sys.stderr)
        request = ChatRequest(token=endpoint.token, messages=(("user", args.prompt),), max_tokens=args.max_tokens)
        done = asyncio.run(stream_chat(endpoint, request))
        print(f"[{answer_summary(done)} (n-gram drafts), through {len(agents)} agents]", file=sys.stderr)
        print_plan(plan)
    finally:
        for agent in agents:
            agent.stop()
    return 0


def _identity(fleet_dir: Path, node: str) -> Path:
    folder = FleetPaths(fleet_dir).node_dir(node)
    if not (folder / "cert.pem").exists():
        issue_node(fleet_dir, node, force=True)  # the demo's own fleet: a lost identity folder is renewed
    return folder


async def serve_export(fleet_dir: Path, export_dir: Path, first: LocalAgent, admin: NodeIdentity) -> None:
    """Name the export as the fleet's model (a new fleet document only if it names another), and hand the
    document to the first agent, which gossips it to the others."""
    from discovery import control
    from discovery.admin import current_fleet_document, edit_fleet_document, push_document
    from discovery.fleet_document import ModelSource, serving

    model = ModelSource(export_dir=str(export_dir.resolve()))
    document = current_fleet_document(fleet_dir)
    if document.model != model:
        document, _ = edit_fleet_document(fleet_dir, lambda doc, now: serving(doc, model, now))
        print(f"fleet document version {document.version}: the fleet serves {model}", file=sys.stderr)
    signed = (fleet_dir / "fleet-document.json").read_bytes()
    await push_document(first.address, admin, control.FleetDocumentOffer(signed))


def forming_line(plan: dict[str, Any]) -> str:
    """The ring's forming in one line: each stage's node and its state, or ``stage 0: uncovered`` while no
    node holds it (the plan's ``stages`` as ``shoal status --json`` shows them)."""

    def told(stage: dict[str, Any]) -> str:
        holder = stage.get("name") or stage.get("node")
        if holder is None:
            return f"stage {stage['stage']}: uncovered"
        return f"stage {stage['stage']} {holder}: {stage.get('state') or 'starting'}"

    return ", ".join(told(s) for s in plan.get("stages", [])) or plan.get("waiting") or "waiting for the plan"


async def wait_for_ring(agents: list[LocalAgent], admin: NodeIdentity, started: float) -> dict[str, Any]:
    """The first agent's plan once its ring is ready, telling each step of the agents on the way."""
    from agent.cli.status_link import StatusLink

    link = await StatusLink.open(agents[0].address, admin)
    told = ""
    try:
        deadline = time.monotonic() + FORM_TIMEOUT
        while time.monotonic() < deadline:
            plan = (await link.get()).get("plan")
            if isinstance(plan, dict):
                line = forming_line(plan)
                if line != told:
                    print(f"  [{time.monotonic() - started:5.1f} s] {line}", file=sys.stderr)
                    told = line
                if plan.get("ready"):
                    print(
                        f"the ring formed {time.monotonic() - started:.1f} s after the agents started", file=sys.stderr
                    )
                    return plan
            for agent in agents:
                if agent.process.poll() is not None:
                    raise RingError(f"an agent stopped (exit {agent.process.returncode}):\n{agent.log_text()[-3000:]}")
            await asyncio.sleep(0.25)
    finally:
        await link.close()
    raise RingError(f"the ring did not form within {FORM_TIMEOUT:.0f} s:\n{agents[0].log_text()[-3000:]}")
