"""One error tree: every error class of the product is defined in ``agent/errors.py``, derives from
``ShoalError``, and is drawn in that module's docstring."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

from agent import errors
from agent.errors import ShoalError

REPO = Path(__file__).parents[2]
PACKAGES = ("agent", "shards", "discovery", "tui", "bench")


def test_every_error_derives_from_the_root_and_is_drawn_in_the_tree() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 20
    for cls in classes:
        assert issubclass(cls, ShoalError), cls
        assert f" {cls.__name__} " in (errors.__doc__ or "").replace("\n", " "), f"{cls.__name__} is not drawn"


def _base_name(node: ast.expr) -> str:
    """``Exception``, ``ssl.SSLError`` -> ``SSLError``, ``Generic[T]`` -> ``Generic``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _exception_classes(classes: list[tuple[str, int, str, list[str]]]) -> set[str]:
    """The names, among ``classes`` (where, line, name, base names), of those that derive from an exception:
    a builtin one, one of ``agent.errors``, a foreign one (``*Error``, ``*Exception``), or one of these."""
    known = {name for name in dir(builtins) if isinstance(getattr(builtins, name), type)}
    known = {name for name in known if issubclass(getattr(builtins, name), BaseException)}
    known |= {name for name, _ in inspect.getmembers(errors, inspect.isclass)}
    found: set[str] = set()
    while True:
        more = {
            name
            for _, _, name, bases in classes
            if name not in found and any(b in known or b in found or b.endswith(("Error", "Exception")) for b in bases)
        }
        if not more:
            return found
        found |= more


def test_an_exception_class_is_known_by_what_it_derives_from() -> None:
    classes = [
        ("a.py:1", 1, "RingNotReady", ["PeerUnavailableError"]),
        ("a.py:2", 2, "Later", ["RingNotReady"]),
        ("a.py:3", 3, "_Signal", ["Exception"]),
        ("a.py:4", 4, "Mapped", ["SSLError"]),
        ("a.py:5", 5, "Plain", ["object"]),
        ("a.py:6", 6, "Box", ["Generic"]),
    ]
    assert _exception_classes(classes) == {"RingNotReady", "Later", "_Signal", "Mapped"}


def test_no_package_defines_an_error_class_of_its_own() -> None:
    """Every exception class is found by what it derives from, whatever its name (``RingNotReady`` was not an
    ``*Error``); only a module's private signal (``_NotYet``: raised and caught in that one module) may stay
    outside the tree, and never under an error's name."""
    classes = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "agent" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    where = f"{path.relative_to(REPO)}:{node.lineno}"
                    classes.append((where, node.lineno, node.name, [_base_name(b) for b in node.bases]))
    exceptions = _exception_classes(classes)
    outside = [
        f"{where} {name}"
        for where, _, name, _ in classes
        if name.endswith(("Error", "Exception")) or (name in exceptions and not name.startswith("_"))
    ]
    assert outside == []
