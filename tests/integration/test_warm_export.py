"""An export that is up to date for its source is recognised without opening or hashing the checkpoint, and
without importing the export stack (issue 40 §5: a warm ``make demo`` spent 13 s there)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from shards.manifest import Manifest

pytestmark = pytest.mark.processes


def test_a_current_export_is_reused_without_opening_or_hashing_its_checkpoint(
    exported: Callable[..., Path], cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shards.checkpoint import fingerprint
    from shards.export import exporter
    from shards.export.exporter import ExportRequest, export

    folder = exported(2, "fp32")  # made in this session with the same cache: its source's digest is remembered

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the checkpoint was opened or hashed")

    monkeypatch.setattr(exporter, "open_checkpoint", refuse)
    monkeypatch.setattr(fingerprint, "hash_file_into", refuse)
    manifest = export(ExportRequest(source="smollm2", out_dir=folder, stages=2, weights="fp32"), cache_dir)
    assert manifest == Manifest.load(folder)
    # another context (issue 40 §4): the graphs take any, so only the manifest is rewritten, as quickly
    shorter = export(
        ExportRequest(source="smollm2", out_dir=folder, stages=2, weights="fp32", context_tokens=2048), cache_dir
    )
    assert shorter == Manifest.load(folder) == manifest.with_context(2048)
    assert shorter.context_tokens == 2048 and shorter.export_id == manifest.export_id
    again = ExportRequest(source="smollm2", out_dir=folder, stages=2, weights="fp32", context_tokens=8192)
    assert export(again, cache_dir) == manifest  # the model's own, as the session's other tests expect


def test_telling_a_current_export_imports_neither_torch_nor_transformers(
    exported: Callable[..., Path], cache_dir: Path
) -> None:
    folder = exported(2, "fp32")
    script = (
        "import sys; from pathlib import Path\n"
        "from shards.export.request import ExportRequest, current_export\n"
        "request = ExportRequest(source='smollm2', out_dir=Path(sys.argv[1]), stages=2, weights='fp32')\n"
        "print(current_export(request, Path(sys.argv[2])) is not None)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'nncf', 'openvino', 'gguf') if m in sys.modules))\n"
        "other = ExportRequest(source='smollm2', out_dir=Path(sys.argv[1]), stages=3, weights='fp32')\n"
        "print(current_export(other, Path(sys.argv[2])) is None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder), str(cache_dir)], capture_output=True, encoding="utf-8", check=True
    )
    assert done.stdout.splitlines() == ["True", "[]", "True"], done.stderr
