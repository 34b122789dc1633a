"""``shoal agent``: read the agent's configuration from its flags and file, then run the daemon (``agent.daemon``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from agent.cli.common import FAST_PREFILL_HELP, PREFILL_ATTENTION_HELP, REWIND_HELP, Subcommands, identity_dir
from agent.head.drafters import DRAFTERS
from agent.head.prefill import DEFAULT_PREFILL_CHUNK
from agent.node.config import AgentConfig, load_agent_config
from agent.runtime.config import KV_MODES, PREFILL_ATTENTIONS, REWINDS
from agent.runtime.packer import DEFAULT_BUDGET

log = logging.getLogger(__name__)


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal agent``: the fleet member's flags here, the stages' and the chats' below."""
    p = sub.add_parser(
        "agent",
        help="join the fleet and serve what its plan asks (a long-running daemon); with an export and --stage, "
        "serve those stages of a hand-wired ring",
    )
    p.add_argument(
        "export_dir", type=Path, nargs="?", default=None, help="an export, for a hand-wired ring (default: none)"
    )
    p.add_argument(
        "--shards-dir",
        type=Path,
        default=None,
        help="where downloaded shards are cached (default: the shared Hugging Face cache)",
    )
    p.add_argument(
        "--donor",
        action="store_true",
        default=None,
        help="a donor's PC: serve only while its owner is away (no keyboard or mouse input), at the lowest "
        "priority; settings in agent.toml's [donor] table",
    )
    p.add_argument(
        "--offer-mb",
        type=int,
        default=None,
        metavar="MIB",
        help="memory this PC gives a shard (default: what it measures free; 0: it only heads chats)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        metavar="GFLOPS",
        help="this PC's speed figure for the plan (default: measured once running)",
    )
    p.add_argument("--config", type=Path, default=None, help="TOML file with the same settings as the flags")
    p.add_argument("--stage", type=int, action="append", default=[], help="stage index to serve (repeatable)")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a fleet member to dial at start (repeatable); without multicast one is enough",
    )
    p.add_argument("--no-mdns", action="store_true", help="neither announce nor browse over mDNS")
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        metavar="POSITIONS",
        help=f"cut a chat's long prompt into chunks of at most this many positions, pipelined through the ring "
        f"(0: one step; default {DEFAULT_PREFILL_CHUNK})",
    )
    p.add_argument(
        "--lost-after", type=float, default=None, metavar="SECONDS", help="a member unheard this long is lost (10)"
    )
    _add_stage_arguments(p)
    _add_chat_arguments(p)


def _add_stage_arguments(p: argparse.ArgumentParser) -> None:
    """The stages this agent serves (a hand-wired ring) and how it runs them."""
    p.add_argument("--identity", type=Path, default=None, help="node identity folder (cert.pem, key.pem, ca.pem)")
    p.add_argument("--listen", default=None, help="HOST:PORT to listen on (default 127.0.0.1:0, any free port)")
    p.add_argument("--next", default=None, help="HOST:PORT of the next stage (not for the last stage)")
    p.add_argument("--device", default=None, help="AUTO, CPU, GPU or NPU")
    p.add_argument("--threads", type=int, default=None, help="CPU inference threads")
    p.add_argument("--precision", choices=("auto", "f32", "bf16", "f16"), default=None)
    p.add_argument(
        "--tune-precision",
        action="store_true",
        default=None,
        help="time auto's decode precision against the device's default on this PC's first compile, keep the faster",
    )
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction, default=None, help=FAST_PREFILL_HELP)
    p.add_argument("--prefill-attention", choices=PREFILL_ATTENTIONS, default=None, help=PREFILL_ATTENTION_HELP)
    p.add_argument("--rewind", choices=REWINDS, default=None, help=REWIND_HELP)
    p.add_argument("--max-sessions", type=int, default=None, help="sessions held at once (default 8)")
    p.add_argument(
        "--kv",
        choices=KV_MODES,
        default=None,
        help="where the stages keep their sessions' KV: state (each session its own, steps one by one) or paged "
        "(one shared block pool on the CPU, so that several sessions' steps go through in one inference); the "
        "chats this agent heads on its own stages too (default state)",
    )
    p.add_argument(
        "--pack-budget",
        type=int,
        default=None,
        metavar="ROWS",
        help=f"rows per packed inference: the ready steps of several sessions go together, decode rows first, "
        f"then prompt chunks of at most this many positions (0: one step at a time; default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--pack-window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long an idle stage waits after a step arrives for others to pack with it (default 0)",
    )
    p.add_argument(
        "--wire-dtype",
        choices=("auto", "f32", "f16"),
        default=None,
        help="hidden states on the wire (default auto: the dtype the stage computes in)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip checking file hashes against the manifest")


def _add_chat_arguments(p: argparse.ArgumentParser) -> None:
    """The chats this agent heads: where they come in, where they go through the ring, what it keeps."""
    p.add_argument(
        "--chat",
        default=None,
        metavar="HOST:PORT",
        help="head the chats of this PC: serve them on this loopback address (e.g. 127.0.0.1:0)",
    )
    p.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="with --chat: also an OpenAI-style API (/v1/chat/completions) on this loopback address",
    )
    p.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="Prometheus /metrics of this agent, stage-only ones too: plain HTTP on loopback (e.g. 127.0.0.1:9464), "
        "HTTPS requiring a fleet certificate on any other address",
    )
    p.add_argument(
        "--chat-file",
        type=Path,
        default=None,
        help="where the chat address and access token are written (default: <data dir>/chat.json)",
    )
    p.add_argument(
        "--ring-first",
        default=None,
        metavar="HOST:PORT",
        help="for chats on an agent that does not serve stage 0: stage 0's address",
    )
    p.add_argument(
        "--ring-last", default=None, metavar="HOST:PORT", help="for chats: the last stage's address (default: --next)"
    )
    p.add_argument(
        "--drafter", choices=DRAFTERS, default=None, help="the drafter of this agent's chats (default ngram)"
    )
    p.add_argument(
        "--chat-keep",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep a finished chat's session this long, so that the conversation's next turn computes "
        "only its new message (default 120; 0: every turn starts afresh)",
    )
    p.add_argument(
        "--chat-keep-max",
        type=int,
        default=None,
        metavar="N",
        help="chat sessions kept at once; each holds a place on every stage (default 1)",
    )


def run_agent(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    """Run the daemon with the flags and the file's settings until it stops; its exit status."""
    overrides = {
        "export_dir": args.export_dir,
        "stages": args.stage or None,
        "identity_dir": args.identity,
        "listen": args.listen,
        "next": args.next,
        "device": args.device,
        "threads": args.threads,
        "precision": args.precision,
        "tune_precision": args.tune_precision,
        "fast_prefill": args.fast_prefill,
        "prefill_attention": args.prefill_attention,
        "rewind": args.rewind,
        "max_sessions": args.max_sessions,
        "kv": args.kv,
        "pack_budget": args.pack_budget,
        "pack_window": args.pack_window,
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


async def serve(config: AgentConfig) -> int:
    """``agent.daemon.serve``, imported only when an agent starts: every command's parser is built at each start
    of ``shoal``, and the daemon's imports (OpenVINO) would slow them all."""
    from agent.daemon import serve as serve_daemon

    return await serve_daemon(config)
