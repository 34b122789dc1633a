"""Choosing a head's drafter from the command line or a benchmark: none, n-gram, a draft model, or both."""

from __future__ import annotations

from pathlib import Path

from agent.head.cross_drafter import CrossTokenizerDrafter, TextBridge
from agent.head.drafters import DRAFTERS, Drafter, HybridDrafter, NGramDrafter
from agent.head.model_drafter import ModelDrafter
from agent.head.sampling import SamplingParams
from agent.runtime.stage import CompiledStage, RuntimeConfig
from shards.errors import ShoalError
from shards.manifest import Manifest


def make_drafter(kind: str, export_dir: Path, manifest: Manifest, params: SamplingParams,
                 config: RuntimeConfig, draft_export: Path | None = None) -> Drafter | None:
    """``draft`` uses the draft graph (a separate draft model or a self-draft) of ``draft_export``
    (default: the target's export), or, when ``draft_export`` is a 1-stage export, that whole model; a
    model with another tokenizer drafts through text (``CrossTokenizerDrafter``). ``ngram+draft``: the
    n-gram drafter where the context repeats, that model elsewhere. ``auto`` picks a draft graph when
    there is one, else n-gram."""
    draft_manifest = manifest if draft_export is None else Manifest.load(draft_export)
    if kind == "auto":
        kind = "draft" if draft_manifest.draft is not None else "ngram"
    if kind == "none":
        return None
    if kind == "ngram":
        return NGramDrafter()
    if kind not in ("draft", "ngram+draft"):
        raise ShoalError(f"drafter must be one of {', '.join(DRAFTERS)}, not {kind!r}")
    model = _model_drafter(export_dir, manifest, params, config, draft_export, draft_manifest)
    return model if kind == "draft" else HybridDrafter(NGramDrafter(), model)


def _model_drafter(export_dir: Path, manifest: Manifest, params: SamplingParams, config: RuntimeConfig,
                   draft_export: Path | None, draft_manifest: Manifest) -> Drafter:
    source = draft_export or export_dir
    if draft_manifest.draft is not None:
        graph, vocab = draft_manifest.draft.graph, draft_manifest.draft.arch.vocab_size
    elif draft_export is not None and len(draft_manifest.stages) == 1:
        graph, vocab = draft_manifest.stages[0], draft_manifest.arch.vocab_size
    else:
        raise ShoalError(f"{source} has no draft graph: export with --draft MODEL or --self-draft N, "
                         "or pass --draft-export with a 1-stage export of a small model")
    shares_tokenizer = vocab == manifest.arch.vocab_size and (
        draft_export is None or _tokenizer_hashes(draft_manifest) == _tokenizer_hashes(manifest))
    if draft_export is None and not shares_tokenizer:
        raise ShoalError(f"the draft graph in {source} does not share the target's tokenizer")
    stage = CompiledStage(source, graph, draft_manifest.weights, config, drafts=True)
    if shares_tokenizer:
        return ModelDrafter(stage, params)
    from transformers import AutoTokenizer

    bridge = TextBridge(AutoTokenizer.from_pretrained(str(export_dir / "tokenizer")),
                        AutoTokenizer.from_pretrained(str(source / "tokenizer")))
    return CrossTokenizerDrafter(ModelDrafter(stage, SamplingParams()), bridge)  # greedy: see its docstring


def _tokenizer_hashes(manifest: Manifest) -> dict[str, str]:
    return {Path(f.path).name: f.sha256 for f in manifest.tokenizer_files if f.path.endswith("tokenizer.json")}
