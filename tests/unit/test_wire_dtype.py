"""What hidden states cross the wire in: the dtype the stage computes in unless told otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import openvino as ov
import pytest

from agent.node.config import load_agent_config
from agent.runtime.protocol import wire_numpy_dtype
from agent.runtime.stage import _compiled_precision


class CompiledWith:
    """Answers INFERENCE_PRECISION_HINT as a compiled model does (None: a device without the property)."""

    def __init__(self, precision: ov.Type | None) -> None:
        self.precision = precision

    def get_property(self, name: str) -> ov.Type:
        assert name == "INFERENCE_PRECISION_HINT"
        if self.precision is None:
            raise RuntimeError("Unsupported property INFERENCE_PRECISION_HINT by this device")
        return self.precision


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (ov.Type.f32, "f32"),
        (ov.Type.bf16, "bf16"),
        (ov.Type.f16, "f16"),
        (None, None),
    ],
)
def test_the_compiled_precision_is_read_from_the_compiled_model(
    precision: ov.Type | None, expected: str | None
) -> None:
    assert _compiled_precision(CompiledWith(precision)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("choice", "computes_in", "dtype"),
    [
        ("auto", "f16", np.float16),  # f16 values: sending them in f16 loses nothing
        ("auto", "f32", np.float32),
        ("f32", "f16", np.float32),
        ("f16", "f32", np.float16),  # asked for: half the bytes, rounded
    ],
)
def test_auto_sends_what_the_stage_computes_in(choice: str, computes_in: str, dtype: type) -> None:
    assert wire_numpy_dtype(choice, SimpleNamespace(wire_dtype=computes_in)) is dtype  # type: ignore[arg-type]


def test_an_unknown_wire_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="f8"):
        wire_numpy_dtype("f8", SimpleNamespace(wire_dtype="f32"))  # type: ignore[arg-type]


def test_agents_default_to_auto() -> None:
    assert load_agent_config(None, {"export_dir": "e", "stages": [0], "identity_dir": "i"}).wire_dtype == "auto"
