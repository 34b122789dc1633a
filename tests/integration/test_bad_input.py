"""Acceptance 5: bad input ends in one line on stderr, a non-zero exit, and nothing half-written."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from agent.errors import CorruptCheckpointError

pytestmark = pytest.mark.processes


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def shoal(*args: str, cache: Path) -> CliResult:
    """``shoal ARGS`` through the CLI's ``main``, in this process: a new Python would spend ~12 s importing
    transformers and torch before reaching the check under test (one test, ``test_generate_prints_only_the
    _completion``, runs the real command line in its own process)."""
    from agent.cli.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(["--cache-dir", str(cache), *args])
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code if isinstance(exc.code, int) else 1
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


def assert_one_line_failure(result: CliResult, *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("shoal: error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in errors[0]
    assert result.stdout == ""


def assert_nothing_left(out: Path) -> None:
    assert not out.exists()
    assert not out.with_name(out.name + ".incomplete").exists()


def test_unsupported_architecture(tmp_path: Path, cache_dir: Path) -> None:
    from safetensors.torch import save_file

    model = tmp_path / "gpt2-like"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2}))
    save_file({"wte.weight": torch.zeros(4, 8)}, str(model / "model.safetensors"))
    out = tmp_path / "out"
    result = shoal("export", str(model), "--stages", "2", "--out", str(out), cache=cache_dir)
    assert_one_line_failure(result, "unsupported architecture 'gpt2'", "Llama", "Qwen2")
    assert_nothing_left(out)


def test_more_stages_than_layers(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    result = shoal("export", "smollm2", "--stages", "31", "--out", str(out), cache=cache_dir)
    assert_one_line_failure(result, "30 layers", "31 stages")
    assert_nothing_left(out)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupt_gguf(damage: str, tmp_path: Path, cache_dir: Path, smollm2_gguf: Path) -> None:
    bad = tmp_path / "bad.gguf"
    data = smollm2_gguf.read_bytes()
    bad.write_bytes(data[: len(data) // 5] if damage == "truncated" else b"\x00garbage" * 4096)
    out = tmp_path / "out"
    result = shoal("export", str(bad), "--stages", "2", "--out", str(out), cache=cache_dir)
    assert_one_line_failure(result, "bad.gguf", "not a readable GGUF")
    assert_nothing_left(out)


def test_missing_source(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    result = shoal("export", str(tmp_path / "absent.gguf"), "--stages", "2", "--out", str(out), cache=cache_dir)
    assert_one_line_failure(result, "absent.gguf", "no such file")
    assert_nothing_left(out)


def test_failure_mid_export_leaves_nothing(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that breaks while the second stage is loading (the first one written) leaves no folder
    behind. Ten stages: the first, written before the failure, holds two layers rather than half the model."""
    from shards.checkpoint.gguf_file import GgufCheckpoint
    from shards.export.exporter import ExportRequest, export

    real_tensor = GgufCheckpoint.tensor
    out = tmp_path / "out"
    staging = out.with_name(out.name + ".incomplete")

    def failing_tensor(self: GgufCheckpoint, name: str) -> torch.Tensor:
        if name.startswith("model.layers.") and (staging / "stage-1").exists():
            assert (staging / "stage-0" / "openvino_model.xml").exists()
            raise CorruptCheckpointError(f"simulated read error in {name}")
        return real_tensor(self, name)

    monkeypatch.setattr(GgufCheckpoint, "tensor", failing_tensor)
    with pytest.raises(CorruptCheckpointError, match="simulated read error"):
        export(ExportRequest(source="smollm2", out_dir=out, stages=10, weights="fp16"), cache_dir, progress=False)
    assert_nothing_left(out)


@pytest.mark.parametrize("damage", ["flipped byte", "missing file", "bad manifest"])
def test_damaged_export_is_refused(damage: str, tmp_path: Path, cache_dir: Path, exported: Callable[..., Path]) -> None:
    folder = tmp_path / "export"
    shutil.copytree(exported(1, "int4"), folder)  # the smallest export: 87 MB to copy and hash, not 630
    weights = folder / "stage-0" / "openvino_model.bin"
    if damage == "flipped byte":
        with weights.open("r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0xFF]))
        needle = "sha256 does not match"
    elif damage == "missing file":
        weights.unlink()
        needle = "missing"
    else:
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["format_version"] = 99
        (folder / "manifest.json").write_text(json.dumps(manifest))
        needle = "format 99 is not supported"
    result = shoal("generate", str(folder), "hello", "--max-tokens", "4", cache=cache_dir)
    assert_one_line_failure(result, needle)


def test_export_over_foreign_folder_is_refused(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("not an export")
    result = shoal("export", "smollm2", "--stages", "2", "--out", str(out), cache=cache_dir)
    assert_one_line_failure(result, "is not an export")
    assert (out / "notes.txt").read_text() == "not an export"


@pytest.mark.parametrize("edit", ["none", "older format", "other split"])
def test_export_is_reused_only_when_current(edit: str, tmp_path: Path, exported: Callable[..., Path]) -> None:
    from shards.checkpoint import open_checkpoint
    from shards.export.request import ExportRequest, reusable
    from shards.export.split import plan_layer_split
    from shards.manifest import Manifest

    source = exported(2, "fp32")
    folder = tmp_path / "export"
    folder.mkdir()
    manifest = json.loads((source / "manifest.json").read_text())
    if edit == "older format":
        manifest["format_version"] = 1
    elif edit == "other split":
        first, second = manifest["stages"]
        first["layer_stop"] = second["layer_start"] = first["layer_stop"] + 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    old = Manifest.load(folder)
    ranges = plan_layer_split(old.arch, 2, "fp32")
    revision = open_checkpoint("smollm2", tmp_path / "cache").revision()
    existing, replace = reusable(
        ExportRequest(source="smollm2", out_dir=folder, stages=2, weights="fp32"), revision, ranges, old.context_tokens
    )
    if edit == "none":
        assert existing is not None and not replace
    else:
        assert existing is None and replace  # redone, never refused: the inputs are the same


def test_sigterm_mid_export_leaves_nothing(tmp_path: Path, cache_dir: Path) -> None:
    """``kill`` (SIGTERM) of a running ``shoal export`` cleans up as Ctrl-C does (issue 22 §4)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    command = [sys.executable, "-m", "agent.cli.main", "--cache-dir", str(cache_dir), "export", "smollm2"]
    process = subprocess.Popen(
        [*command, "--stages", "2", "--weights", "fp16", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    staging = out.with_name(out.name + ".incomplete")
    try:
        deadline = time.monotonic() + 180
        while not staging.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert staging.exists(), "the export never began writing"
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
    assert_nothing_left(out)
