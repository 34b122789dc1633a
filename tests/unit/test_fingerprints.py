"""A local checkpoint's digest is remembered by its files' size and modification time (issue 40 §5)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from shards.checkpoint import fingerprint
from shards.checkpoint.fingerprint import FingerprintStore, local_revision, revision_files


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files hashed (every read of a checkpoint's bytes goes through ``hash_file_into``)."""
    seen: list[Path] = []
    hash_file_into = fingerprint.hash_file_into

    def counted(digest: object, path: Path, progress: object = None) -> None:
        seen.append(path)
        hash_file_into(digest, path, progress)  # type: ignore[arg-type]

    monkeypatch.setattr(fingerprint, "hash_file_into", counted)
    return seen


def sha256(*contents: bytes) -> str:
    return "sha256:" + hashlib.sha256(b"".join(contents)).hexdigest()


def test_an_unchanged_file_is_hashed_once_across_stores_of_the_same_cache(tmp_path: Path, reads: list[Path]) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"weights")
    first = FingerprintStore.in_cache(tmp_path / "cache")
    assert first.known([gguf]) is None
    assert local_revision(gguf, first) == sha256(b"weights")
    assert reads == [gguf]
    again = FingerprintStore.in_cache(tmp_path / "cache")  # another run of shoal
    assert again.known([gguf]) == sha256(b"weights")
    assert local_revision(gguf, again) == sha256(b"weights")
    assert reads == [gguf]


def test_a_file_with_another_size_or_time_is_hashed_again_and_replaces_its_old_digest(
    tmp_path: Path, reads: list[Path]
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"weights")
    store = FingerprintStore.in_cache(tmp_path)
    local_revision(gguf, store)
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # touched: same bytes, new time
    assert store.known([gguf]) is None
    assert local_revision(gguf, store) == sha256(b"weights")
    gguf.write_bytes(b"other weights")  # rewritten: new size
    assert store.known([gguf]) is None
    assert local_revision(gguf, store) == sha256(b"other weights")
    assert reads == [gguf, gguf, gguf]
    assert '"entries"' in store.file.read_text() and store.file.read_text().count('"sha256"') == 1


def test_a_model_folder_is_its_config_and_weights_in_order_and_an_unreadable_store_is_no_store(
    tmp_path: Path, reads: list[Path]
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for name, data in (("config.json", b"{}"), ("b.safetensors", b"B"), ("a.safetensors", b"A")):
        (folder / name).write_bytes(data)
    assert revision_files(folder) == [folder / "config.json", folder / "a.safetensors", folder / "b.safetensors"]
    store = FingerprintStore.in_cache(tmp_path / "cache")
    store.file.parent.mkdir()
    store.file.write_text("{not json")
    assert local_revision(folder, store) == sha256(b"{}", b"A", b"B")
    assert local_revision(folder, store) == sha256(b"{}", b"A", b"B")
    assert local_revision(folder, None) == sha256(b"{}", b"A", b"B")  # no store: hashed each time
    assert len(reads) == 6
