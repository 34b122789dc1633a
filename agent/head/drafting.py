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
    (default: the target's export), or, when ``draft_export`` is a 1-stage export of a model with
    the same vocabulary, that whole model; ``auto`` picks a draft graph when there is one, else n-gram."""
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
    if draft_manifest.draft is not None:
        graph, vocab = draft_manifest.draft.graph, draft_manifest.draft.arch.vocab_size
    elif draft_export is not None and len(draft_manifest.stages) == 1:
        graph, vocab = draft_manifest.stages[0], draft_manifest.arch.vocab_size
    else:
        raise ShoalError(f"{source} has no draft graph: export with --draft MODEL or --self-draft N, "
                         "or pass --draft-export with a 1-stage export of a small model")
    if vocab != manifest.arch.vocab_size or (
            draft_export is not None and _tokenizer_hashes(draft_manifest) != _tokenizer_hashes(manifest)):
        raise ShoalError(f"the draft in {source} does not share the target's tokenizer")
    stage = CompiledStage(source, graph, draft_manifest.weights, config)
    return ModelDrafter(stage, params)


def _tokenizer_hashes(manifest: Manifest) -> dict[str, str]:
    return {Path(f.path).name: f.sha256 for f in manifest.tokenizer_files if f.path.endswith("tokenizer.json")}
