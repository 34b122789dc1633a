"""Choosing a head's drafter from the command line or a benchmark: none, n-gram, a draft model, or both."""

from __future__ import annotations

from pathlib import Path

from agent.errors import ShoalError
from agent.head.chat import ChatTokenizer
from agent.head.cross_drafter import CrossTokenizerDrafter, TextBridge
from agent.head.drafters import DRAFTERS, Drafter, HybridDrafter, NGramDrafter
from agent.head.model_drafter import ModelDrafter
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage
from agent.sampling.params import SamplingParams
from shards.manifest import Manifest


def make_drafter(
    kind: str,
    export_dir: Path,
    manifest: Manifest,
    params: SamplingParams,
    config: RuntimeConfig,
    draft_export: Path | None = None,
) -> Drafter | None:
    """One drafter for one conversation (see :class:`DrafterFactory` for the kinds)."""
    return DrafterFactory(kind, export_dir, manifest, config, draft_export).new(params)


class DrafterFactory:
    """Drafters of one kind for many conversations, each with its own state; a draft model is compiled once.

    ``draft`` uses the draft graph (a separate draft model or a self-draft) of ``draft_export``
    (default: the target's export), or, when ``draft_export`` is a 1-stage export, that whole model; a
    model with another tokenizer drafts through text (``CrossTokenizerDrafter``). ``ngram+draft``: the
    n-gram drafter where the context repeats, that model elsewhere. ``auto`` picks a draft graph when
    there is one, else n-gram."""

    def __init__(
        self, kind: str, export_dir: Path, manifest: Manifest, config: RuntimeConfig, draft_export: Path | None = None
    ) -> None:
        self._draft_manifest = manifest if draft_export is None else Manifest.load(draft_export)
        if kind == "auto":
            kind = "draft" if self._draft_manifest.draft is not None else "ngram"
        if kind not in DRAFTERS:
            raise ShoalError(f"drafter must be one of {', '.join(DRAFTERS)}, not {kind!r}")
        self.kind = kind
        self._export_dir, self._manifest, self._config, self._draft_export = export_dir, manifest, config, draft_export
        self._model: tuple[CompiledStage, TextBridge | None] | None = None

    @property
    def uses_model(self) -> bool:
        return self.kind in ("draft", "ngram+draft")

    def prepare(self) -> None:
        """Compile the draft model now (blocking) rather than for the first conversation; checks the export."""
        if self.uses_model and self._model is None:
            self._model = _draft_model(
                self._export_dir, self._manifest, self._config, self._draft_export, self._draft_manifest
            )

    def new(self, params: SamplingParams) -> Drafter | None:
        """A drafter for a new conversation (None for ``none``)."""
        if self.kind == "none":
            return None
        if self.kind == "ngram":
            return NGramDrafter()
        self.prepare()
        assert self._model is not None
        stage, bridge = self._model
        model: Drafter
        if bridge is None:
            model = ModelDrafter(stage, params)
        else:
            model = CrossTokenizerDrafter(ModelDrafter(stage, SamplingParams()), bridge)  # greedy: see its docstring
        return model if self.kind == "draft" else HybridDrafter(NGramDrafter(), model)


def _draft_model(
    export_dir: Path, manifest: Manifest, config: RuntimeConfig, draft_export: Path | None, draft_manifest: Manifest
) -> tuple[CompiledStage, TextBridge | None]:
    """The compiled draft graph, and the text bridge where it speaks another tokenizer."""
    source = draft_export or export_dir
    if draft_manifest.draft is not None:
        graph, vocab = draft_manifest.draft.graph, draft_manifest.draft.arch.vocab_size
    elif draft_export is not None and len(draft_manifest.stages) == 1:
        graph, vocab = draft_manifest.stages[0], draft_manifest.arch.vocab_size
    else:
        raise ShoalError(
            f"{source} has no draft graph: export with --draft MODEL or --self-draft N, "
            "or pass --draft-export with a 1-stage export of a small model"
        )
    shares_tokenizer = vocab == manifest.arch.vocab_size and (
        draft_export is None or _tokenizer_hashes(draft_manifest) == _tokenizer_hashes(manifest)
    )
    if draft_export is None and not shares_tokenizer:
        raise ShoalError(f"the draft graph in {source} does not share the target's tokenizer")
    stage = CompiledStage(source, graph, draft_manifest.weights, config, drafts=True)
    if shares_tokenizer:
        return stage, None
    return stage, TextBridge(ChatTokenizer(export_dir / "tokenizer"), ChatTokenizer(source / "tokenizer"))


def _tokenizer_hashes(manifest: Manifest) -> dict[str, str]:
    return {Path(f.path).name: f.sha256 for f in manifest.tokenizer_files if f.path.endswith("tokenizer.json")}
