"""``shoal join TOKEN@HOST:PORT``: enroll this PC in a fleet with a join token (``agent.fleet.enrollment``)."""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
from pathlib import Path

from agent.cli.common import Subcommands
from agent.fleet.authority import cert_fingerprint, validate_node_name
from agent.fleet.enrollment import join, parse_join_address


def node_name_from_hostname(hostname: str) -> str:
    """A valid node name made of a host name: its first label, lowercased, other characters as '-'."""
    label = hostname.strip().split(".")[0].lower()
    name = re.sub(r"[^a-z0-9_-]+", "-", label).lstrip("-_")[:63].rstrip("-_")
    return name or "node"


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal join``."""
    p = sub.add_parser("join", help="enroll this PC in a fleet with a join token (from `shoal fleet token`)")
    p.add_argument("address", metavar="TOKEN@HOST:PORT", help="the token and the enrollment server's address")
    p.add_argument("--name", default=None, help="this PC's node name (default: its host name)")
    p.add_argument("--out", type=Path, default=None, help="identity folder (default: <data dir>/fleet/nodes/NAME)")
    p.add_argument(
        "--ip", action="append", default=[], help="an IP address of this PC for its certificate (repeatable)"
    )


def run_join(args: argparse.Namespace, data_dir: Path) -> int:
    token, address = parse_join_address(args.address)
    name = validate_node_name(args.name) if args.name is not None else node_name_from_hostname(socket.gethostname())
    out: Path = args.out if args.out is not None else data_dir / "fleet" / "nodes" / name
    identity = asyncio.run(join(address, token, name, out, ips=args.ip))
    cert = identity.certificate()
    print(f"joined fleet {identity.fleet_id} as {name}")
    print(f"identity folder:      {out}")
    print(f"node id:              {identity.node_id}")
    print(f"node fingerprint:     {cert_fingerprint(cert)}")
    print(f"valid until:          {cert.not_valid_after_utc:%Y-%m-%d}")
    return 0
