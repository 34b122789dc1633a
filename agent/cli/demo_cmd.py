"""``shoal demo``: the built-in default fleet on this one PC.

Exports SmolLM2-135M-Instruct into stage shards (once; reused afterwards), creates a demo fleet
CA and node certificates, starts one ``shoal agent`` per stage on loopback, and answers a chat
prompt through the ring with speculative decoding, then shows every stage's status and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.cli.generate_cmd import HeadOptions, stream_answer
from agent.fleet import FleetPaths, init_fleet, issue_node
from agent.head.sampling import SamplingParams
from agent.node.launcher import launch_ring
from agent.runtime import RuntimeConfig

# Greedy SmolLM2-135M loops on some prompts (the one before this, on a one-thread Xeon with AMX, repeated
# a made-up name to the token limit); this one ends in a sentence there.
DEFAULT_PROMPT = "What are the benefits of running a language model on computers you already own? Answer briefly."


def run_demo(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    from shards.export.exporter import ExportRequest, export

    export(ExportRequest(source=args.model, out_dir=args.out, stages=args.stages), cache_dir)
    fleet_dir = data_dir / "demo-fleet"
    if not FleetPaths(fleet_dir).ca_cert.exists():
        init_fleet(fleet_dir, name="shoal-demo")
    identities = [_identity(fleet_dir, f"demo-stage{i}") for i in range(args.stages)]
    head = _identity(fleet_dir, "demo-head")
    print(f"starting {args.stages} agents on loopback (mutual TLS, fleet {fleet_dir}) ...", file=sys.stderr)
    agents = launch_ring(args.out, identities, cache_dir, extra_args=["--threads", "1", "--no-verify"])
    try:
        for agent in agents:
            print(f"  stage {agent.stage}: agent pid {agent.process.pid} on {agent.address[0]}:{agent.address[1]}",
                  file=sys.stderr)
        options = HeadOptions(drafter="ngram", ring=(agents[0].address, agents[-1].address), identity_dir=head)
        config = RuntimeConfig(cache_dir=cache_dir / "ov-cache")
        asyncio.run(stream_answer(args.out, args.prompt, SamplingParams(), config, options, args.max_tokens))
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
        print(f"  {s['node']}: layers {layers[0]}-{layers[1] - 1}, {s['steps_served']} steps, "  # type: ignore[index]
              f"{s['compute_seconds']:.2f} s computing, {len(s['sessions'])} sessions open", file=sys.stderr)  # type: ignore[arg-type]
