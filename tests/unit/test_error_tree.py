"""One error tree: every error class of the product is defined in ``agent/errors.py``, derives from
``ShoalError``, and is drawn in that module's docstring."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from agent import errors
from agent.errors import ShoalError

REPO = Path(__file__).parents[2]


def test_every_error_derives_from_the_root_and_is_drawn_in_the_tree() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 20
    for cls in classes:
        assert issubclass(cls, ShoalError), cls
        assert f" {cls.__name__} " in (errors.__doc__ or "").replace("\n", " "), f"{cls.__name__} is not drawn"


def test_no_package_defines_an_error_class_of_its_own() -> None:
    outside = []
    for package in ("agent", "shards", "discovery", "tui", "bench"):
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "agent" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and (node.name.endswith("Error") or node.name.endswith("Exception")):
                    outside.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert outside == []
