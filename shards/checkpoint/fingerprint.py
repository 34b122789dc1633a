"""A local checkpoint's revision: the sha256 of its files, remembered while none of them changes.

An export records the revision of the checkpoint it was made from, and a later ``shoal export`` (each
``shoal demo``) reuses the export while the revision is the same. Hashing the files again each time costs a
full read of them (the demo's 98 MB GGUF, a 1.1 GB Qwen); as make and ninja judge an input unchanged by its
``stat``, the digest is kept in the cache with each file's path, size and modification time, and holds for as
long as they all still match. Nothing here imports torch or transformers: a current export is recognised
before the export stack is loaded (``shards.export.request``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from shards.manifest import hash_file_into

log = logging.getLogger(__name__)

FINGERPRINTS_FILE = "fingerprints.json"
"""Where in the cache folder the remembered digests are kept."""
_FORMAT = 1


@dataclass(frozen=True)
class FileStamp:
    """What says that a file is unchanged: its absolute path, size and modification time (ns)."""

    path: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileStamp:
        stat = path.stat()
        return cls(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


def revision_files(source: Path) -> list[Path]:
    """The files whose bytes make a local checkpoint's revision: a GGUF file itself, or a model folder's
    ``config.json`` and its ``*.safetensors`` in name order."""
    if source.is_file():
        return [source]
    return [source / "config.json", *sorted(source.glob("*.safetensors"))]


def local_revision(source: Path, fingerprints: FingerprintStore | None) -> str:
    """The revision of the checkpoint at ``source`` (a GGUF file or a model folder): its files' sha256, from
    ``fingerprints`` while they are unchanged (None: hashed now)."""
    files, desc = revision_files(source), f"hash {source.name}"
    return fingerprints.fingerprint(files, desc) if fingerprints is not None else sha256_files(files, desc)


def sha256_files(paths: Sequence[Path], desc: str = "fingerprint") -> str:
    """sha256 over the bytes of several files in order, with a progress bar."""
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False) as bar:
        for path in paths:
            hash_file_into(digest, path, bar.update)
    return "sha256:" + digest.hexdigest()


class FingerprintStore:
    """The digests of files hashed before, each with the stamps of the files it covers (a JSON file)."""

    def __init__(self, file: Path) -> None:
        self.file = file

    @classmethod
    def in_cache(cls, cache_dir: Path) -> FingerprintStore:
        return cls(cache_dir / FINGERPRINTS_FILE)

    def known(self, paths: Sequence[Path]) -> str | None:
        """The digest of ``paths`` if they were hashed and none changed since (None: hash them)."""
        try:
            files = _stamped([FileStamp.of(p) for p in paths])
        except OSError:
            return None
        return next((entry["sha256"] for entry in self._entries() if entry["files"] == files), None)

    def fingerprint(self, paths: Sequence[Path], desc: str = "fingerprint") -> str:
        """The sha256 of ``paths`` (as :func:`sha256_files`), read from the store while they are unchanged."""
        known = self.known(paths)
        if known is not None:
            return known
        stamps = [FileStamp.of(p) for p in paths]  # before reading: a file changed meanwhile is hashed anew later
        digest = sha256_files(paths, desc)
        self._remember(stamps, digest)
        return digest

    def _entries(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.file.read_text())
            entries = data["entries"] if data.get("format") == _FORMAT else []
            return [e for e in entries if isinstance(e.get("files"), list) and isinstance(e.get("sha256"), str)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []  # none yet, or unreadable: the files are hashed again and the store rewritten

    def _remember(self, stamps: Sequence[FileStamp], digest: str) -> None:
        files = _stamped(stamps)
        paths = [stamp[0] for stamp in files]
        # one digest per set of paths: the older stamps of the same files are of no further use
        entries = [e for e in self._entries() if [f[0] for f in e["files"] if f] != paths]
        entries.append({"files": files, "sha256": digest})
        partial = self.file.with_name(f"{self.file.name}.{os.getpid()}.incomplete")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"format": _FORMAT, "entries": entries}, indent=1))
            os.replace(partial, self.file)  # whole or not at all, also beside another process writing it
        except OSError as exc:  # a cache that cannot be written only costs a hash next time
            log.warning("cannot remember checkpoint digests in %s: %s", self.file, exc)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)


def _stamped(stamps: Sequence[FileStamp]) -> list[list[Any]]:
    """Stamps as the store keeps them (JSON lists, compared as such)."""
    return [[s.path, s.size, s.mtime_ns] for s in stamps]
