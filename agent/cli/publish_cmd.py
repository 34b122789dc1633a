"""``shoal publish EXPORT_DIR REPO_ID``: an export onto the Hub, or into an office mirror's folder of repositories.

Prints the commit, the revision a fleet document pins (``shoal fleet serve REPO_ID@COMMIT``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.common import Subcommands


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal publish``."""
    p = sub.add_parser("publish", help="publish an export to the Hub (or an office mirror) for fleets to download")
    p.add_argument("export_dir", type=Path)
    p.add_argument("repo_id", help="ORG/NAME")
    p.add_argument("--revision", default=None, help="the Hub branch to commit to (default: the default branch)")
    p.add_argument(
        "--mirror",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a git repository under DIR/models/ORG/NAME instead (the mirrors-path an olah mirror serves)",
    )
    p.add_argument("--public", action="store_true", help="a new Hub repository is public (default: private)")


def run_publish(args: argparse.Namespace) -> int:
    from shards.hub.publish import publish_to_hub, publish_to_mirror

    if args.mirror is not None:
        commit = publish_to_mirror(args.export_dir, args.mirror, args.repo_id, progress=True)
        where = f"mirror {args.mirror}"
    else:
        commit = publish_to_hub(args.export_dir, args.repo_id, revision=args.revision, private=not args.public)
        where = "the Hub"
    print(f"published {args.export_dir} to {where} as {args.repo_id}@{commit}")
    print(f"serve it to the fleet: shoal fleet serve {args.repo_id}@{commit}")
    return 0
