"""``shoal fleet init`` and ``shoal fleet issue``: the fleet's CA and node certificates."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.fleet.authority import NodeIdentity, cert_fingerprint, init_fleet, issue_node, read_certificate


def run_fleet(args: argparse.Namespace, data_dir: Path) -> int:
    """Run ``shoal fleet <init|issue>``; prints what was written to stdout."""
    fleet_dir: Path = args.dir if args.dir is not None else data_dir / "fleet"
    if args.fleet_command == "init":
        ca_path = init_fleet(fleet_dir, args.name, force=args.force)
        ca = read_certificate(ca_path)
        print(f"fleet CA certificate: {ca_path}")
        print(f"fleet CA key:         {fleet_dir / 'ca.key'} (keep it secret: it admits machines to the fleet)")
        print(f"fleet CA fingerprint: {cert_fingerprint(ca)}")
        print(f"valid until:          {ca.not_valid_after_utc:%Y-%m-%d}")
        return 0
    if args.fleet_command == "issue":
        identity: NodeIdentity = issue_node(fleet_dir, args.node, ips=args.ip, days=args.days, out=args.out)
        cert = identity.certificate()
        print(f"node certificate:     {identity.cert}")
        print(f"node key:             {identity.key}")
        print(f"fleet CA copy:        {identity.ca}")
        print(f"node fingerprint:     {cert_fingerprint(cert)}")
        print(f"valid until:          {cert.not_valid_after_utc:%Y-%m-%d}")
        return 0
    return 2
