"""stdout is a command's results (issue 40 §5): the answer of ``shoal demo --headless`` and its plan, and nothing
of the libraries the export runs (nncf's log records and bit-width tables, its progress bars)."""

from __future__ import annotations

import subprocess
import sys

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
