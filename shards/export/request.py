"""What an export is asked to make, and whether the export already in its folder is that.

``shoal export`` (and each ``shoal demo``) first asks :func:`current_export`, which tells from the manifest
and the source's files' size and modification time alone (``shards.checkpoint.fingerprint``) that the export
is up to date: no checkpoint opened, nothing hashed, and neither torch nor transformers imported. Only when it
cannot tell does the export stack load (``shards.export.exporter``), open the checkpoint, and decide with its
revision as :func:`reusable` does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ExportError, ManifestError, ShoalError
from shards.architecture import ArchSpec
from shards.checkpoint.fingerprint import FingerprintStore, revision_files
from shards.checkpoint.resolve import local_source
from shards.export.split import layer_split_from_counts, plan_layer_split
from shards.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest

log = logging.getLogger(__name__)

WEIGHT_FORMATS = ("int4", "int8", "fp16", "fp32")
KV_BUDGET_BYTES = 1 << 30
"""The default context stops where one session's KV cache would pass 1 GiB on a stage (estimated in bf16, as the
CPU plugin keeps it): with its weights, a stage still fits an office PC of 8-16 GB. SmolLM2 (8,192 positions)
and Qwen2.5-Coder-1.5B (32,768) keep their own context on one stage; Llama 3.1 8B (131,072) gets 16,384 on two
stages. ``--context`` chooses another."""
CONTEXT_STEP = 1024
"""A context the budget cuts is rounded down to a multiple of this (and is never less)."""


@dataclass(frozen=True)
class ExportRequest:
    """What ``shoal export`` was asked to do."""

    source: str
    out_dir: Path
    stages: int
    weights: str = "int4"
    draft_source: str | None = None
    self_draft_layers: int | None = None
    force: bool = False
    layers: tuple[int, ...] | None = None
    """Layers per stage as pinned by an admin (None: the split planner decides)."""
    context_tokens: int | None = None
    """Positions a session may hold, prompt and answer (None: :func:`default_context`)."""

    def __post_init__(self) -> None:
        if self.context_tokens is not None and self.context_tokens < 1:
            raise ExportError(f"--context must be a positive number of tokens, not {self.context_tokens}")
        if self.layers is not None and len(self.layers) != self.stages:
            raise ExportError(f"--layers names {len(self.layers)} stages, --stages {self.stages}")
        if self.weights not in WEIGHT_FORMATS:
            raise ExportError(f"--weights must be one of {', '.join(WEIGHT_FORMATS)}, not {self.weights!r}")
        if self.draft_source and self.self_draft_layers:
            raise ExportError("choose either --draft MODEL or --self-draft N, not both")

    @property
    def draft_label(self) -> str | None:
        """How the manifest names the requested draft (None: no draft)."""
        if self.self_draft_layers:
            return f"self:{self.self_draft_layers}"
        return self.draft_source


def _split_text(ranges: list[range]) -> str:
    return "/".join(str(len(r)) for r in ranges)


def default_context(spec: ArchSpec, ranges: list[range], window: int | None = None) -> int:
    """The context of an export made without ``--context``: the model's own (``max_position_embeddings``, or its
    attention ``window`` if shorter), cut so that one session's KV cache stays within :data:`KV_BUDGET_BYTES` on
    the stage of ``ranges`` holding the most layers."""
    largest = max(spec.kv_bytes_per_token(len(r)) for r in ranges)
    fits = max(CONTEXT_STEP, KV_BUDGET_BYTES // largest // CONTEXT_STEP * CONTEXT_STEP)
    own = spec.max_position_embeddings if window is None else min(window, spec.max_position_embeddings)
    return min(own, fits)


def export_context(request: ExportRequest, spec: ArchSpec, ranges: list[range], window: int | None = None) -> int:
    """The context the export of ``request`` gets: ``--context`` (no more than the model's positions), or
    :func:`default_context`."""
    if request.context_tokens is None:
        return default_context(spec, ranges, window)
    if request.context_tokens > spec.max_position_embeddings:
        raise ExportError(
            f"--context {request.context_tokens} exceeds the {spec.max_position_embeddings} positions the model was "
            f"trained for (max_position_embeddings): choose {spec.max_position_embeddings} or less"
        )
    return request.context_tokens


def reusable(
    request: ExportRequest, revision: str, ranges: list[range], context_tokens: int
) -> tuple[Manifest | None, bool]:
    """The existing export at ``out_dir`` if it was made from the same inputs (else None), and whether
    a new export may replace what is there. ``ranges`` is today's split of the layers, ``context_tokens`` the
    context asked for: an export that differs only by its context gets the new one in its manifest, rewritten
    here (the graphs take any context), and is reused."""
    if not (request.out_dir / MANIFEST_NAME).exists():
        if request.out_dir.exists() and any(request.out_dir.iterdir()) and not request.force:
            raise ExportError(f"{request.out_dir} exists and is not an export; pass --force to replace it")
        return None, request.force
    try:
        old = Manifest.load(request.out_dir)
    except ManifestError:
        if request.force:
            return None, True
        raise
    same = (
        old.source.revision == revision
        and old.weights == request.weights
        and len(old.stages) == request.stages
        and (old.draft.source if old.draft else None) == request.draft_label
    )
    if same and old.format_version < FORMAT_VERSION:
        # the same export in an older format: it still runs, but a new one is better (and nothing is lost)
        log.info(
            "export %s has format %d, re-exporting in format %d", request.out_dir, old.format_version, FORMAT_VERSION
        )
        return None, True
    old_ranges = [s.layers for s in old.stages]
    if same and old_ranges != ranges:
        # the same inputs cut elsewhere (an older planner, or another pinned cut): re-balance
        log.info(
            "export %s was split %s, re-exporting split %s",
            request.out_dir,
            _split_text(old_ranges),
            _split_text(ranges),
        )
        return None, True
    if same and not request.force:
        if old.context_tokens != context_tokens:
            log.info(
                "export %s: context %d -> %d tokens (the manifest changes, the graphs stay)",
                request.out_dir,
                old.context_tokens,
                context_tokens,
            )
            old = old.with_context(context_tokens)
            old.save(request.out_dir)
        return old, False
    if not request.force:
        raise ExportError(f"{request.out_dir} holds a different export; pass --force to replace it")
    return None, True


def layer_ranges(request: ExportRequest, spec: ArchSpec) -> list[range]:
    """The layers of each stage: as pinned by ``--layers``, else as the split planner balances them."""
    if request.layers is None:
        return plan_layer_split(spec, request.stages, request.weights)
    return layer_split_from_counts(spec, request.layers)


def current_export(request: ExportRequest, cache_dir: Path) -> Manifest | None:
    """The export in ``request.out_dir`` if it is up to date for ``request``, told without reading the
    checkpoint: its files have the size and modification time they had when last hashed, and that digest is
    the manifest's revision (the split is planned over the manifest's architecture, the checkpoint's own).
    None when that cannot be told (no export there, a source changed or never hashed, a Hub id, ``--force``,
    anything odd): the full export then opens the checkpoint and decides."""
    if request.force or not (request.out_dir / MANIFEST_NAME).is_file():
        return None
    try:
        source = local_source(request.source, cache_dir)
        revision = None if source is None else FingerprintStore.in_cache(cache_dir).known(revision_files(source))
        if revision is None:
            return None
        old = Manifest.load(request.out_dir)
        ranges = layer_ranges(request, old.arch)
        if request.context_tokens is None and old.context_tokens != default_context(old.arch, ranges):
            return None  # perhaps an attention window cut it: the checkpoint's config tells
        existing, _ = reusable(request, revision, ranges, export_context(request, old.arch, ranges))
    except ShoalError:  # the full export says what is wrong, with the checkpoint at hand
        return None
    return existing
