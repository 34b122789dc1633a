"""Choosing a head's drafter from the command line or a benchmark: none, n-gram, or a draft graph."""

from __future__ import annotations

from pathlib import Path

from agent.head.drafters import Drafter, NGramDrafter
from agent.head.model_drafter import ModelDrafter
from agent.head.sampling import SamplingParams
from agent.runtime.stage import CompiledStage, RuntimeConfig
from shards.errors import ShoalError
from shards.manifest import Manifest

DRAFTERS = ("auto", "none", "ngram", "draft")


def make_drafter(kind: str, export_dir: Path, manifest: Manifest, params: SamplingParams,
                 config: RuntimeConfig, draft_export: Path | None = None) -> Drafter | None:
    """``draft`` uses the draft graph (a separate draft model or a self-draft) of ``draft_export``
    (default: the target's export); ``auto`` picks it when there is one, else n-gram."""
    source = draft_export or export_dir
    draft_manifest = manifest if draft_export is None else Manifest.load(draft_export)
    if kind == "auto":
        kind = "draft" if draft_manifest.draft is not None else "ngram"
    if kind == "none":
        return None
    if kind == "ngram":
        return NGramDrafter()
    if kind != "draft":
        raise ShoalError(f"drafter must be one of {', '.join(DRAFTERS)}, not {kind!r}")
    if draft_manifest.draft is None:
        raise ShoalError(f"{source} has no draft graph: export with --draft MODEL or --self-draft N")
    if draft_manifest.arch.vocab_size != manifest.arch.vocab_size:
        raise ShoalError(f"the draft in {source} has another vocabulary than the target")
    stage = CompiledStage(source, draft_manifest.draft.graph, draft_manifest.weights, config)
    return ModelDrafter(stage, params)
