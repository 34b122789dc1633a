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

    def __post_init__(self) -> None:
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


def reusable(request: ExportRequest, revision: str, ranges: list[range]) -> tuple[Manifest | None, bool]:
    """The existing export at ``out_dir`` if it was made from the same inputs (else None), and whether
    a new export may replace what is there. ``ranges`` is today's split of the layers."""
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
        existing, _ = reusable(request, revision, layer_ranges(request, old.arch))
    except ShoalError:  # the full export says what is wrong, with the checkpoint at hand
        return None
    return existing
