"""The plain-view GGUF reader reads exactly what gguf-py's own reader reads."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from shards.checkpoint.gguf_reader import PlainViewGGUFReader


def test_fields_and_tensors_equal_the_stock_reader(smollm2_gguf: Path) -> None:
    stock, plain = gguf.GGUFReader(str(smollm2_gguf)), PlainViewGGUFReader(str(smollm2_gguf))
    assert list(plain.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        ours = plain.fields[name]
        assert (ours.offset, ours.data, ours.types) == (field.offset, field.data, field.types), name
        assert all(np.array_equal(a, b) for a, b in zip(ours.parts, field.parts, strict=True)), name
    assert [t.name for t in plain.tensors] == [t.name for t in stock.tensors]
    for ours, theirs in zip(plain.tensors, stock.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type and np.array_equal(ours.data, theirs.data), ours.name
