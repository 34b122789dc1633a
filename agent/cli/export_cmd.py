"""``shoal export``."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.cli.common import Subcommands, exit_on_sigterm, layer_counts
from agent.errors import ExportError

if TYPE_CHECKING:
    from shards.export.request import ExportRequest
    from shards.manifest import Manifest


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal export``."""
    p = sub.add_parser("export", help="export a checkpoint into per-stage OpenVINO shards")
    p.add_argument("source", help="Hub model id, model folder, .gguf file, or a short name (smollm2)")
    p.add_argument("--stages", type=int, required=True, help="number of pipeline stages")
    p.add_argument("--out", type=Path, required=True, help="export folder to create")
    p.add_argument("--weights", choices=("int4", "int8", "fp16", "fp32"), default="int4")
    drafts = p.add_mutually_exclusive_group()
    drafts.add_argument("--draft", metavar="MODEL", help="also export this smaller model (same tokenizer) as a draft")
    drafts.add_argument("--self-draft", metavar="N", type=int, help="draft = first N layers + final norm + head")
    p.add_argument(
        "--layers",
        type=layer_counts,
        default=None,
        metavar="N,N,...",
        help="layers per stage, first to last (default: the split planner balances them)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="positions a conversation may hold, prompt and answer (default: the model's own, cut so that one "
        "session's KV cache stays within 1 GiB on each stage)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing different export")


def run_export(args: argparse.Namespace, cache_dir: Path) -> int:
    from shards.export.request import ExportRequest

    request = ExportRequest(
        source=args.source,
        out_dir=args.out,
        stages=args.stages,
        weights=args.weights,
        draft_source=args.draft,
        self_draft_layers=args.self_draft,
        force=args.force,
        layers=args.layers,
        context_tokens=args.context,
    )
    with exit_on_sigterm() as terminated:
        try:
            manifest = export_unless_current(request, cache_dir, stop_requested=terminated.is_set)
        except ExportError:
            if terminated.is_set():  # the SIGTERM's own exception was swallowed; the export stopped at a check
                raise SystemExit(128 + signal.SIGTERM) from None
            raise
    for stage in manifest.stages:
        ends = " + ".join(e for e, held in (("embeddings", stage.embeddings), ("head", stage.head)) if held)
        print(
            f"{stage.name}: layers {stage.layer_start}-{stage.layer_stop - 1}"
            f"{' + ' + ends if ends else ''}, {stage.weights_bytes / 1e6:.1f} MB",
            file=sys.stderr,
        )
    if manifest.draft:
        print(f"draft ({manifest.draft.source}): {manifest.draft.graph.weights_bytes / 1e6:.1f} MB", file=sys.stderr)
    print(context_line(manifest, chosen=args.context is not None), file=sys.stderr)
    print(f"export ready: {args.out}", file=sys.stderr)
    return 0


def export_unless_current(
    request: ExportRequest, cache_dir: Path, stop_requested: Callable[[], bool] = lambda: False
) -> Manifest:
    """The export ``request`` asks for: the one in its folder when that is up to date for its source, told in a
    moment (``shards.export.request``), else made now, which loads torch and the rest of the export stack."""
    from shards.export.request import current_export

    manifest = current_export(request, cache_dir)
    if manifest is not None:
        return manifest
    from shards.export.exporter import export

    return export(request, cache_dir, stop_requested=stop_requested)


def context_line(manifest: Manifest, chosen: bool) -> str:
    """The export's context, why it is that long (``chosen``: ``--context`` said so), and what a session costs."""
    from shards.export.request import KV_BUDGET_BYTES, default_context

    context, own = manifest.context_tokens, manifest.arch.max_position_embeddings
    kv = max(stage.kv_bytes_per_token for stage in manifest.stages) * context
    if chosen:
        why = "as --context asked"
    elif context == own:
        why = "the model's own"
    elif context == default_context(manifest.arch, [stage.layers for stage in manifest.stages]):
        budget = f"{KV_BUDGET_BYTES / (1 << 30):g} GiB"
        why = f"of the model's {own:,}: one session's KV cache kept within {budget} a stage; --context N chooses"
    else:
        why = f"of the model's {own:,}: its attention window"
    mib = kv / (1 << 20)
    return f"context: {context:,} tokens ({why}); one session's KV cache: {mib:,.0f} MiB on the largest stage"
