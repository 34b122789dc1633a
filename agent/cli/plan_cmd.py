"""``shoal fleet serve``, ``shoal pin``, ``shoal unpin``, ``shoal pins``: the admin's decisions in the fleet document.

Each command writes the next version of the fleet folder's document (signed with the CA key: run it where
``shoal fleet init`` was), pushes it to running agents (``--push``; by default the agent of this PC), which
gossip it to every member, and prints the plan it leads to, as the pushed agent reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.addresses import parse_address
from agent.cli.common import Subcommands, identity_dir
from agent.cli.status_link import fetch_status
from agent.errors import FleetError, PeerUnavailableError, RingError
from agent.fleet import NodeIdentity
from agent.node.running import running_agent
from discovery import control
from discovery.admin import current_fleet_document, edit_fleet_document, pin_node, push_document
from discovery.fleet_document import FleetDocument, ModelSource, Pin, serving, without_pin

_COMMIT = re.compile(r"[0-9a-f]{40}")
PLAN_WAIT = 20.0
"""Seconds to wait for the pushed agent to report a plan for the new version."""


def add_parser(sub: Subcommands, fleet: Subcommands) -> None:
    """Add ``fleet serve`` to the ``fleet`` subcommands and ``pin``, ``unpin``, ``pins`` to the top level."""
    f = fleet.add_parser("serve", help="the model the fleet serves: REPO_ID[@REVISION] on the Hub, or EXPORT_DIR")
    f.add_argument("source", help="a Hub repo id (pinned to a commit; a branch is resolved now), or an export folder")
    f.add_argument("--endpoint", default=None, help="the Hub or mirror that resolves a branch (default: HF_ENDPOINT)")
    _common(f)
    p = sub.add_parser("pin", help="pin a stage to a node (required; --prefer: preferred)")
    p.add_argument("node", help="node name or node id")
    p.add_argument("stage", type=int)
    p.add_argument("--prefer", action="store_true", help="honoured when the node can hold it, else placed as usual")
    _common(p)
    p = sub.add_parser("unpin", help="remove a node's pin")
    p.add_argument("node", help="node name or node id, as pinned")
    _common(p)
    p = sub.add_parser("pins", help="the pins, and whether the plan honours each")
    p.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    p.add_argument(
        "--agent", default=None, metavar="HOST:PORT", help="the agent whose plan to show (default: this PC's)"
    )
    p.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach the agent)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    p.add_argument(
        "--push",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="hand the new version to this running agent (repeatable; default: this PC's agent)",
    )
    p.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach the agents)")


def run_plan_command(args: argparse.Namespace, data_dir: Path) -> int:
    """Run ``fleet serve``, ``pin``, ``unpin`` or ``pins``."""
    fleet_dir: Path = args.dir if args.dir is not None else data_dir / "fleet"
    command = args.command if args.command != "fleet" else "serve"
    if command == "pins":
        document = current_fleet_document(fleet_dir)
        _print_pins(document)
        return _show_plan(args, data_dir, [args.agent] if args.agent else [], document.version, wait=0.0)
    change: Callable[[FleetDocument, Any], FleetDocument]
    if command == "pin":
        document, signed = pin_node(fleet_dir, Pin(args.node, args.stage, required=not args.prefer))
    else:
        if command == "serve":
            model = _model_source(args.source, args.endpoint)
            change = lambda doc, now: serving(doc, model, now)  # noqa: E731
        else:
            change = lambda doc, now: without_pin(doc, args.node, now)  # noqa: E731
        document, signed = edit_fleet_document(fleet_dir, change)
    print(f"fleet document version {document.version}: model {document.model or 'none'}; pins: {_pins(document)}")
    return _show_plan(args, data_dir, args.push, document.version, signed=signed)


def _model_source(text: str, endpoint: str | None) -> ModelSource:
    folder = Path(text)
    if folder.is_dir():
        return ModelSource(export_dir=str(folder.resolve()))
    repo_id, _, revision = text.partition("@")
    if not _COMMIT.fullmatch(revision):
        revision = _resolve_revision(repo_id, revision or "main", endpoint)
    return ModelSource(repo_id=repo_id, revision=revision)


def _resolve_revision(repo_id: str, revision: str, endpoint: str | None) -> str:
    """The commit a branch or tag names now (the fleet document pins a commit: a branch can move)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        sha = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision).sha
    except (HfHubHTTPError, OSError) as exc:
        raise FleetError(f"cannot resolve {repo_id}@{revision} to a commit: {exc}") from exc
    if sha is None:
        raise FleetError(f"the Hub gave no commit for {repo_id}@{revision}")
    print(f"{repo_id}@{revision} is commit {sha}", file=sys.stderr)
    return sha


