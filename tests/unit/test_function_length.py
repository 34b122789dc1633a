"""No function of the product is over ``LIMIT`` lines (issue 42 §5): a function that long does several jobs, and
the next reader has to hold all of them at once. Split it by job (a command's parser into the command's module,
a loop's parts into the methods of its state) rather than raise the limit."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).parents[2]
PACKAGES = ("agent", "discovery", "tui", "shards")
LIMIT = 100
"""Lines from a function's ``def`` to its last line, docstring and comments included."""


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each function in ``source`` longer than ``limit`` lines, nested ones too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, node.lineno, lines))
    return found


def test_a_function_is_measured_from_its_def_to_its_last_line() -> None:
    def function(header: str, lines: int, indent: str = "") -> str:
        return "".join([f"{indent}{header}\n", *(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))])

    assert long_functions(function("def at_the_limit():", LIMIT)) == []
    nested = "class A:\n" + function("async def over(self):", LIMIT + 1, indent="    ")
    assert long_functions(nested) == [("over", 2, LIMIT + 1)]


def test_no_function_is_over_the_limit() -> None:
    over = [
        f"{path.relative_to(REPO)}:{line} {name} ({lines} lines)"
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for name, line, lines in long_functions(path.read_text(encoding="utf-8"))
    ]
    assert over == []
