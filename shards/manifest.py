"""The export manifest: one JSON file that says what every stage holds and how to check it.

A manifest is written last, after every file it lists is in place, so a folder with a manifest
is a complete export. Readers validate it on load (:meth:`Manifest.load`) and can check every
file's size and sha256 against it (:meth:`Manifest.verify`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from agent.errors import IntegrityError, ManifestError
from shards.architecture import ArchSpec

FORMAT_VERSION = 3
# 2: graphs holding the LM head take ``logits_index`` (the positions that get logits). Format 1 exports
# (logits at every position) still run.
# 3: the attention mask is additive float (0 / -65504) instead of boolean: same inputs and outputs, prompts
# several times faster on the CPU. Format 1 and 2 exports still run (and are redone by ``shoal export``).
READABLE_FORMATS = (1, 2, 3)
MANIFEST_NAME = "manifest.json"
LOGITS_INDEX = "logits_index"
"""Input of a format-2 graph holding the LM head: which positions of the step get logits (i64 ``[m]``)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of the export, relative to the export folder."""

    path: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        if Path(self.path).is_absolute() or ".." in Path(self.path).parts:
            raise ManifestError(f"manifest file path escapes the export folder: {self.path!r}")
        if len(self.sha256) != 64 or self.size < 0:
            raise ManifestError(f"manifest entry for {self.path} has a bad hash or size")

    @classmethod
    def of(cls, root: Path, path: Path) -> FileEntry:
        return cls(path=path.relative_to(root).as_posix(), sha256=sha256_file(path), size=path.stat().st_size)


@dataclass(frozen=True)
class GraphEntry:
    """One OpenVINO graph: a pipeline stage or a draft model."""

    name: str
    xml: str
    layer_start: int
    layer_stop: int
    embeddings: bool
    head: bool
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    files: tuple[FileEntry, ...]
    weights_bytes: int
    kv_bytes_per_token: int
    memory_bytes: int
    """Estimated resident memory: weights plus one session's KV cache at ``context_tokens``."""

    def __post_init__(self) -> None:
        if not 0 <= self.layer_start < self.layer_stop:
            raise ManifestError(f"{self.name}: empty or negative layer range {self.layer_start}..{self.layer_stop}")
        if self.xml not in {f.path for f in self.files}:
            raise ManifestError(f"{self.name}: graph {self.xml} is not among its files")

    @property
    def layers(self) -> range:
        """The decoder layers this graph holds."""
        return range(self.layer_start, self.layer_stop)

    @property
    def num_layers(self) -> int:
        return len(self.layers)


@dataclass(frozen=True)
class DraftEntry:
    """A draft model for speculative decoding: ``self`` (the target's first layers) or ``model``."""

    kind: str
    source: str
    arch: ArchSpec
    graph: GraphEntry

    def __post_init__(self) -> None:
        if self.kind not in ("self", "model"):
            raise ManifestError(f"draft kind must be 'self' or 'model', not {self.kind!r}")


@dataclass(frozen=True)
class SourceInfo:
    id: str
    kind: str
    revision: str


