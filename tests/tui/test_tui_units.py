"""The TUI's pure parts with plain values: the fleet report of a status document, the settings, an answer's
tally and stats line, the rate history; and the SQLite store on a temporary file."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from agent.chat_client.protocol import ChatEvent
from agent.errors import ConfigError
from tests.tui.fakes import NODES, FixedClock, fleet_status, peer_statuses, stage_status
from tui.answer import AnswerTally, stats_line
from tui.fleet import StageLoad, fleet_report, peer_addresses, stage_load, unreachable
from tui.fleet_columns import BAR_MAX, COLUMNS, layout_for, row_cells, span_bar, table_width
from tui.generation import GenerationSettings
from tui.store import ConversationStore, title_of
from tui.throughput import RateHistory

pytestmark = pytest.mark.tui


def test_a_ready_ring_reports_each_stage_its_standbys_and_the_members_apart() -> None:
    report = fleet_report(fleet_status())
    assert (report.banner, report.severity, report.headline) == ("Ring ready: 3 stages", "ok", "ring ready · 3 stages")
    assert report.ready
    assert [(row.stage, row.state.name, row.state.text) for row in report.stages] == [
        (0, "alpha", "ready"),
        (1, "beta", "ready"),
        (2, "gamma", "ready"),
    ]
    assert [s.text for s in report.stages[1].standbys] == ["downloading 40 %"]
    assert [(m.name, m.role) for m in report.others] == [("epsilon", "standby for stage 1")]
    assert report.summary == "model smollm2-3stage · plan 3f77186a epoch 4 · coordinator alpha · this PC delta"


def test_an_uncovered_stage_a_download_and_a_lost_member_are_said_first() -> None:
    uncovered = fleet_report(fleet_status(stage0=None))
    assert uncovered.severity == "error" and uncovered.headline == "stage 0 uncovered"
    assert uncovered.banner == "Stage 0 is uncovered: every member that can hold it serves another stage"
    assert uncovered.stages[0].holder is None and uncovered.stages[0].state.health == "bad"
    assert ("alpha", "spare: the plan needs no more PCs") in [(m.name, m.role) for m in uncovered.others]

    downloading = fleet_report(fleet_status(ready=False))
    assert downloading.severity == "warning" and downloading.banner == "Ring not ready: stage 2 on gamma is downloading"
    assert downloading.stages[2].state.text == "downloading 70 %"

    lost = fleet_report(fleet_status(lost="beta"))
    assert lost.severity == "error" and lost.banner == "Stage 1 is lost: beta is unheard"
    assert lost.stages[1].state.state == "lost"


def test_odd_or_missing_sections_never_raise() -> None:
    hand_wired = fleet_report({"node": "pc1", "stages": [0, 1]})
    assert hand_wired.headline == "ring wired by hand" and "serves stages: 0, 1" in hand_wired.summary
    no_model = fleet_report({"plan": {"model": None, "stages": [], "hash": None}, "members": {"members": []}})
    assert no_model.severity == "warning" and "serves no model" in no_model.banner
    garbage = fleet_report({"plan": {"model": "m", "hash": "h", "stages": [1, {"stage": "x"}, None]}, "members": 3})
    assert garbage.stages == () and garbage.others == ()
    assert unreachable("refused").banner == "Agent unreachable: refused"


def test_each_stage_shows_its_own_agents_figures_and_its_share_of_the_rings_time() -> None:
    report = fleet_report(fleet_status(), peer_statuses())
    assert report.layers == 30 and [row.layers for row in report.stages] == [(0, 10), (10, 20), (20, 30)]
    assert [row.load for row in report.stages] == [
        StageLoad("CPU", 8.0, 2, 1, 812),
        StageLoad("CPU", 24.0, 2, 1, 1630),
        StageLoad("CPU", 8.0, 3, 0, 790),
    ]
    assert [row.share for row in report.stages] == [0.2, 0.6, 0.2]  # beta sets the pace
    # beside the documents of the poll before, the latency is the recent steps': 100 steps of 20 ms since
    now = peer_statuses()
    now[NODES["alpha"]] = stage_status("alpha", steps=500, step_ms=(400 * 8.0 + 100 * 20.0) / 500)
    recent = fleet_report(fleet_status(), now, peer_statuses())
    assert recent.stages[0].load.step_ms == pytest.approx(20.0)
    # one agent unheard from: its figures are unknown, and no share is made up from the others
    partial = fleet_report(fleet_status(), {k: v for k, v in peer_statuses().items() if k != NODES["gamma"]})
    assert partial.stages[2].load == StageLoad(device="CPU")  # the device its announcement names
    assert [row.share for row in partial.stages] == [None, None, None]
    # a stage lost meanwhile: its last figures are no longer true
    lost = fleet_report(fleet_status(lost="beta"), peer_statuses())
    assert lost.stages[1].state.state == "lost" and lost.stages[1].load.step_ms is None


def test_the_head_holding_a_stage_reads_its_figures_from_its_own_status() -> None:
    status = fleet_status()
    status["members"]["node"] = NODES["alpha"]  # this PC is alpha: no status to ask for, its own has them
    status["members"]["members"] = [m for m in status["members"]["members"] if m["name"] != "alpha"]
    status.update(stage_status("alpha", step_ms=5.0, memory_mb=700))
    report = fleet_report(status, {NODES["beta"]: stage_status("beta", step_ms=15.0)})
    assert [row.load.step_ms for row in report.stages] == [5.0, 15.0, None]
    assert report.stages[0].load.memory_mb == 700
    assert NODES["alpha"] not in peer_addresses(status)


def test_the_agents_to_ask_are_the_plans_nodes_that_are_members() -> None:
    addresses = peer_addresses(fleet_status(lost="gamma"))
    assert addresses == {NODES["alpha"]: "127.0.0.1:44005", NODES["beta"]: "127.0.0.1:44004"}
    assert peer_addresses({"stages": [0]}) == {} and peer_addresses({"plan": {}, "members": {"members": 7}}) == {}


def test_odd_stage_agent_documents_never_raise_and_show_as_unknown() -> None:
    assert stage_load(None) == StageLoad()
    odd = {"device": 3, "sessions": "two", "parked": -1, "memory_mb": True, "step_seconds": {"count": "x", "sum": 1}}
    assert stage_load(odd) == StageLoad()
    assert stage_load({"step_seconds": {"count": 0, "sum": 0.0}}).step_ms is None
    # a restarted agent counts from zero again: the lifetime mean, not a negative difference
    assert stage_load(stage_status("a", steps=10, step_ms=3.0), stage_status("a", steps=900)).step_ms == 3.0
    status = fleet_status()
    status["plan"]["layers"] = "thirty"
    status["plan"]["stages"][0]["layers"] = [10, 5]
    report = fleet_report(status, {NODES["alpha"]: [], NODES["beta"]: {"step_seconds": None}})  # type: ignore[dict-item]
    assert report.layers is None and report.stages[0].layers is None
    layouts = [layout_for(report, width) for width in (0, 10, 80, 200)]
    cells = dict(zip(layouts[-1].keys, row_cells(report.stages[0], report.layers, layouts[-1]), strict=True))
    assert cells["layers"] == cells["step"] == cells["memory"] == cells["share"] == "—"
    assert cells["device"] == "CPU"  # alpha's status was no document: what it announces stands in


def test_a_span_bar_fills_the_stages_part_of_the_model() -> None:
    assert span_bar((0, 10), 30, 9) == "███░░░░░░"
    assert span_bar((10, 20), 30, 9) == "░░░███░░░"
    assert span_bar((29, 30), 30, 15) == "░░░░░░░░░░░░░░█"
    assert span_bar((50, 51), 100, 8) == "░░░░█░░░"  # one layer of a hundred still shows
    assert span_bar(None, 30, 9) is None and span_bar((0, 10), None, 9) is None
    assert span_bar((0, 40), 30, 9) is None and span_bar((5, 5), 30, 9) is None


def test_the_stage_table_keeps_what_fits_and_gives_the_rest_to_the_bars() -> None:
    report = fleet_report(fleet_status(), peer_statuses())
    wide = layout_for(report, 200)
    assert wide.keys == tuple(c.key for c in COLUMNS) and wide.ranges and wide.bar == BAR_MAX
    assert layout_for(report, 125).bar == 21  # what is left over, in a count where the three stages are equal
    at_80 = layout_for(report, 78)  # the F2 page of an 80-column terminal: abbreviated, the layers' range kept
    assert at_80.headers() == ("#", "Node", "Layers", "Dev", "State", "Step", "Sess", "Mem", "Share")
    assert at_80.ranges and at_80.bar == 18
    assert row_cells(report.stages[1], report.layers, at_80)[2] == "░░░░░░██████░░░░░░ 10-19"
    compact = layout_for(report, 60)
    assert compact.compact and compact.headers()[:3] == ("#", "Node", "Layers")
    assert row_cells(report.stages[1], report.layers, compact)[-3:] == ("2/1", "1.6G", "60 %")
    assert layout_for(report, 20).keys == ("stage", "node", "state")
    for width in range(17, 201):
        assert table_width(report, layout_for(report, width)) <= width, width


def test_the_stage_tables_columns_do_not_change_when_the_stages_figures_come_in() -> None:
    """Before the first answer no stage has a step latency, sessions or a share; once they come the table keeps
    its columns (issue 40 §7: the layers lost their range ``0-10`` when the step column filled in)."""
    before = fleet_report(fleet_status())
    after = fleet_report(fleet_status(), peer_statuses())
    assert all(row.load.step_ms is None for row in before.stages)
    assert all(row.load.step_ms is not None and row.share is not None for row in after.stages)
    for width in range(17, 201):
        assert layout_for(before, width) == layout_for(after, width), width


def test_settings_are_checked_and_parsed_from_the_dialogs_text() -> None:
    settings = GenerationSettings.parse(temperature="0.7", top_p="0.9", top_k="40", max_tokens="64", seed="")
    assert settings == GenerationSettings(temperature=0.7, top_p=0.9, top_k=40, max_tokens=64, seed=None)
    request = settings.request("tok", (("user", "hi"),))
    assert (request.temperature, request.top_p, request.top_k, request.max_tokens, request.seed) == (
        0.7,
        0.9,
        40,
        64,
        None,
    )
    assert settings.describe() == "T 0.7 · top-p 0.9 · top-k 40 · 64 tokens"
    with pytest.raises(ConfigError, match="max tokens must be a whole number"):
        GenerationSettings.parse(temperature="0", top_p="1", top_k="0", max_tokens="lots", seed="")
    with pytest.raises(ConfigError, match="top-p"):
        GenerationSettings(top_p=0.0)
    assert GenerationSettings.from_json({"temperature": -3}) == GenerationSettings()  # a bad saved value: defaults
    assert GenerationSettings.from_json(GenerationSettings(seed=5).to_json()) == GenerationSettings(seed=5)


def test_an_answers_tally_times_its_first_token_and_keeps_the_done_events_rate() -> None:
    tally = AnswerTally(asked_at=100.0)
    assert tally.rate(100.5) is None and tally.ttft is None
    tally.token("Hel", 100.25)
    tally.token("lo", 100.75)
    assert tally.ttft == 0.25 and tally.rate(101.25) == pytest.approx(1.0)
    stats = tally.finish(ChatEvent("done", text="!", stats={"tokens": 2, "seconds": 0.5, "drafted": 4, "accepted": 3}))
    assert tally.text == "Hello!"
    assert stats_line(stats) == "2 tokens · first token 0.25 s · 4.0 tok/s · 3 of 4 drafted accepted"
    assert stats_line({"stopped": True, "tokens": 1, "ttft": 0.5}) == "stopped after 1 tokens · first token 0.50 s"
    assert stats_line(None) == ""


def test_the_rate_history_counts_tokens_per_second_in_a_sliding_window() -> None:
    history = RateHistory(window=10.0, bucket=2.0)
    history.add(4, 100.0)
    history.add(2, 101.0)
    history.add(6, 106.5)
    assert history.series(107.0) == [0.0, 3.0, 0.0, 0.0, 3.0]  # buckets 98-100 .. 106-108
    assert history.series(120.0) == [0.0] * 5  # all slid out


def test_the_fastest_answer_is_an_answers_own_rate_within_the_window() -> None:
    history = RateHistory(window=10.0, bucket=2.0)
    for i in range(20):  # 20 tokens streamed in one second, across two buckets: no bucket shows 20 tok/s
        history.add(1, 99.5 + i * 0.05)
    history.answered(20.0, 100.5)
    assert max(history.series(101.0)) < 20.0
    assert history.fastest(101.0) == 20.0
    history.answered(12.0, 105.0)
    assert history.fastest(106.0) == 20.0
    assert history.fastest(111.0) == 12.0  # the first slid out of the window
    assert history.fastest(115.0) is None


def test_the_store_keeps_turns_lists_newest_first_deletes_and_keeps_settings(tmp_path: Path) -> None:
    clock = FixedClock(1000.0)
    store = ConversationStore(tmp_path / "deep" / "chats.sqlite", clock)

    async def main() -> None:
        first = await store.add_turn(None, "What is **Paris**?\nsecond line", "A city.", {"tokens": 2})
        clock.advance(5)
        second = await store.add_turn(None, "Another", "Yes.", None)
        clock.advance(5)
        assert await store.add_turn(first, "And Rome?", "Also a city.", {"tokens": 3}) == first
        listed = await store.conversations()
        assert [(c.id, c.title, c.updated, c.messages) for c in listed] == [
            (first, "What is **Paris**?", 1010.0, 4),
            (second, "Another", 1005.0, 2),
        ]
        loaded = await store.load(first)
        assert loaded.history() == (
            ("user", "What is **Paris**?\nsecond line"),
            ("assistant", "A city."),
            ("user", "And Rome?"),
            ("assistant", "Also a city."),
        )
        assert loaded.messages[1].stats == {"tokens": 2} and loaded.messages[0].stats is None
        await store.delete(first)
        assert [c.id for c in await store.conversations()] == [second]
        with pytest.raises(ConfigError, match="deleted"):
            await store.load(first)
        with pytest.raises(ConfigError, match="deleted"):
            await store.add_turn(first, "x", "y", None)
        assert await store.setting("generation") is None
        await store.put_setting("generation", {"seed": 1})
        await store.put_setting("generation", {"seed": 2})
        assert await store.setting("generation") == {"seed": 2}

    asyncio.run(main())
    # messages go with their conversation (foreign keys on), and the schema is versioned
    with sqlite3.connect(tmp_path / "deep" / "chats.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 2
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1


def test_a_store_from_a_newer_shoal_or_an_unwritable_place_fails_with_a_clear_error(tmp_path: Path) -> None:
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(ConfigError, match="newer shoal"):
        asyncio.run(ConversationStore(newer).conversations())
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot open"):
        asyncio.run(ConversationStore(tmp_path / "file" / "c.sqlite").conversations())


def test_a_title_is_the_first_line_cut_short() -> None:
    assert title_of("\n  hello  \nworld") == "hello"
    assert len(title_of("x" * 200)) == 60 and title_of("x" * 200).endswith("…")


def test_a_donor_that_stepped_aside_says_why_in_its_role() -> None:
    status = fleet_status()
    spare = {**status["members"]["members"][0], "node": "0000000000aa", "name": "zeta"}
    spare["announces"] = {**spare["announces"], "stages": [], "donor": "away"}
    status["members"]["members"].append(spare)
    report = fleet_report(status)
    assert ("zeta", "away: its owner is at the PC") in [(m.name, m.role) for m in report.others]
    spare["announces"]["donor"] = "serving"
    assert ("zeta", "spare: the plan needs no more PCs") in [(m.name, m.role) for m in fleet_report(status).others]
