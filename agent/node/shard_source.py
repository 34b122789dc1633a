"""``ShardSource``: where this agent gets the files of the model the fleet document names.

Two kinds of source (``discovery.fleet_document.ModelSource``):

- a Hub repository pinned to a commit: only the files asked for are downloaded (``shards.hub.fetch``), from
  the Hub or the office's mirror (``HF_ENDPOINT``), into the agent's cache, and checked against the manifest;
- an export folder every PC can read (a share, or the same path on each PC, as in the local demo): its files
  are checked where they are.

Every call blocks (downloads, hashing): the daemon calls them off the event loop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from agent.errors import ManifestError
from discovery.fleet_document import ModelSource
from shards.manifest import FileEntry, Manifest

Progress = Callable[[int, int], None]
"""Told ``(bytes done, bytes in all)`` as a fetch goes on."""


class ShardSource:
    """Fetches and checks what this agent needs of the fleet's model."""

    def __init__(self, cache_dir: Path | None = None, endpoint: str | None = None) -> None:
        """``cache_dir``: where Hub downloads go (None: the shared Hugging Face cache); ``endpoint``: the Hub or
        mirror URL (None: ``HF_ENDPOINT``, else the Hub)."""
        self.cache_dir = cache_dir
        self.endpoint = endpoint

    def manifest(self, model: ModelSource) -> Manifest:
        """The manifest of ``model`` (downloaded alone first, for a Hub model)."""
        if model.export_dir is not None:
            return Manifest.load(Path(model.export_dir))
        from shards.hub.fetch import fetch_manifest

        assert model.repo_id is not None and model.revision is not None
        return fetch_manifest(model.repo_id, model.revision, cache_dir=self.cache_dir, endpoint=self.endpoint)

    def fetch(self, model: ModelSource, stages: tuple[int, ...], head: bool, progress: Progress | None = None) -> Path:
        """A folder holding the manifest and, checked against it, the files of ``stages`` and (``head``) the
        tokenizer and draft model: an export folder with only those files."""
        if model.export_dir is not None:
            folder = Path(model.export_dir)
            manifest = Manifest.load(folder)
            _check_stages(manifest, stages)
            graphs = [manifest.stages[i] for i in stages]
            if head and manifest.draft is not None:
                graphs.append(manifest.draft.graph)
            files = [f for g in graphs for f in g.files] + (list(manifest.tokenizer_files) if head else [])
            total = sum(f.size for f in files)
            manifest.verify(folder, graphs=graphs, progress=False)
            if progress is not None:
                progress(total, total)
            return folder
        from shards.hub.fetch import ShardRequest, fetch_shards

        assert model.repo_id is not None and model.revision is not None
        request = ShardRequest(model.repo_id, model.revision, stages, head)
        # an agent started in a terminal shows a bar; a service's log gets the status' progress instead
        bar = sys.stderr.isatty()
        return fetch_shards(
            request, cache_dir=self.cache_dir, endpoint=self.endpoint, progress=progress, progress_bar=bar
        )

    def cached_stages(self, model: ModelSource, manifest: Manifest) -> tuple[int, ...]:
        """The stages whose files this agent has already, each of the manifest's size (not hashed: the fetch
        that uses them checks them), so that the plan can prefer it for them and spare a download."""
        return tuple(i for i, graph in enumerate(manifest.stages) if all(self._has(model, f) for f in graph.files))

    def _has(self, model: ModelSource, entry: FileEntry) -> bool:
        if model.export_dir is not None:
            path: str | Path | None = Path(model.export_dir) / entry.path
        else:
            from huggingface_hub import try_to_load_from_cache

            assert model.repo_id is not None and model.revision is not None
            found = try_to_load_from_cache(
                model.repo_id, entry.path, cache_dir=self.cache_dir, revision=model.revision, repo_type="model"
            )
            path = found if isinstance(found, str) else None
        try:
            return path is not None and Path(path).stat().st_size == entry.size
        except OSError:
            return False


def _check_stages(manifest: Manifest, stages: tuple[int, ...]) -> None:
    for index in stages:
        if not 0 <= index < len(manifest.stages):
            raise ManifestError(f"the export has {len(manifest.stages)} stages; there is no stage {index}")
