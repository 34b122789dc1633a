"""The curve of ``python -m bench plot-users`` (bench.users_plot): aggregate tok/s against users per configuration,
read from a users report or a run's raw results, drawn as an SVG whose text stays text."""

from __future__ import annotations

import gc
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import BenchError
from bench.__main__ import main
from bench.users_plot import load_report, plot_users, users_curves


@pytest.fixture(autouse=True)
def fonts_closed() -> Iterator[None]:
    """matplotlib keeps the font files it measured text with open in a cache for the process; the leak guard would
    count them against the first test that drew, so each test lets go of them."""
    yield
    from matplotlib import font_manager

    font_manager._get_font.cache_clear()
    gc.collect()


def cell(tok_s: float) -> dict[str, Any]:
    return {"tok_s": tok_s}


REPORT: dict[str, Any] = {
    "settings": {"setups": [{"model": "smollm2", "stages": 2}], "tokens": 64},
    "cells": {
        "1": {"mono": cell(50.0), "cb": cell(60.0), "pp": cell(40.0), "packed": cell(39.0)},
        "16": {"cb": cell(300.0), "pp": cell(120.0), "packed": cell(310.0)},
        "2": {"cb": cell(100.0), "pp": cell(70.0), "packed": cell(80.0)},
        "8": {"cb": cell(250.0), "pp": cell(110.0), "packed": cell(None)},  # type: ignore[arg-type]
    },
}


def svg_texts(path: Path) -> list[str]:
    return [t.text or "" for t in ET.parse(path).iter() if t.tag.endswith("text")]


def test_curves_run_in_order_of_users_and_leave_out_missing_figures() -> None:
    curves = users_curves(REPORT)
    assert curves["pp"] == [(1, 40.0), (2, 70.0), (8, 110.0), (16, 120.0)]
    assert curves["packed"] == [(1, 39.0), (2, 80.0), (16, 310.0)]
    assert curves["mono"] == [(1, 50.0)]


def test_the_svg_names_every_configuration_and_is_the_same_each_time(tmp_path: Path) -> None:
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    plot_users(REPORT, first)
    plot_users(REPORT, second)
    texts = svg_texts(first)
    for label in ("cb", "pp", "packed", "mono (1 user, 1 core)", "goal (× mono)", "users", "16"):
        assert label in texts, label
    assert any("smollm2, 2 stages" in t for t in texts)
    assert first.read_bytes() == second.read_bytes()


def test_goals_are_marked_only_where_the_run_has_their_users(tmp_path: Path) -> None:
    few = {"settings": {}, "cells": {"1": {"mono": cell(50.0), "pp": cell(40.0)}, "4": {"pp": cell(90.0)}}}
    out = tmp_path / "few.svg"
    plot_users(few, out)
    assert "goal (× mono)" not in svg_texts(out)


def test_the_command_reads_raw_results_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = {
        "tok_s": 42.0,
        "per_user_tok_s": [21.0, 21.0],
        "ttft_s": [0.1, 0.1],
        "gap_p50_s": 0.02,
        "gap_p99_s": 0.05,
        "tokens": [[1, 2], [1, 2]],
        "load_before": 1.0,
        "load_after": 1.0,
    }
    raw = tmp_path / "results.json"
    raw.write_text(json.dumps({"settings": {}, "machine": {}, "runs": {"2": {"packed": [run]}}}))
    assert users_curves(load_report(raw)) == {"packed": [(2, 42.0)]}
    out = tmp_path / "plots" / "users.svg"
    assert main(["plot-users", str(raw), "--out", str(out)]) == 0
    assert "packed" in svg_texts(out)


def test_a_file_without_users_results_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"setups": []}))
    with pytest.raises(BenchError, match="no `python -m bench ring --users` results"):
        load_report(other)
