"""``shoal agent``: read the agent's configuration from its flags and file, then run the daemon (``agent.daemon``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from agent.cli.common import identity_dir
from agent.daemon import serve
from agent.node.config import load_agent_config

log = logging.getLogger(__name__)


def run_agent(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    overrides = {
        "export_dir": args.export_dir,
        "stages": args.stage or None,
        "identity_dir": args.identity,
        "listen": args.listen,
        "next": args.next,
        "device": args.device,
        "threads": args.threads,
        "precision": args.precision,
        "fast_prefill": args.fast_prefill,
        "prefill_attention": args.prefill_attention,
        "rewind": args.rewind,
        "max_sessions": args.max_sessions,
        "wire_dtype": args.wire_dtype,
        "verify": False if args.no_verify else None,
        "chat": args.chat,
        "http": args.http,
        "metrics": args.metrics,
        "chat_file": args.chat_file,
        "ring_first": args.ring_first,
        "ring_last": args.ring_last,
        "drafter": args.drafter,
        "chat_keep": args.chat_keep,
        "chat_keep_max": args.chat_keep_max,
        "peers": args.peer or None,
        "mdns": False if args.no_mdns else None,
        "lost_after": args.lost_after,
        "prefill_chunk": args.prefill_chunk,
        "shards_dir": args.shards_dir,
        "offer_mb": args.offer_mb,
        "speed": args.speed,
        "donor": args.donor,
    }
    # the identity (and the chat endpoint file) under the data dir unless a flag or the file names one
    config = load_agent_config(
        args.config,
        overrides,
        {"identity_dir": lambda: identity_dir(None, data_dir), "chat_file": lambda: data_dir / "chat.json"},
    )
    from dataclasses import replace

    if config.runtime.cache_dir is None:
        config = replace(config, runtime=replace(config.runtime, cache_dir=cache_dir / "ov-cache"))
    if config.donor is not None and config.runtime.threads is None:
        import os

        from agent.node.background import donor_threads

        # a donor keeps a core for its owner: inference on all but one
        config = replace(config, runtime=replace(config.runtime, threads=donor_threads(os.cpu_count())))
    code = asyncio.run(serve(config))
    print("shoal agent: stopped", file=sys.stderr)
    return code
