"""``shoal generate``: one chat prompt through every stage, in-process or around a ring, streamed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import ChatTokenizer, TextStream, check_vocabulary
from agent.head.decode import DecodeStats, decode
from agent.head.drafting import make_drafter
from agent.head.targets import LocalTarget, Target
from agent.runtime.config import RuntimeConfig
from agent.runtime.repeatable import stages_exact
from agent.runtime.stage import CompiledStage, LocalPipeline
from agent.sampling.params import SamplingParams
from shards.manifest import Manifest


@dataclass(frozen=True)
class HeadOptions:
    """How a head answers: where the stages are, which drafter, which K."""

    drafter: str = "auto"
    draft_export: Path | None = None
    k: int | None = None
    """Fixed K; None adapts it."""
    ring: tuple[tuple[str, int], ...] = ()
    """Addresses of the first remote stage and of the last; empty: every stage in-process."""
    local_stages: int = 0
    identity_dir: Path | None = None
    verify: bool = True
    depth: int = 1
    """Speculative steps of the session in flight at once (pipelined speculation; useful on a ring only)."""
    draft_ahead: bool = False
    """With a ring and a draft model: draft the next step while the ring computes this one."""


def run_generate(args: argparse.Namespace, cache_dir: Path, data_dir: Path) -> int:
    from agent.addresses import parse_address
    from agent.cli.common import identity_dir

    ring = tuple(parse_address(a) for a in args.ring.split(",")) if args.ring else ()
    options = HeadOptions(
        args.drafter,
        args.draft_export,
        args.k,
        ring,
        args.local_stages,
        identity_dir(args.identity, data_dir) if ring else None,
        not args.no_verify,
        args.depth,
        args.draft_ahead,
    )
    config = RuntimeConfig(
        device=args.device,
        threads=args.threads,
        cache_dir=cache_dir / "ov-cache",
        precision=args.precision,
        fast_prefill=args.fast_prefill,
        prefill_attention=args.prefill_attention,
        rewind=args.rewind,
    )
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    asyncio.run(stream_answer(args.export_dir, args.prompt, params, config, options, args.max_tokens))
    return 0


async def stream_answer(
    export_dir: Path,
    prompt: str,
    params: SamplingParams,
    config: RuntimeConfig,
    options: HeadOptions,
    max_tokens: int,
    out: TextIO = sys.stdout,
) -> DecodeStats:
    """Answer one chat prompt, writing the text to ``out`` as it comes and a summary line to stderr."""
    loop = asyncio.get_running_loop()

    def prepare() -> tuple[Manifest, ChatTokenizer, list[int], Any, int]:
        # loading, checking and compiling block for seconds: done off the event loop
        manifest = Manifest.load(export_dir)
        tokenizer = ChatTokenizer(export_dir / "tokenizer")
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": prompt}])
        check_vocabulary(prompt_ids, manifest.arch.vocab_size, tokenizer)
        local_count = options.local_stages if options.ring else len(manifest.stages)
        if options.verify and local_count:
            manifest.verify(export_dir, graphs=list(manifest.stages[:local_count]))
        drafter = make_drafter(options.drafter, export_dir, manifest, params, config, options.draft_export)
        return manifest, tokenizer, prompt_ids, drafter, local_count

    manifest, tokenizer, prompt_ids, drafter, local_count = await loop.run_in_executor(None, prepare)
    # one thread for everything this PC computes (local stages and the draft), as on a donor PC
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head")
    local_graphs = list(manifest.stages[:local_count])
    client = None
    target: Target
    if not options.ring:
        pipeline = await loop.run_in_executor(None, LocalPipeline, export_dir, manifest, config)
        session = await loop.run_in_executor(executor, pipeline.new_session)
        exact = stages_exact(pipeline.stages)
        target, where = LocalTarget(session, params, executor, exact), f"{len(manifest.stages)} local stages"
    else:
        from agent.fleet import NodeIdentity
        from agent.head.ring_client import RingClient
        from agent.transport.network import TlsNetwork

        assert options.identity_dir is not None
        identity = NodeIdentity.load(options.identity_dir)
        local = await loop.run_in_executor(
            None, lambda: [CompiledStage(export_dir, g, manifest.weights, config) for g in local_graphs]
        )
        client = RingClient(
            manifest,
            options.ring[0],
            options.ring[-1],
            TlsNetwork.of(identity),
            identity.name,
            local_stages=local,
            executor=executor,
        )
        await client.connect()
        target = await client.open_session(params)
        where = f"a ring of {len(manifest.stages) - local_count} agents" + (
            f" + {local_count} local stage(s)" if local_count else ""
        )
    stream = TextStream(tokenizer)
    stats = DecodeStats()
    start = time.perf_counter()
    try:
        async for token in decode(
            target,
            prompt_ids,
            max_tokens=max_tokens,
            stop_ids=tokenizer.stop_ids,
            params=params,
            context_tokens=manifest.context_tokens,
            drafter=drafter,
            k_policy=AdaptiveK(fixed=options.k),
            executor=executor,
            stats=stats,
            depth=options.depth,
            draft_ahead=options.draft_ahead,
        ):
            out.write(stream.push(token))
            out.flush()
    finally:
        await target.close()
        if client is not None:
            await client.close()
        executor.shutdown()
    out.write("\n")
    elapsed = time.perf_counter() - start
    spec = (
        f", {stats.acceptance:.0%} of {stats.drafted} drafted tokens accepted, median K {stats.median_k:g}"
        if stats.drafted
        else ""
    )
    print(
        f"[{stats.tokens} tokens in {elapsed:.2f} s, {stats.tokens / elapsed:.1f} tok/s, {stats.steps + 1} steps "
        f"through {where}{spec}]",
        file=sys.stderr,
    )
    return stats
