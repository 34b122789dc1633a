"""``shoal generate``: one chat prompt through every stage, in-process or around a ring, streamed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from agent.cli.common import FAST_PREFILL_HELP, PREFILL_ATTENTION_HELP, REWIND_HELP, Subcommands
from agent.head.drafters import DRAFTERS
from agent.runtime.config import PREFILL_ATTENTIONS, REWINDS, RuntimeConfig
from agent.sampling.params import SamplingParams

if TYPE_CHECKING:  # the head's and the stages' modules (OpenVINO) are imported when a prompt is answered
    from agent.head.chat import ChatTokenizer
    from agent.head.decode import DecodeStats
    from agent.head.ring_client import RingClient
    from agent.head.targets import Target
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


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal generate``."""
    p = sub.add_parser("generate", help="answer one chat prompt through every stage of an export, in-process")
    p.add_argument("export_dir", type=Path)
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="AUTO", help="AUTO, CPU, GPU or NPU")
    p.add_argument("--threads", type=int, default=None, help="CPU inference threads")
    p.add_argument(
        "--precision",
        choices=("auto", "f32", "bf16", "f16"),
        default="auto",
        help="inference precision (f32: token-identical across stage splits, slower)",
    )
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction, default=True, help=FAST_PREFILL_HELP)
    p.add_argument("--prefill-attention", choices=PREFILL_ATTENTIONS, default="paged", help=PREFILL_ATTENTION_HELP)
    p.add_argument("--rewind", choices=REWINDS, default="auto", help=REWIND_HELP)
    p.add_argument("--no-verify", action="store_true", help="skip checking file hashes against the manifest")
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="auto",
        help="speculative decoding: the export's draft graph, n-gram prompt lookup, n-gram where the "
        "text repeats and the draft model elsewhere, or none "
        "(auto: the draft graph if the export has one, else n-gram)",
    )
    p.add_argument(
        "--draft-export",
        type=Path,
        default=None,
        help="take the draft graph from this export instead (a 1-stage export: that whole model; "
        "another tokenizer drafts through text)",
    )
    p.add_argument("--k", type=int, default=None, help="fixed number of drafted tokens per step (default: adaptive)")
    p.add_argument(
        "--depth",
        type=int,
        default=1,
        help="with --ring: speculative steps in flight at once, drafts continued past unjudged ones",
    )
    p.add_argument(
        "--draft-ahead",
        action="store_true",
        help="with --ring and a draft model: also draft while the ring computes, on a guess at its answer",
    )
    p.add_argument(
        "--ring",
        default=None,
        metavar="ADDR[,ADDR]",
        help="run through agents: HOST:PORT of the first remote stage and of the last (one if the same)",
    )
    p.add_argument("--local-stages", type=int, default=0, help="with --ring: stages this head runs itself")
    p.add_argument("--identity", type=Path, default=None, help="with --ring: this node's identity folder")


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
    from agent.head.adaptive_k import AdaptiveK
    from agent.head.chat import ChatTokenizer, TextStream, check_vocabulary
    from agent.head.decode import DecodeStats, decode
    from agent.head.drafting import make_drafter
    from shards.manifest import Manifest

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
    target, client, where = await _open_target(export_dir, manifest, params, config, options, local_count, executor)
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


async def _open_target(
    export_dir: Path,
    manifest: Manifest,
    params: SamplingParams,
    config: RuntimeConfig,
    options: HeadOptions,
    local_count: int,
    executor: ThreadPoolExecutor,
) -> tuple[Target, RingClient | None, str]:
    """Where the answer's steps run: every stage in-process, or a ring (its client, to close) after
    ``local_count`` local stages; and the words that say which."""
    from agent.head.targets import LocalTarget
    from agent.runtime.repeatable import stages_exact
    from agent.runtime.stage import CompiledStage, LocalPipeline

    loop = asyncio.get_running_loop()
    if not options.ring:
        pipeline = await loop.run_in_executor(None, LocalPipeline, export_dir, manifest, config)
        session = await loop.run_in_executor(executor, pipeline.new_session)
        exact = stages_exact(pipeline.stages)
        return LocalTarget(session, params, executor, exact), None, f"{len(manifest.stages)} local stages"
    from agent.fleet import NodeIdentity
    from agent.head.ring_client import RingClient
    from agent.transport.network import TlsNetwork

    assert options.identity_dir is not None
    identity = NodeIdentity.load(options.identity_dir)
    local_graphs = list(manifest.stages[:local_count])
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
    where = f"a ring of {len(manifest.stages) - local_count} agents" + (
        f" + {local_count} local stage(s)" if local_count else ""
    )
    return await client.open_session(params), client, where
