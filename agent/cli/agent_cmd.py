"""``shoal agent``: serve this PC's stage(s) of an export on the ring until stopped."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from agent.cli.common import identity_dir
from agent.errors import ShoalError
from agent.fleet import NodeIdentity
from agent.node.config import AgentConfig, load_agent_config
from agent.node.server import StageServer
from agent.runtime.stage import CompiledStage
from agent.transport.tls import client_context, server_context
from shards.manifest import Manifest

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
        "rewind": args.rewind,
        "max_sessions": args.max_sessions,
        "wire_dtype": args.wire_dtype,
        "verify": False if args.no_verify else None,
        "chat": args.chat,
        "http": args.http,
        "chat_file": args.chat_file,
        "ring_first": args.ring_first,
        "ring_last": args.ring_last,
        "drafter": args.drafter,
        "chat_keep": args.chat_keep,
        "chat_keep_max": args.chat_keep_max,
    }
    # the identity (and the chat endpoint file) under the data dir unless a flag or the file names one
    config = load_agent_config(
        args.config,
        overrides,
        {"identity_dir": lambda: identity_dir(None, data_dir), "chat_file": lambda: data_dir / "chat.json"},
    )
    if config.runtime.cache_dir is None:
        from dataclasses import replace

        config = replace(config, runtime=replace(config.runtime, cache_dir=cache_dir / "ov-cache"))
    return asyncio.run(serve(config))


async def serve(config: AgentConfig) -> int:
    """Load, verify and compile the stages, then serve until SIGINT/SIGTERM."""
    identity = NodeIdentity.load(config.identity_dir)
    manifest = Manifest.load(config.export_dir)
    if config.stages[-1] >= len(manifest.stages):
        raise ShoalError(f"the export has {len(manifest.stages)} stages; there is no stage {config.stages[-1]}")
    graphs = [manifest.stages[i] for i in config.stages]
    loop = asyncio.get_running_loop()
    if config.verify:
        await loop.run_in_executor(None, lambda: manifest.verify(config.export_dir, graphs=graphs, progress=False))
    stages = await loop.run_in_executor(
        None, lambda: [CompiledStage(config.export_dir, g, manifest.weights, config.runtime) for g in graphs]
    )
    server = StageServer(config, manifest, stages, identity.name, server_context(identity), client_context(identity))
    host, port = await server.start()
    chats = None
    chat_note = ""
    if config.chat is not None:
        from agent.chat.service import ChatService

        chats = ChatService(config, server, client_context(identity))
        chat_host, chat_port = await chats.start()
        chat_note = f" chat={chat_host}:{chat_port}"
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # Windows: no signal handlers on the loop
            loop.add_signal_handler(signum, stop.set)
    print(
        f"shoal agent: ready node={identity.name} listen={host}:{port} stages={','.join(map(str, config.stages))} "
        f"layers={graphs[0].layer_start}-{graphs[-1].layer_stop - 1} device={stages[0].device}{chat_note}",
        flush=True,
    )
    try:
        await stop.wait()
    finally:
        if chats is not None:
            await chats.stop()
        await server.stop()
    print("shoal agent: stopped", file=sys.stderr)
    return 0
