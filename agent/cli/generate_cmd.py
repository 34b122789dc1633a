"""``shoal generate``: one chat prompt through every stage, in-process or around a ring, streamed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import ChatTokenizer, TextStream
from agent.head.decode import DecodeStats, decode
from agent.head.drafting import make_drafter
from agent.head.sampling import SamplingParams
from agent.head.targets import LocalTarget, Target
from agent.runtime import LocalPipeline, RuntimeConfig
from agent.runtime.stage import CompiledStage
from shards.manifest import Manifest


def run_generate(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    return asyncio.run(_generate(args, cache_dir, data_dir))


async def _generate(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    manifest = Manifest.load(args.export_dir)
    config = RuntimeConfig(
        device=args.device, threads=args.threads, cache_dir=cache_dir / "ov-cache", precision=args.precision
    )
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    tokenizer = ChatTokenizer(args.export_dir / "tokenizer")
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    # one thread for everything this PC computes (local stages and the draft), as on a donor PC
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head")
    local_count = len(manifest.stages) if not args.ring else args.local_stages
    local_graphs = list(manifest.stages[:local_count])
    if not args.no_verify:
        manifest.verify(args.export_dir, graphs=local_graphs)
    drafter = make_drafter(args.drafter, args.export_dir, manifest, params, config, args.draft_export)
    client = None
    target: Target
    if not args.ring:
        pipeline = LocalPipeline(args.export_dir, manifest, config)
        target, where = LocalTarget(pipeline.new_session(), params, executor), f"{len(manifest.stages)} local stages"
    else:
        from agent.cli.common import identity_dir
        from agent.fleet import NodeIdentity
        from agent.head.ring_client import RingClient
        from agent.node.config import parse_address
        from agent.transport.tls import client_context

        identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
        addresses = [parse_address(a) for a in args.ring.split(",")]
        local = [CompiledStage(args.export_dir, g, manifest.weights, config) for g in local_graphs]
        client = RingClient(manifest, addresses[0], addresses[-1], client_context(identity), identity.name,
                            local_stages=local, executor=executor)
        await client.connect()
        target = client.session(params)
        where = f"a ring of {len(manifest.stages) - local_count} agents" + (
            f" + {local_count} local stage(s)" if local_count else "")
    stream = TextStream(tokenizer)
    stats = DecodeStats()
    start = time.perf_counter()
    try:
        async for token in decode(target, prompt_ids, max_tokens=args.max_tokens, stop_ids=tokenizer.stop_ids,
                                  params=params, context_tokens=manifest.context_tokens, drafter=drafter,
                                  k_policy=AdaptiveK(fixed=args.k), executor=executor, stats=stats):
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
    finally:
        await target.close()
        if client is not None:
            await client.close()
        executor.shutdown()
    sys.stdout.write("\n")
    elapsed = time.perf_counter() - start
    spec = (f", {stats.acceptance:.0%} of {stats.drafted} drafted tokens accepted, median K {stats.median_k:g}"
            if stats.drafted else "")
    print(f"[{stats.tokens} tokens in {elapsed:.2f} s, {stats.tokens / elapsed:.1f} tok/s, {stats.steps + 1} steps "
          f"through {where}{spec}]", file=sys.stderr)
    return 0
