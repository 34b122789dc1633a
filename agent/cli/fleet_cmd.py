"""``shoal fleet ...``: the fleet's CA and node certificates, join tokens, enrollment, the node list, revocation."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import ipaddress
import logging
import re
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agent.addresses import format_address, parse_address
from agent.cli.common import Subcommands, identity_dir
from agent.errors import FleetError
from agent.fleet.authority import (
    FleetPaths,
    NodeIdentity,
    cert_fingerprint,
    enrolled_nodes,
    init_fleet,
    issue_node,
    read_certificate,
)
from agent.fleet.enrollment import DEFAULT_PORT, EnrollmentServer, create_token
from agent.fleet.revocation import fleet_revocations
from discovery.admin import Revocation, push_document, revoke

_DURATION_RE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def duration(text: str) -> dt.timedelta:
    """``30m``, ``24h``, ``7d`` (or ``90s``) -> a positive timedelta; :class:`FleetError` otherwise."""
    match = _DURATION_RE.fullmatch(text.strip())
    if not match or int(match[1]) == 0:
        raise FleetError(f"--ttl: expected a duration such as 30m, 24h or 7d, not {text!r}")
    return dt.timedelta(**{_UNITS[match[2]]: int(match[1])})


def add_parser(
    sub: Subcommands,
) -> Subcommands:
    """Register ``shoal fleet init | issue | token | serve-enrollment | list | revoke``; returns the ``fleet``
    subcommands, where ``fleet serve`` joins them (``agent.cli.plan_cmd``)."""
    p = sub.add_parser("fleet", help="the fleet's private CA, node certificates, join tokens and revocations")
    fleet = p.add_subparsers(dest="fleet_command", required=True)
    f = fleet.add_parser("init", help="create the fleet's certificate authority")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--name", default="shoal", help="fleet name written into the CA certificate")
    f.add_argument("--force", action="store_true", help="replace an existing CA (every node must be re-issued)")
    f = fleet.add_parser("issue", help="issue a node certificate signed by the fleet CA")
    f.add_argument("node", help="node name (its certificate's common name)")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--ip", action="append", default=[], help="an IP address of the node (repeatable)")
    f.add_argument("--days", type=int, default=365, help="validity in days")
    f.add_argument("--out", type=Path, default=None, help="identity folder to write (default: <fleet dir>/nodes/NODE)")
    f.add_argument(
        "--force",
        action="store_true",
        help="issue it even if a node of that name is enrolled and not revoked (a renewal); pins then need node ids",
    )
    f = fleet.add_parser(
        "token",
        help="make a one-time join token and print the `shoal join` command for a new PC",
        description="Make a join token. The new PC joins while `shoal fleet serve-enrollment` runs on this PC "
        "(where the fleet CA key is) at the printed address.",
    )
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--ttl", default="24h", help="lifetime: 30m, 24h, 7d (default 24h)")
    f.add_argument("--uses", type=int, default=1, help="how many PCs may join with it (default 1)")
    f.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help="where serve-enrollment listens, for the printed command (default: this PC's first IPv4 address, "
        "port 7300)",
    )
    f = fleet.add_parser("serve-enrollment", help="let PCs with a join token enroll (runs until Ctrl-C)")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--listen", default="0.0.0.0:7300", metavar="HOST:PORT", help="address (default 0.0.0.0:7300)")
    f = fleet.add_parser("list", help="the enrolled nodes, and which are revoked")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument(
        "--agent", default=None, metavar="HOST:PORT", help="add each node's state and last heard, as this agent sees it"
    )
    f.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach --agent)")
    f = fleet.add_parser("revoke", help="revoke a node's certificates (writes the signed revocation list)")
    f.add_argument("node", help="node name or node id")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument(
        "--push",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="hand the new list to this running agent (repeatable); it gossips it to every member",
    )
    f.add_argument(
        "--drop-pins",
        action="store_true",
        help="also remove the pins that name only the revoked node from the fleet document (the plan ignores them)",
    )
    f.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach --push)")
    return fleet


def run_fleet(args: argparse.Namespace, data_dir: Path) -> int:
    """Run ``shoal fleet <command>``; prints what was written or found to stdout."""
    fleet_dir: Path = args.dir if args.dir is not None else data_dir / "fleet"
    command = args.fleet_command
    if command == "init":
        ca_path = init_fleet(fleet_dir, args.name, force=args.force)
        ca = read_certificate(ca_path)
        print(f"fleet CA certificate: {ca_path}")
        print(f"fleet CA key:         {fleet_dir / 'ca.key'} (keep it secret: it admits machines to the fleet)")
        print(f"fleet CA fingerprint: {cert_fingerprint(ca)}")
        print(f"valid until:          {ca.not_valid_after_utc:%Y-%m-%d}")
        return 0
    if command == "issue":
        identity: NodeIdentity = issue_node(
            fleet_dir, args.node, ips=args.ip, days=args.days, out=args.out, force=args.force
        )
        cert = identity.certificate()
        print(f"node certificate:     {identity.cert}")
        print(f"node key:             {identity.key}")
        print(f"fleet CA copy:        {identity.ca}")
        print(f"node fingerprint:     {cert_fingerprint(cert)}")
        print(f"valid until:          {cert.not_valid_after_utc:%Y-%m-%d}")
        return 0
    if command == "token":
        return _token(args, fleet_dir)
    if command == "serve-enrollment":
        return _serve_enrollment(args, fleet_dir)
    if command == "list":
        members: list[Mapping[str, object]] = []
        if args.agent is not None:
            status = _agent_status(args.agent, NodeIdentity.load(identity_dir(args.identity, data_dir)))
            members = list(status.get("members", {}).get("members", []))
        _print_table(node_rows(fleet_dir), members)
        return 0
    if command == "revoke":
        return _revoke(args, fleet_dir, data_dir)
    return 2


def _revoke(args: argparse.Namespace, fleet_dir: Path, data_dir: Path) -> int:
    done = revoke(fleet_dir, args.node, drop_pins=args.drop_pins)
    for node in done.added:
        print(f"revoked {node.name} (node id {node.node_id}, certificate {node.fingerprint[:23]}...)")
    result = done.revocations
    where = FleetPaths(fleet_dir).revocations
    print(f"revocation list version {result.version} ({len(result.revoked)} revoked in all): {where}")
    for line in voided_pin_lines(done):
        print(line)
    if args.push:
        identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
        for address in args.push:
            for message in done.messages:
                detail = asyncio.run(push_document(parse_address(address), identity, message))
                print(f"pushed to {address}: {detail}")
    return 0


def voided_pin_lines(done: Revocation) -> list[str]:
    """What a revocation did to the pins, one line each: dropped (with the new fleet document's version), or
    void, and how to drop them."""
    lines = []
    for pin in done.voided:
        kind = "required" if pin.required else "preferred"
        if done.document is not None:
            version = done.document[0].version
            lines.append(f"dropped the {kind} pin of {pin.node} on stage {pin.stage}: fleet document version {version}")
        else:
            lines.append(
                f"the {kind} pin of {pin.node} on stage {pin.stage} is void: the plan places stage {pin.stage} "
                f"automatically (`--drop-pins` or `shoal unpin {pin.node}` removes the pin)"
            )
    return lines


def _agent_status(address: str, identity: NodeIdentity) -> dict[str, Any]:
    from agent.cli.status_link import fetch_status

    return dict(asyncio.run(fetch_status(parse_address(address), identity)))


def _token(args: argparse.Namespace, fleet_dir: Path) -> int:
    if args.uses < 1:
        raise FleetError(f"--uses must be at least 1, not {args.uses}")
    if args.address is not None:
        address = parse_address(args.address, default_port=DEFAULT_PORT, any_port=False, empty_host=None)
    else:
        address = (local_ipv4() or "127.0.0.1", DEFAULT_PORT)
    ttl = duration(args.ttl)
    token = create_token(fleet_dir, ttl=ttl, uses=args.uses)
    expires = dt.datetime.now(dt.UTC) + ttl
    uses = "once" if args.uses == 1 else f"{args.uses} times"
    where = format_address(address)
    print(f"join token {token.token_id}: valid until {expires:%Y-%m-%d %H:%M} UTC, usable {uses}")
    print("on the new PC, run:")
    print()
    print(f"    shoal join {token}@{where}")
    print()
    print(f"while `shoal fleet serve-enrollment --listen {where}` runs here (where the fleet CA key is).")
    if args.address is None and address[0] == "127.0.0.1":
        print("this PC has no network address but loopback: pass --address HOST:PORT", file=sys.stderr)
    return 0


def local_ipv4() -> str | None:
    """This PC's first IPv4 address that is up and neither loopback nor link-local, if any."""
    import socket

    import psutil

    stats = psutil.net_if_stats()
    for interface, addresses in psutil.net_if_addrs().items():
        if interface in stats and not stats[interface].isup:
            continue
        for entry in addresses:
            if entry.family != socket.AF_INET:
                continue
            ip = ipaddress.IPv4Address(entry.address)
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
                return str(ip)
    return None


def _serve_enrollment(args: argparse.Namespace, fleet_dir: Path) -> int:
    listen = parse_address(args.listen, default_port=DEFAULT_PORT, empty_host=None)
    logger = logging.getLogger("agent.fleet.enrollment")
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # each join and refusal, one line on stderr
    server = EnrollmentServer(fleet_dir, listen)
    asyncio.run(_serve_until_stopped(server))
    status = server.status()
    print(
        f"shoal fleet serve-enrollment: stopped ({status['joins']} joined, {status['refusals']} refused)",
        file=sys.stderr,
    )
    return 0


async def _serve_until_stopped(server: EnrollmentServer) -> None:
    address = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: no signal handlers on the loop; Ctrl-C raises
            loop.add_signal_handler(signum, stop.set)
    print(f"shoal fleet serve-enrollment: ready listen={format_address(address)}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


@dataclass(frozen=True)
class NodeRow:
    """One line of ``shoal fleet list``: an enrolled certificate, and what a running agent knows of it."""

    name: str
    node_id: str
    fingerprint: str
    enrolled_at: dt.datetime
    how: str
    revoked: bool
    state: str | None = None
    last_heard: str | None = None


def node_rows(fleet_dir: Path) -> list[NodeRow]:
    """The enrolled certificates of ``fleet_dir``, oldest first, marked when revoked."""
    enrolled = enrolled_nodes(fleet_dir)
    if not enrolled:
        raise FleetError(
            f"no node is enrolled in {fleet_dir} yet: `shoal fleet token` lets a PC join, "
            "`shoal fleet issue NODE` issues one here"
        )
    revocations = fleet_revocations(fleet_dir)
    return [
        NodeRow(
            e.name,
            e.node_id,
            e.fingerprint,
            e.enrolled_at,
            e.how,
            revocations is not None and revocations.revokes(e.fingerprint),
        )
        for e in enrolled
    ]


def merge_live_state(rows: Sequence[NodeRow], members: Sequence[Mapping[str, object]]) -> list[NodeRow]:
    """The hook for a live column: fill ``state`` and ``last_heard`` from a running agent's status ``members``
    section (dicts with ``node``, a node name or id, ``state`` and ``last_heard``). Fetching that status is
    not done yet; ``shoal fleet list`` passes no members, and the columns appear once one is passed."""
    by_key: dict[str, Mapping[str, object]] = {}
    for member in members:
        node = member.get("node")
        if isinstance(node, str):
            by_key[node] = member
    merged = []
    for row in rows:
        found = by_key.get(row.node_id, by_key.get(row.name))
        if found is None or row.revoked:
            merged.append(row)
            continue
        state, heard = found.get("state"), found.get("last_heard")
        merged.append(
            replace(row, state=None if state is None else str(state), last_heard=None if heard is None else str(heard))
        )
    return merged


def _print_table(rows: Sequence[NodeRow], members: Sequence[Mapping[str, object]] = ()) -> None:
    rows = merge_live_state(rows, members)
    live = any(r.state is not None or r.last_heard is not None for r in rows)
    header = ["NAME", "NODE ID", "FINGERPRINT", "ENROLLED (UTC)", "HOW", "STATUS"]
    if live:
        header += ["STATE", "LAST HEARD"]
    table = [header]
    for r in rows:
        line = [
            r.name,
            r.node_id,
            r.fingerprint.removeprefix("sha256:")[:16],
            f"{r.enrolled_at:%Y-%m-%d %H:%M}",
            "issued" if r.how == "issued" else f"token {r.how}",
            "revoked" if r.revoked else "",
        ]
        if live:
            line += [r.state or "", r.last_heard or ""]
        table.append(line)
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
