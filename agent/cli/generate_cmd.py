"""``shoal generate``: one chat prompt through the in-process pipeline, streamed to stdout."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agent.head.chat import ChatTokenizer, TextStream
from agent.head.generate import generate
from agent.head.sampling import SamplingParams
from agent.runtime import LocalPipeline, RuntimeConfig
from shards.manifest import Manifest


def run_generate(args: argparse.Namespace, cache_dir: Path) -> int:
    manifest = Manifest.load(args.export_dir)
    if not args.no_verify:
        manifest.verify(args.export_dir, graphs=list(manifest.stages))
    config = RuntimeConfig(
        device=args.device, threads=args.threads, cache_dir=cache_dir / "ov-cache", precision=args.precision
    )
    pipeline = LocalPipeline(args.export_dir, manifest, config)
    tokenizer = ChatTokenizer(args.export_dir / "tokenizer")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    stream = TextStream(tokenizer)
    session = pipeline.new_session()
    start, count = time.perf_counter(), 0
    for token in generate(session, prompt_ids, args.max_tokens, tokenizer.stop_ids, params, manifest.context_tokens):
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()
        count += 1
    sys.stdout.write("\n")
    elapsed = time.perf_counter() - start
    print(f"[{count} tokens in {elapsed:.2f} s, {count / elapsed:.1f} tok/s, "
          f"{len(manifest.stages)} stages on {pipeline.stages[0].device}]", file=sys.stderr)
    return 0
