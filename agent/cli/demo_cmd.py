"""``shoal demo``: the built-in default fleet on this one PC.

Exports SmolLM2-135M-Instruct into stage shards (once; reused afterwards), creates a demo fleet
CA and node certificates, starts one ``shoal agent`` per stage on loopback, and asks the agent of
stage 0 (the PC the user sits at) for an answer: it heads the conversation, computing stage 0
in-process and driving the ring with speculative decoding, as ``shoal ask`` would. Then it shows
every stage's status and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.chat.endpoint import ChatEndpoint
from agent.chat.protocol import ChatRequest
from agent.cli.ask_cmd import answer_summary, stream_chat
from agent.cli.common import exit_on_sigterm
from agent.fleet import FleetPaths, init_fleet, issue_node
from agent.node.launcher import launch_ring

# Greedy SmolLM2-135M loops on some prompts (the one before this, on a one-thread Xeon with AMX, repeated
# a made-up name to the token limit); this one ends in a sentence there.
DEFAULT_PROMPT = "What are the benefits of running a language model on computers you already own? Answer briefly."


def run_demo(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    from shards.export.exporter import ExportRequest, export

    with exit_on_sigterm():
        export(ExportRequest(source=args.model, out_dir=args.out, stages=args.stages), cache_dir)
    fleet_dir = data_dir / "demo-fleet"
    if not FleetPaths(fleet_dir).ca_cert.exists():
        init_fleet(fleet_dir, name="shoal-demo")
    identities = [_identity(fleet_dir, f"demo-stage{i}") for i in range(args.stages)]
    head = _identity(fleet_dir, "demo-head")
    print(f"starting {args.stages} agents on loopback (mutual TLS, fleet {fleet_dir}) ...", file=sys.stderr)
    chat_file = data_dir / "demo-chat.json"
    agents = launch_ring(
        args.out, identities, cache_dir, extra_args=["--threads", "1", "--no-verify"], chat_file=chat_file
    )
    try:
        for agent in agents:
            print(
                f"  stage {agent.stage}: agent pid {agent.process.pid} on {agent.address[0]}:{agent.address[1]}",
                file=sys.stderr,
            )
        endpoint = ChatEndpoint.load(chat_file)
        print(f"asking the agent of stage 0 (chat endpoint {endpoint.host}:{endpoint.port}) ...", file=sys.stderr)
        request = ChatRequest(token=endpoint.token, messages=(("user", args.prompt),), max_tokens=args.max_tokens)
        done = asyncio.run(stream_chat(endpoint, request))
        print(f"[{answer_summary(done)} (n-gram drafts), through {len(agents)} agents]", file=sys.stderr)
        asyncio.run(_show_status([a.address for a in agents], head))
    finally:
        for agent in agents:
            agent.stop()
    return 0


def _identity(fleet_dir: Path, node: str) -> Path:
    folder = FleetPaths(fleet_dir).node_dir(node)
    if not (folder / "cert.pem").exists():
        issue_node(fleet_dir, node)
    return folder


async def _show_status(addresses: list[tuple[str, int]], identity_dir: Path) -> None:
    from agent.cli.status_cmd import fetch_status
    from agent.fleet import NodeIdentity

    identity = NodeIdentity.load(identity_dir)
    for address in addresses:
        s = await fetch_status(address, identity)
        layers = s["layers"]
        chat = s.get("chat")
        own = (
            f"; for its own chats {chat['local_steps']} steps, {chat['local_compute_seconds']:.2f} s, "  # type: ignore[index]
            f"{chat['kept']} kept for the conversation's next turn"  # type: ignore[index]
            if isinstance(chat, dict)
            else ""
        )
        parked_value = s.get("parked", 0)
        open_, parked = len(s["sessions"]), parked_value if isinstance(parked_value, int) else 0  # type: ignore[arg-type]
        held = f"{open_} session{'s' if open_ != 1 else ''} open" + (f" ({parked} parked)" if parked else "")
        print(
            f"  {s['node']}: layers {layers[0]}-{layers[1] - 1}, {s['steps_served']} steps, "  # type: ignore[index]
            f"{s['compute_seconds']:.2f} s computing{own}, {held}",
            file=sys.stderr,
        )