@dataclass(frozen=True)
class Manifest:
    """Everything a stage runtime or a head needs to know about an export."""

    source: SourceInfo
    arch: ArchSpec
    weights: str
    context_tokens: int
    stages: tuple[GraphEntry, ...]
    tokenizer_files: tuple[FileEntry, ...]
    draft: DraftEntry | None = None
    format_version: int = FORMAT_VERSION
    producer: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.format_version not in READABLE_FORMATS:
            raise ManifestError(_unsupported(self.format_version))
        if self.context_tokens < 1:
            raise ManifestError(f"a context of {self.context_tokens} tokens holds no prompt")
        if not self.stages:
            raise ManifestError("manifest lists no stages")
        expected = 0
        for stage in self.stages:
            if stage.layer_start != expected:
                raise ManifestError(f"{stage.name}: layers start at {stage.layer_start}, expected {expected}")
            expected = stage.layer_stop
        if expected != self.arch.num_layers:
            raise ManifestError(f"stages cover {expected} of {self.arch.num_layers} layers")
        if not self.stages[0].embeddings or not self.stages[-1].head:
            raise ManifestError("the first stage must hold the embeddings and the last the LM head")

    def with_context(self, context_tokens: int) -> Manifest:
        """This export at another context: the graphs take any number of positions (rotary phases are computed
        from ``position_ids`` in the graph), so only the manifest's context and memory estimates change."""

        def resized(graph: GraphEntry) -> GraphEntry:
            return replace(graph, memory_bytes=graph.weights_bytes + graph.kv_bytes_per_token * context_tokens)

        draft = None if self.draft is None else replace(self.draft, graph=resized(self.draft.graph))
        stages = tuple(resized(s) for s in self.stages)
        return replace(self, context_tokens=context_tokens, stages=stages, draft=draft)

    @property
    def export_id(self) -> str:
        """Short fingerprint of the stage graphs: every member of one ring must serve the same."""
        digest = hashlib.sha256()
        for stage in self.stages:
            for entry in stage.files:
                digest.update(entry.sha256.encode())
        return digest.hexdigest()[:16]

    # -- files ---------------------------------------------------------------------------------
    def all_files(self) -> list[FileEntry]:
        files = [f for s in self.stages for f in s.files] + list(self.tokenizer_files)
        if self.draft:
            files += self.draft.graph.files
        return files

    def verify(self, root: Path, graphs: list[GraphEntry] | None = None, progress: bool = True) -> None:
        """Check size and sha256 of every file (or of the given graphs' files and the tokenizer)."""
        files = self.all_files() if graphs is None else [f for g in graphs for f in g.files]
        total = sum(f.size for f in files)
        with tqdm(total=total, unit="B", unit_scale=True, desc="verify", leave=False, disable=not progress) as bar:
            for entry in files:
                path = root / entry.path
                if not path.is_file():
                    raise IntegrityError(f"{path}: missing (listed in {MANIFEST_NAME})")
                if path.stat().st_size != entry.size:
                    raise IntegrityError(
                        f"{path}: size {path.stat().st_size} does not match the manifest's {entry.size}"
                    )
                if sha256_file(path) != entry.sha256:
                    raise IntegrityError(f"{path}: sha256 does not match the manifest (corrupt or modified)")
                bar.update(entry.size)

    # -- (de)serialisation ---------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, root: Path) -> None:
        """Write ``manifest.json`` atomically (temporary file + rename)."""
        tmp = root / (MANIFEST_NAME + ".incomplete")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(root / MANIFEST_NAME)

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        try:
            version = data["format_version"]
            if version not in READABLE_FORMATS:
                raise ManifestError(_unsupported(version))
            draft = data.get("draft")
            return cls(
                source=SourceInfo(**data["source"]),
                arch=ArchSpec.from_json(data["arch"]),
                weights=str(data["weights"]),
                context_tokens=int(data["context_tokens"]),
                stages=tuple(_graph(s) for s in data["stages"]),
                tokenizer_files=tuple(FileEntry(**f) for f in data["tokenizer_files"]),
                draft=None
                if draft is None
                else DraftEntry(
                    kind=draft["kind"],
                    source=draft["source"],
                    arch=ArchSpec.from_json(draft["arch"]),
                    graph=_graph(draft["graph"]),
                ),
                format_version=version,
                producer=dict(data.get("producer", {})),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def load(cls, root: Path) -> Manifest:
        path = root / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(f"{root}: no {MANIFEST_NAME} (not an export folder, or an unfinished export)")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{path}: unreadable ({exc})") from exc
        return cls.from_json(data)


def _graph(data: dict[str, Any]) -> GraphEntry:
    data = dict(data)
    data["inputs"] = tuple(data["inputs"])
    data["outputs"] = tuple(data["outputs"])
    data["files"] = tuple(FileEntry(**f) for f in data["files"])
    return GraphEntry(**data)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    hash_file_into(digest, path)
    return digest.hexdigest()


def hash_file_into(digest: Any, path: Path, progress: Callable[[int], object] | None = None) -> None:
    """Feed a file's bytes into ``digest`` in 4 MiB chunks."""
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))


def _unsupported(version: object) -> str:
    readable = ", ".join(str(v) for v in READABLE_FORMATS)
    return f"manifest format {version} is not supported (this shoal reads formats {readable})"
