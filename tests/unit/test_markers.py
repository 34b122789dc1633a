"""Markers say what a test needs (issue 42 §9): ``slow`` follows from ``openvino``, ``processes`` and ``root``,
so that ``-m fast`` and ``-m "not slow"`` select the same tests, and a test of tests/integration that names
no need stops the collection instead of passing for fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import pytest_collection_modifyitems

TESTS = Path(__file__).parents[1]


class FakeItem:
    """The part of a ``pytest.Item`` that the collection hook reads and writes."""

    def __init__(self, folder: str, fixtures: tuple[str, ...] = (), marks: tuple[str, ...] = ()) -> None:
        self.path = TESTS / folder / "test_x.py"
        self.nodeid = f"tests/{folder}/test_x.py::test_x"
        self.fixturenames = list(fixtures)
        self.marks = set(marks)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.add(mark.name)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def collected(*items: FakeItem) -> list[set[str]]:
    pytest_collection_modifyitems(list(items))  # type: ignore[arg-type]
    return [item.marks for item in items]


def test_slow_follows_from_what_a_test_needs_and_fast_is_every_other_test() -> None:
    model, process, plain, lab = collected(
        FakeItem("unit", fixtures=("tmp_path", "exported")),
        FakeItem("integration", marks=("processes",)),
        FakeItem("unit", fixtures=("tmp_path",), marks=("tui",)),
        FakeItem("lab"),
    )
    assert model == {"openvino", "slow"}
    assert process == {"processes", "slow"}
    assert plain == {"tui", "fast"}
    assert lab == {"lab", "root", "slow"}


def test_an_integration_test_that_names_no_need_stops_the_collection() -> None:
    with pytest.raises(pytest.UsageError, match=r"tests/integration/test_x.py::test_x"):
        collected(FakeItem("integration", fixtures=("tmp_path",)))
