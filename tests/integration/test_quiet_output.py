"""stdout is a command's results (issue 40 §5): the answer of ``shoal demo --headless`` and its plan, and nothing
of the libraries the export runs (nncf's log records and bit-width tables, its progress bars). ``shoal generate``'s
stdout is checked in ``test_export_graphs.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

COMPRESS_A_TOY_GRAPH = """
import logging, sys
import numpy as np, openvino as ov
from openvino import opset13 as ops
from shards.export.convert import compress_weights
if sys.argv[1] == "verbose":
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)  # as `shoal -v` configures logging
x = ops.parameter([1, 64], ov.Type.f32, name="x")
y = ops.matmul(x, ops.constant(np.ones((128, 64), dtype=np.float32)), False, True)
compress_weights(ov.Model([y], [x]), "int8", False, True)
print("compressed")
"""


def compress(verbosity: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", COMPRESS_A_TOY_GRAPH, verbosity],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
        check=True,
    )


def test_weight_compression_writes_nothing_on_stdout_and_logs_at_the_applications_level() -> None:
    quiet, verbose = compress("quiet"), compress("verbose")
    assert quiet.stdout == verbose.stdout == "compressed\n"
    assert "nncf" not in quiet.stderr and "Applying Weight Compression" not in quiet.stderr
    # with the CLI's -v, nncf's records and bars are on stderr, as the application's log lines
    assert "INFO:nncf:Statistics of the bitwidth distribution" in verbose.stderr
    assert "Applying Weight Compression" in verbose.stderr


def test_the_demo_prints_only_its_answer_and_the_plan_on_stdout(cache_dir: Path, tmp_path: Path) -> None:
    """A first ``shoal demo --headless``: it exports (nncf compresses every stage), forms the ring, answers; stdout
    holds the answer, then the plan's lines, and nothing else."""
    env = {**os.environ, "SHOAL_CACHE_DIR": str(cache_dir), "SHOAL_DATA_DIR": str(tmp_path / "data")}
    command = [sys.executable, "-m", "agent.cli.main", "demo", "--headless", "--stages", "2", "--max-tokens", "24"]
    done = subprocess.run(
        [*command, "--prompt", "What is the capital of France?", "--out", str(tmp_path / "export")],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=400,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the ring formed" in done.stderr
    lines = done.stdout.rstrip("\n").split("\n")
    plan_at = next(i for i, line in enumerate(lines) if line.startswith("plan "))
    answer, plan = lines[:plan_at], lines[plan_at:]
    assert re.fullmatch(r"plan [0-9a-f]{12} epoch \d+ for document \d+ \(planned by demo-pc\d\): ready", plan[0])
    assert plan[1].startswith("  model ") and "context" in plan[1], plan  # the model and its context, then stages
    assert [line.split(":")[0] for line in plan[2:]] == ["  stage 0", "  stage 1"], plan
    assert "".join(answer).strip(), done.stdout
    for noise in ("nncf", "INFO", "WARNING", "━", "Weight Compression", "%|", "tok/s"):
        assert noise not in done.stdout, noise
