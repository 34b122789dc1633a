"""Tokenizer files are built once per checkpoint revision; a failed build leaves nothing that looks done."""

from __future__ import annotations

from pathlib import Path

import pytest

from shards.export.tokenizer_files import write_tokenizer


class CountingCheckpoint:
    """A checkpoint whose tokenizer is one file naming the build that wrote it."""

    source_id = "counting"
    kind = "gguf"
    config = None

    def __init__(self, fail: bool = False) -> None:
        self.builds = 0
        self.fail = fail

    def save_tokenizer(self, out_dir: Path) -> None:
        self.builds += 1
        (out_dir / "tokenizer.json").write_text(f"build {self.builds}")
        if self.fail:
            raise OSError("disk full")


def test_a_revision_is_built_once_and_copied_after(tmp_path: Path) -> None:
    checkpoint = CountingCheckpoint()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        write_tokenizer(checkpoint, "sha256:1", tmp_path / name, tmp_path / "cache")  # type: ignore[arg-type]
    assert checkpoint.builds == 1
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    (tmp_path / "c").mkdir()
    write_tokenizer(checkpoint, "sha256:2", tmp_path / "c", tmp_path / "cache")  # type: ignore[arg-type]
    assert checkpoint.builds == 2 and (tmp_path / "c" / "tokenizer.json").read_text() == "build 2"


def test_a_failed_build_is_not_cached(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(OSError, match="disk full"):
        write_tokenizer(CountingCheckpoint(fail=True), "sha256:1", tmp_path / "out", tmp_path / "cache")  # type: ignore[arg-type]
    assert list((tmp_path / "cache" / "tokenizers").iterdir()) == []
    checkpoint = CountingCheckpoint()
    write_tokenizer(checkpoint, "sha256:1", tmp_path / "out", tmp_path / "cache")  # type: ignore[arg-type]
    assert checkpoint.builds == 1
