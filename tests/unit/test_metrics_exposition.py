"""``agent.metrics.exposition`` over status documents as agents report them (issue 40 §6): every figure is
there, at 0, where an agent has nothing of it to count, and counts what it names."""

from __future__ import annotations

from typing import Any

from agent.metrics.exposition import render_metrics
from tests.support.metric_samples import metric_samples


def _samples(status: dict[str, Any]) -> dict[str, float]:
    return metric_samples(render_metrics(lambda: status)().decode())


def test_an_agent_that_knows_no_member_says_0_of_each_state() -> None:
    """A ring wired by hand has a membership that knows nobody: each state is 0, not a family without samples."""
    samples = _samples({"node": "n1", "members": {"members": []}})
    assert samples["shoal_fleet_members{state=member}"] == 0
    assert samples["shoal_fleet_members{state=lost}"] == 0
    known = _samples({"node": "n1", "members": {"members": [{"state": "member"}, {"state": "member"}]}})
    assert known["shoal_fleet_members{state=member}"] == 2 and known["shoal_fleet_members{state=revoked}"] == 0


def test_a_stage_only_agent_reports_its_figures_and_no_chat_ones() -> None:
    status = {
        "node": "n2",
        "sessions": ["00000000000000aa"],
        "steps_served": 5,
        "compute_seconds": 0.5,
        "http": {"refused": {"unauthorized": 2}},
    }
    samples = _samples(status)
    assert samples["shoal_sessions_open"] == 1 and samples["shoal_stage_steps_total"] == 5
    assert samples["shoal_chat_errors_total{code=unauthorized}"] == 2
    assert not any(name.startswith("shoal_chat_answers") for name in samples)


def test_the_stages_figures_add_the_chats_own_in_process_work_to_the_rings() -> None:
    status = {
        "node": "n3",
        "sessions": [],
        "steps_served": 4,
        "compute_seconds": 1.0,
        "local_steps": 6,
        "local_compute_seconds": 0.5,
        "chat": {"local_sessions": 2, "refused": {"bad_request": 1}},
        "http": {"refused": {"bad_request": 2, "not_found": 1}},
    }
    samples = _samples(status)
    assert samples["shoal_sessions_open"] == 2
    assert samples["shoal_stage_steps_total"] == 10 and samples["shoal_stage_compute_seconds_total"] == 1.5
    assert samples["shoal_chat_errors_total{code=bad_request}"] == 3
    assert samples["shoal_chat_errors_total{code=not_found}"] == 1


def test_a_donor_says_what_it_does_now_and_an_agent_that_is_no_donor_says_nothing() -> None:
    samples = _samples({"node": "n3", "donor": {"state": "away", "reason": "keyboard or mouse used 2 s ago"}})
    assert samples["shoal_donor_state{state=away}"] == 1
    assert samples["shoal_donor_state{state=serving}"] == 0 and samples["shoal_donor_state{state=off}"] == 0
    assert not any(name.startswith("shoal_donor") for name in _samples({"node": "n3"}))


def test_packs_count_the_rings_and_the_heads_own_and_are_0_where_none_were_made() -> None:
    status = {
        "node": "n4",
        "packs": 3,
        "packed_steps": 7,
        "chat": {"local_packs": 2, "local_packed_steps": 9},
    }
    samples = _samples(status)
    assert samples["shoal_stage_packs_total"] == 5 and samples["shoal_stage_packed_steps_total"] == 16
    alone = _samples({"node": "n5"})
    assert alone["shoal_stage_packs_total"] == 0 and alone["shoal_stage_packed_steps_total"] == 0
