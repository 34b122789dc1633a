"""``shoal status [ADDR ...]``: ask agents what they hold and do (stages, sessions, members, the plan, downloads)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from agent.addresses import parse_address
from agent.cli.common import Subcommands, identity_dir
from agent.cli.plan_cmd import plan_lines
from agent.cli.status_link import fetch_status
from agent.errors import ConfigError
from agent.fleet import NodeIdentity
from agent.node.running import running_agent


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal status``."""
    p = sub.add_parser("status", help="ask agents what they serve, their members, downloads and the plan")
    p.add_argument("address", nargs="*", help="HOST:PORT of an agent (default: the one running on this PC)")
    p.add_argument("--json", action="store_true", help="the whole status document as JSON")
    p.add_argument("--identity", type=Path, default=None, help="this node's identity folder")


def run_status(args: argparse.Namespace, data_dir: Path) -> int:
    identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
    addresses = args.address or ([own] if (own := running_agent(identity.cert.parent)) else [])
    if not addresses:
        raise ConfigError("no agent runs with this identity on this PC: name one as HOST:PORT")
    for text in addresses:
        status = asyncio.run(fetch_status(parse_address(text), identity))
        print(json.dumps(status, indent=1) if args.json else "\n".join(status_lines(text, status)))
    return 0


_EXACTNESS = {
    True: ", exact",
    False: ", not exact with drafts (--threads 1 or --precision f32 makes it so)",
    None: "",
}
"""What a stage's ``exact_speculation`` means for its answers (``agent.runtime.repeatable``)."""


_DONOR_STATES = {
    "draining": "its user is back, it hands its stage over",
    "away": "its user is here",
    "off": "not allowed to serve now",
}


def status_lines(address: str, status: dict[str, Any]) -> list[str]:
    """An agent's status document for people: what it serves, its members, its download and the plan."""
    stages = status.get("stages") or []
    serving = (
        f"serves stage {', '.join(map(str, stages))} (layers {status['layers'][0]}-{status['layers'][1] - 1}) "
        f"on {status.get('device')}, next stage {status.get('next_stage') or 'none: the last'}"
        f"{_EXACTNESS.get(status.get('exact_speculation'), '')}"
        f"{', decodes in ' + '/'.join(status['precision']) if status.get('precision') else ''}"
        if stages
        else "serves no stage"
    )
    lines = [
        f"agent {status.get('node')} at {address}, up {status.get('uptime_s')} s: {serving}",
        f"  sessions {len(status.get('sessions') or [])} of {status.get('max_sessions')} "
        f"(parked {status.get('parked')}, evicted {status.get('evicted')}), steps served {status.get('steps_served')}"
        f"{_packs(status.get('packs'), status.get('packed_steps'))}{_kv_pools(status.get('kv_blocks'))}",
    ]
    members = status.get("members")
    if isinstance(members, dict):
        counts = Counter(str(m.get("state")) for m in members.get("members", []))
        seen = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none yet"
        lines.append(f"  fleet {members.get('fleet')}: other members: {seen}")
        for member in members.get("members", []):
            # a peer that cannot link says why (a clock set days wrong: the sentence its own PC shows too)
            if member.get("state") in ("unverified", "lost") and member.get("why"):
                lines.append(f"  {member.get('name')} is {member.get('state')}: {member['why']}")
            donor = (member.get("announces") or {}).get("donor")
            if donor not in (None, "serving"):
                lines.append(f"  {member.get('name')} is {donor} (its owner's PC: {_DONOR_STATES.get(donor, donor)})")
    donor = status.get("donor")
    if isinstance(donor, dict) and donor.get("state"):
        source = donor.get("idle_source") or f"no idle source ({donor.get('idle_problem')})"
        lines.append(
            f"  donor: {donor['state']} for {donor.get('for_seconds')} s: {donor.get('reason')} (idle source: {source})"
        )
    ring = status.get("ring")
    if isinstance(ring, dict):
        lines.append(f"  {ring.get('activity')}" + (f" (error: {ring['error']})" if ring.get("error") else ""))
        if download := ring.get("download"):
            lines.append(f"  downloading {download['what']}: {_bytes_done(download['done'], download['total'])}")
    chat = status.get("chat")
    if isinstance(chat, dict):
        inexact = f" ({chat['inexact']} not exact)" if chat.get("inexact") else ""
        context = f", context {chat['context_tokens']:,} tokens" if chat.get("context_tokens") else ""
        lines.append(
            f"  chats at {chat.get('endpoint')}: {chat.get('answered')} answered{inexact}, "
            f"{chat.get('running')} running{context}"
            f"{_packs(chat.get('local_packs'), chat.get('local_packed_steps'), ' on its own stages')}"
        )
        for done, total in chat.get("prompts_in", []):
            lines.append(f"  a prompt going in: {done:,} of {total:,} positions")
    plan = status.get("plan")
    if isinstance(plan, dict):
        lines.extend("  " + line for line in plan_lines(plan))
    return lines


def _packs(packs: Any, steps: Any, where: str = "") -> str:
    """How many packed inferences computed how many steps (issue 45), where any were made."""
    if not packs:
        return ""
    return f", {steps} steps in {packs} packs{where} ({steps / packs:.2f} a pack)"


def _kv_pools(pools: Any) -> str:
    """The KV block pools of the stages that keep their sessions' KV paged: blocks in use of all."""
    held = [f"{used}/{total}" for used, total in (p for p in pools or () if p)]
    return f", KV blocks in use {', '.join(held)}" if held else ""


def _bytes_done(done: int, total: int) -> str:
    mib = 1024 * 1024
    percent = f" ({done * 100 // total} %)" if total > 0 else ""
    return f"{done / mib:.1f} of {total / mib:.1f} MiB{percent}"
