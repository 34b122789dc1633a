"""The lines ``shoal demo`` prints while its ring forms (issue 40 §5)."""

from __future__ import annotations

from agent.cli.demo_cmd import forming_line


def stage(index: int, node: str | None, name: str | None, state: str | None) -> dict[str, object]:
    return {"stage": index, "node": node, "name": name, "state": state, "standbys": [], "reason": ""}


def test_a_stage_no_node_holds_yet_is_uncovered_without_a_name() -> None:
    plan = {"stages": [stage(0, None, None, "uncovered"), stage(1, "n1", "demo-pc1", "ready")]}
    assert forming_line(plan) == "stage 0: uncovered, stage 1 demo-pc1: ready"


def test_a_holder_that_announced_nothing_yet_is_starting_and_an_unnamed_one_shows_its_id() -> None:
    plan = {"stages": [stage(0, "n3", "demo-pc3", None), stage(1, "4f2a", None, "compiling")]}
    assert forming_line(plan) == "stage 0 demo-pc3: starting, stage 1 4f2a: compiling"


def test_before_any_stage_the_plan_says_what_it_waits_for() -> None:
    assert forming_line({"stages": [], "waiting": "waiting for the fleet document"}) == "waiting for the fleet document"
    assert forming_line({"stages": []}) == "waiting for the plan"
