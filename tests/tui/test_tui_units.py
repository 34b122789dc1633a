"""The TUI's pure parts with plain values: the fleet report of a status document, the settings, an answer's
tally and stats line, the rate history; and the SQLite store on a temporary file."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from agent.chat.protocol import ChatEvent
from agent.errors import ConfigError
from tests.tui.fakes import FixedClock, fleet_status
from tui.answer import AnswerTally, stats_line
from tui.fleet import fleet_report, unreachable
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