def _pins(document: FleetDocument) -> str:
    return (
        ", ".join(f"{p.node} -> stage {p.stage} ({'required' if p.required else 'preferred'})" for p in document.pins)
        or "none"
    )


def _print_pins(document: FleetDocument) -> None:
    print(f"fleet document version {document.version}, model {document.model or 'none'}")
    for pin in document.pins:
        print(f"  {pin.node:<20} stage {pin.stage:<3} {'required' if pin.required else 'preferred'}")
    if not document.pins:
        print("  no pins")


def _show_plan(
    args: argparse.Namespace,
    data_dir: Path,
    addresses: list[str],
    version: int,
    *,
    signed: bytes | None = None,
    wait: float = PLAN_WAIT,
) -> int:
    identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
    targets = addresses or ([own] if (own := running_agent(identity.cert.parent)) else [])
    if not targets:
        if signed is not None:
            print("no agent runs on this PC: pass --push HOST:PORT to hand the new version to one")
        return 0
    status: dict[str, Any] | None = None
    for text in targets:
        address = parse_address(text)
        if signed is not None:
            try:
                detail = asyncio.run(push_document(address, identity, control.FleetDocumentOffer(signed)))
            except PeerUnavailableError as exc:
                print(f"cannot reach {text}: {exc}", file=sys.stderr)
                continue
            print(f"pushed to {text}: {detail}")
        if status is None:
            status = _plan_status(address, identity, version, wait)
    if status is not None:
        print_plan(status)
    return 0


def _plan_status(address: tuple[str, int], identity: NodeIdentity, version: int, wait: float) -> dict[str, Any]:
    """The agent's ``plan`` status, once it reports a plan for fleet document ``version`` (or after ``wait``)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            plan = dict(asyncio.run(fetch_status(address, identity))).get("plan")
        except RingError as exc:
            raise FleetError(f"cannot read the plan of {address[0]}:{address[1]}: {exc}") from exc
        if not isinstance(plan, dict):
            raise FleetError(f"{address[0]}:{address[1]} follows no fleet plan (an agent wired by hand?)")
        if plan.get("planned_for") == version or time.monotonic() >= deadline:
            return plan
        time.sleep(0.5)


def print_plan(plan: dict[str, Any]) -> None:
    """The plan as ``shoal status`` reports it, for people: stage -> node, state, standbys, pins."""
    print("\n".join(plan_lines(plan)))


def plan_lines(plan: dict[str, Any]) -> list[str]:
    """The lines of :func:`print_plan`."""
    lines = [
        f"plan {str(plan.get('hash'))[:12]} epoch {plan.get('epoch')} for document {plan.get('planned_for')} "
        f"(planned by {plan.get('planned_by')}): {'ready' if plan.get('ready') else plan.get('waiting') or ''}"
    ]
    if plan.get("context_tokens"):
        lines.append(
            f"  model {plan.get('model')}, export {plan.get('export')}: context {plan['context_tokens']:,} tokens"
        )
    for stage in plan.get("stages", []):
        standbys = ", ".join(f"{s['name']} ({_held_text(s)})" for s in stage["standbys"]) or "none"
        lines.append(
            f"  stage {stage['stage']}: {stage['name'] or 'uncovered':<16} {_held_text(stage):<16} "
            f"standbys: {standbys}; {stage['reason']}"
        )
    for pin in plan.get("pins", []):
        mark = "honoured" if pin["honoured"] else "NOT honoured"
        lines.append(f"  pin {pin['node']} -> stage {pin['stage']}: {mark}: {pin['reason']}")
    return lines


def _held_text(held: dict[str, Any]) -> str:
    """``downloading 42 %``, ``ready``, ``starting`` (nothing announced yet) of a stage's status entry."""
    state = held.get("state") or "starting"
    return state if held.get("progress") is None else f"{state} {held['progress']} %"
