"""The app driven by Textual's Pilot at 80×24 against fake sources and a fixed clock: a prompt streams into
the view, Esc closes the stream, a conversation resumes after a restart, the fleet table follows the status,
and an unreachable or frozen agent leaves the app answering keys."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.command import CommandList
from textual.widgets import DataTable, Input, Label, Markdown

from agent.chat_client.protocol import ChatEvent
from tests.tui.fakes import NODES, FakeChat, FakePeers, FakeStatus, FixedClock, fleet_status, run, tokens, until
from tui.app import ChatApp
from tui.conversation import ConversationView
from tui.fleet_view import FleetView
from tui.history import HistoryScreen
from tui.prompt_input import PromptInput
from tui.settings import SettingsScreen
from tui.status_line import StatusLine
from tui.store import ConversationStore

pytestmark = pytest.mark.tui
SIZE = (80, 24)


def make_app(
    tmp_path: Path,
    chat: FakeChat,
    status: FakeStatus | None = None,
    clock: FixedClock | None = None,
    peers: FakePeers | None = None,
) -> ChatApp:
    clock = clock or FixedClock()
    store = ConversationStore(tmp_path / "conversations.sqlite", clock)
    return ChatApp(chat, status or FakeStatus(fleet_status()), store, clock=clock, poll_seconds=0.05, peers=peers)


def answers(app: ChatApp) -> list[str]:
    return [m.text for m in app.query_one(ConversationView).messages if m.role == "assistant"]


def notes(app: ChatApp) -> list[str]:
    return [str(m.note) for m in app.query_one(ConversationView).messages if m.role == "assistant"]


def table_rows(table: DataTable[Any]) -> list[dict[str, str]]:
    """Each row of ``table`` as its cells' text by column header."""
    headers = [str(column.label) for column in table.columns.values()]
    return [dict(zip(headers, map(str, table.get_row_at(i)), strict=True)) for i in range(table.row_count)]


async def type_prompt(pilot: Any, text: str) -> None:
    """Type ``text`` key by key (each press waits for the app to be idle: keep it short)."""
    await pilot.press(*text)


async def send(app: ChatApp, pilot: Any, text: str) -> None:
    """Put ``text`` in the prompt and press Enter."""
    app.prompt.text = text
    await pilot.press("enter")


def test_a_prompt_streams_its_answer_into_the_view_with_its_rate_and_time_to_first_token(tmp_path: Path) -> None:
    clock = FixedClock()
    chat = FakeChat(
        [*tokens("Paris", " is", " the", " capital.")[:4], None],
        tokens("Lyon", " too.", tokens=2, seconds=0.25),
        clock=clock,
        latency=0.25,
    )

    async def main() -> None:
        app = make_app(tmp_path, chat, clock=clock)
        async with app.run_test(size=SIZE) as pilot:
            await type_prompt(pilot, "capital?")
            await pilot.press("enter")
            await until(pilot, lambda: chat.holding.is_set() and answers(app) == ["Paris is the capital."], "tokens")
            # streaming: the answer's text so far is in the view, the stream is open, the status says so
            assert app.streaming and chat.closed_early == []
            assert "streaming" in app.query_one(StatusLine).chat[0]
            assert app.query_one(PromptInput).text == ""  # the prompt went, the area is empty for the next
            await pilot.press("escape")
            await until(pilot, lambda: not app.streaming, "the answer to stop")
            # the second prompt carries the first turn (its partial answer kept) as history
            await type_prompt(pilot, "Lyon?")
            await pilot.press("enter")
            await until(pilot, lambda: len(notes(app)) == 2 and "tok/s" in notes(app)[1], "the second answer")
            assert answers(app)[1] == "Lyon too."
            assert notes(app)[1] == "2 tokens · first token 0.25 s · 8.0 tok/s"
            markdown = app.query(Markdown).last()
            assert markdown.source == "Lyon too."
            # the throughput box: its figure for the last minutes is never below the last answer's (issue 40 §7:
            # "peak 14.0 tok/s" beside "last answer: 20.1 tok/s", a 2 s bucket's average taken for a peak)
            assert str(app.query_one("#throughput-now", Label).content) == "last answer: 8.0 tok/s · first token 0.25 s"
            assert str(app.query_one("#throughput-scale", Label).content) == "last 3 min · fastest answer 8.0 tok/s"

    run(main)
    assert chat.requests[0][0] == (("user", "capital?"),)
    assert chat.requests[1][0] == (
        ("user", "capital?"),
        ("assistant", "Paris is the capital."),
        ("user", "Lyon?"),
    )


def test_escape_closes_the_stream_mid_answer_and_the_note_says_stopped(tmp_path: Path) -> None:
    chat = FakeChat([ChatEvent("token", id=1, text="Once"), ChatEvent("token", id=2, text=" upon"), None])

    async def main() -> None:
        app = make_app(tmp_path, chat)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "a story")
            await until(pilot, lambda: chat.holding.is_set() and answers(app) == ["Once upon"], "two tokens")
            assert any(b.binding.action == "stop" for b in app.screen.active_bindings.values() if b.binding.show)
            await pilot.press("escape")
            await until(pilot, lambda: chat.closed_early == [True], "the fake to see its stream closed")
            await until(pilot, lambda: notes(app) == ["stopped after 2 tokens · first token 0.00 s"], "the note")
            assert not app.streaming
            assert app.query_one(StatusLine).chat == ("stopped after 2 tokens", "warning")

    run(main)


def test_a_long_prompts_progress_shows_in_the_status_line_until_its_first_token(tmp_path: Path) -> None:
    chat = FakeChat([ChatEvent.progress(512, 1500, 1.5), None])  # the prompt still going in

    async def main() -> None:
        app = make_app(tmp_path, chat)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "a pasted page")
            await until(pilot, lambda: chat.holding.is_set(), "the first report")
            await until(
                pilot,
                lambda: app.query_one(StatusLine).chat == ("prompt: 512 of 1,500 positions in, 1.5 s", "ok"),
                "the progress in the status line",
            )
            assert app.streaming and answers(app) == [""]  # a report is no failure, and no text

    run(main)


def test_a_new_conversation_mid_answer_stops_it_and_the_late_tokens_go_nowhere(tmp_path: Path) -> None:
    chat = FakeChat([ChatEvent("token", id=1, text="Half"), None], tokens("Fresh."))

    async def main() -> None:
        app = make_app(tmp_path, chat)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "long one")
            await until(pilot, lambda: chat.holding.is_set() and answers(app) == ["Half"], "the first token")
            await pilot.press("ctrl+n")
            await until(pilot, lambda: chat.closed_early == [True] and not app.streaming, "the stream closed")
            assert answers(app) == [] and app.thread.history == []
            await send(app, pilot, "again")
            await until(pilot, lambda: answers(app) == ["Fresh."], "the new conversation's answer")
            # the stopped answer was kept in its own conversation, apart from the new one
            await until(pilot, lambda: app.thread.id is not None, "the new turn saved")
        listed = await ConversationStore(tmp_path / "conversations.sqlite").conversations()
        assert sorted((c.title, c.messages) for c in listed) == [("again", 2), ("long one", 2)]

    run(main)
    assert chat.requests[1][0] == (("user", "again"),)


def test_every_action_is_in_the_command_palette(tmp_path: Path) -> None:
    async def main() -> None:
        app = make_app(tmp_path, FakeChat())
        async with app.run_test(size=SIZE) as pilot:
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for action in ("Send the prompt", "Stop the answer", "New conversation", "Conversations"):
                assert action in titles
            assert "Generation settings" in titles and "Show the fleet or the chat" in titles
            await pilot.press("ctrl+p")
            await pilot.press(*"generation")
            await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0, "the palette's match")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen), "the settings, from the palette")

    run(main)


def test_an_error_shows_in_a_notification_and_the_status_line_and_gives_the_prompt_back(tmp_path: Path) -> None:
    chat = FakeChat([ChatEvent.error("fleet_busy", "every stage holds its 8 sessions")])

    async def main() -> None:
        app = make_app(tmp_path, chat)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "hello")
            await until(pilot, lambda: not app.streaming and notes(app) != [""], "the error")
            assert notes(app) == ["✗ fleet_busy: every stage holds its 8 sessions"]
            assert app.query_one(StatusLine).chat == ("fleet_busy: every stage holds its 8 sessions", "error")
            assert [n.message for n in app._notifications] == ["fleet_busy: every stage holds its 8 sessions"]
            assert app.query_one(PromptInput).text == "hello"  # to send again
            assert app.thread.history == []  # a failed turn is not history

    run(main)


def test_a_conversation_resumes_after_the_app_restarts_and_one_can_be_deleted(tmp_path: Path) -> None:
    first = FakeChat(tokens("Forty", "-two."), tokens("Other."))
    again = FakeChat(tokens("Yes."))
    clock = FixedClock()

    async def main() -> None:
        app = make_app(tmp_path, first, clock=clock)
        async with app.run_test(size=SIZE) as pilot:
            await send(app, pilot, "the answer?")
            await until(pilot, lambda: app.thread.id is not None, "the turn saved")
            clock.advance(60)
            await pilot.press("ctrl+n")
            await send(app, pilot, "unrelated")
            await until(pilot, lambda: app.thread.id is not None and app.thread.title == "unrelated", "saved")
        clock.advance(60)
        restarted = make_app(tmp_path, again, clock=clock)
        async with restarted.run_test(size=SIZE) as pilot:
            assert answers(restarted) == []
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(restarted.screen, HistoryScreen), "the list of conversations")
            listed = [c.title for c in restarted.screen.conversations]  # type: ignore[attr-defined]
            assert listed == ["unrelated", "the answer?"]
            await pilot.press("down", "enter")
            await until(pilot, lambda: answers(restarted) == ["Forty-two."], "the conversation back")
            assert restarted.sub_title == "the answer?"
            assert notes(restarted) == ["2 tokens · first token 0.00 s · 4.0 tok/s"]
            await send(restarted, pilot, "sure?")
            await until(pilot, lambda: answers(restarted) == ["Forty-two.", "Yes."], "the next answer")
            await until(pilot, lambda: len(restarted.thread.history) == 4, "the turn saved")
            clock.advance(60)
            # delete the other conversation, now second in the list
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(restarted.screen, HistoryScreen), "the list again")
            assert [c.title for c in restarted.screen.conversations] == ["the answer?", "unrelated"]  # type: ignore[attr-defined]
            await pilot.press("down", "delete", "escape")
            await until(pilot, lambda: not isinstance(restarted.screen, HistoryScreen), "the list closed")
        titles = [c.title for c in await ConversationStore(tmp_path / "conversations.sqlite").conversations()]
        assert titles == ["the answer?"]

    run(main)
    assert again.requests[0][0] == (("user", "the answer?"), ("assistant", "Forty-two."), ("user", "sure?"))


def test_the_settings_dialog_sets_the_next_requests_fields_and_refuses_a_bad_value(tmp_path: Path) -> None:
    chat = FakeChat(tokens("ok"))

    async def main() -> None:
        app = make_app(tmp_path, chat)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+g")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen), "the dialog")
            dialog = app.screen
            dialog.query_one("#setting-temperature", Input).value = "0.8"
            dialog.query_one("#setting-seed", Input).value = "x7"
            await pilot.press("ctrl+s")
            assert app.screen is dialog  # refused, saying why
            assert "seed must be a whole number, not 'x7'" in str(dialog.query_one("#settings-error", Label).render())
            dialog.query_one("#setting-seed", Input).value = "7"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen), "the dialog closed")
            await send(app, pilot, "go")
            await until(pilot, lambda: len(chat.requests) == 1, "the request")

    run(main)
    settings = chat.requests[0][1]
    assert (settings.temperature, settings.seed) == (0.8, 7)
    # and they were kept for the next run
    kept = asyncio.run(ConversationStore(tmp_path / "conversations.sqlite").setting("generation"))
    assert kept["temperature"] == 0.8 and kept["seed"] == 7


def test_the_fleet_table_fills_from_the_status_and_an_uncovered_stage_shows_a_banner(tmp_path: Path) -> None:
    status = FakeStatus(fleet_status(stage0=None))

    async def main() -> None:
        app = make_app(tmp_path, FakeChat(), status)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f2")
            view = app.query_one(FleetView)
            await until(pilot, lambda: view.report.severity == "error", "the first report")
            banner = app.query_one("#fleet-banner")
            assert banner.display and banner.region.width > 0  # shown: the fleet page replaced the chat
            assert str(banner.render()) == "Stage 0 is uncovered: every member that can hold it serves another stage"
            table = app.query_one("#fleet-stages", DataTable)
            # at 80 columns the table is abbreviated and keeps the layers' ranges
            rows = [[row[k] for k in ("#", "Node", "State")] for row in table_rows(table)]
            assert rows == [["0", "—", "uncovered"], ["1", "beta", "ready"], ["2", "gamma", "ready"]]
            # each stage's third of the model's 30 layers, drawn as the same third of its span bar
            bars = [row["Layers"].split()[0] for row in table_rows(table)]
            assert [row["Layers"].split()[1] for row in table_rows(table)] == ["0-9", "10-19", "20-29"]
            third = len(bars[0]) // 3
            assert bars == [
                "█" * third + "░" * 2 * third,
                "░" * third + "█" * third + "░" * third,
                "░" * 2 * third + "█" * third,
            ]
            # no stage agent was asked (no peer source): their own figures are unknown, the announced device is not
            assert {row["Step"] for row in table_rows(table)} == {"—"}
            assert [row["Dev"] for row in table_rows(table)] == ["—", "CPU", "CPU"]
            others = app.query_one("#fleet-others", DataTable)
            assert [str(others.get_row_at(i)[0]) for i in range(others.row_count)] == ["epsilon", "alpha"]
            assert app.query_one(StatusLine).fleet == ("stage 0 uncovered", "error")
            # the fleet recovers: alpha takes stage 0 and the banner clears at the next poll
            status.document = fleet_status()
            await until(pilot, lambda: view.report.severity == "ok", "the ring ready")
            assert str(table.get_row_at(0)[1]) == "alpha"
            assert str(banner.render()) == "Ring ready: 3 stages"
            # the table's colours follow the theme
            state = [str(column.label) for column in table.columns.values()].index("State")
            dark = table.get_row_at(0)[state].style
            app.theme = "textual-light"
            await pilot.pause()
            light = table.get_row_at(0)[state].style
            assert light == app.theme_variables["text-success"] and light != dark
            await pilot.press("f2")
            assert app.query_one(PromptInput).has_focus  # back to the chat

    run(main)


def test_the_fleet_reads_each_stage_agent_and_one_gone_or_frozen_shows_unknown_without_freezing_the_app(
    tmp_path: Path,
) -> None:
    class SomeFrozen(FakePeers):
        frozen: frozenset[str] = frozenset()

        async def get(self, node: str, address: str) -> dict[str, Any]:
            if node in self.frozen:
                self.asked.append((node, address))
                await asyncio.Event().wait()  # an agent that took the link and never answers
            return await super().get(node, address)

    status = FakeStatus(fleet_status())
    peers = SomeFrozen()

    async def main() -> None:
        app = make_app(tmp_path, FakeChat(), status, peers=peers)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f2")
            table = app.fleet_view.stages
            await until(pilot, lambda: table_rows(table)[1]["Step"] == "24.0 ms", "beta's own figures")
            assert [row["Share"] for row in table_rows(table)] == ["20 %", "60 %", "20 %"]
            assert table_rows(table)[1]["Sess"] == "2/1" and table_rows(table)[1]["Mem"] == "1.6G"
            assert {node for node, _ in peers.asked} == {NODES["alpha"], NODES["beta"], NODES["gamma"]}
            assert (NODES["beta"], "127.0.0.1:44004") in peers.asked  # at the address the members section gives
            # beta's agent stops answering: its figures go unknown, and so do the shares
            peers.failing = {NODES["beta"]}
            await until(pilot, lambda: table_rows(table)[1]["Step"] == "—", "beta's figures unknown")
            assert [row["Share"] for row in table_rows(table)] == ["—", "—", "—"]
            assert table_rows(table)[0]["Step"] == "8.0 ms"
            # gamma's freezes: the others' figures and the local status go on, keys are answered
            peers.failing = set()
            peers.frozen = frozenset({NODES["gamma"]})
            await until(pilot, lambda: any(n == NODES["gamma"] for n, _ in peers.asked[-3:]), "gamma asked")
            peers.documents[NODES["alpha"]]["step_seconds"]["sum"] *= 2
            await until(pilot, lambda: table_rows(table)[0]["Step"] == "16.0 ms", "alpha's figures, still polled")
            status.document = fleet_status(lost="beta")
            await until(pilot, lambda: app.fleet.stages[1].state.state == "lost", "beta lost, from the local status")
            await pilot.press("f2")
            await type_prompt(pilot, "ok")
            assert app.query_one(PromptInput).text == "ok"

    run(main)
    assert peers.closed


def test_an_unreachable_agent_shows_as_such_while_the_app_keeps_answering(tmp_path: Path) -> None:
    status = FakeStatus(error="cannot reach 127.0.0.1:7000: Connection refused")
    chat = FakeChat(tokens("still", " here"))

    async def main() -> None:
        app = make_app(tmp_path, chat, status)
        async with app.run_test(size=SIZE) as pilot:
            view = app.query_one(FleetView)
            await until(pilot, lambda: not view.report.reachable and status.polls >= 3, "polls that failed")
            assert view.report.banner == "Agent unreachable: cannot reach 127.0.0.1:7000: Connection refused"
            assert app.query_one(StatusLine).fleet == ("agent unreachable", "error")
            assert len(app._notifications) == 1  # said once, not at every poll
            await type_prompt(pilot, "hi")
            assert app.query_one(PromptInput).text == "hi"
            await pilot.press("enter")
            await until(pilot, lambda: answers(app) == ["still here"], "the answer")

    run(main)


def test_a_frozen_agent_never_freezes_the_app(tmp_path: Path) -> None:
    class FrozenStatus(FakeStatus):
        async def get(self) -> dict[str, Any]:
            self.polls += 1
            await asyncio.Event().wait()  # an agent that accepted the link and never answers
            raise AssertionError

    status = FrozenStatus()

    async def main() -> None:
        app = make_app(tmp_path, FakeChat(), status)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: status.polls == 1, "the poll to hang")
            # each press returns only once the app has handled it: a blocked app would time the test out
            await type_prompt(pilot, "ok")
            await pilot.press("f2")
            assert app.query_one(PromptInput).text == "ok"
            assert app.screen.has_class("-show-fleet")
            assert app.query_one(FleetView).report.banner.startswith("Asking the agent")
            assert status.polls == 1  # still waiting on the one poll

    run(main)
    assert status.closed  # the app closed its source on the way out


@pytest.mark.parametrize("size", [(60, 20), (80, 24), (160, 48)], ids=["60x20", "80x24", "160x48"])
def test_a_notification_never_covers_the_prompt(tmp_path: Path, size: tuple[int, int]) -> None:
    """The fleet's error (here the agent of another identity, as a newcomer met it) shows as a toast that leaves
    the prompt in view (issue 40 §7: at 60 columns it covered half the prompt)."""
    from textual.widgets._toast import Toast

    folder = "/home/someone/.local/share/shoal/fleet/nodes/me"
    error = (
        f"no agent runs with the identity in {folder}: --identity names the identity of this PC's agent, the one "
        f"started with --chat; or start `shoal agent --identity {folder} --chat 127.0.0.1:0`"
    )

    async def main() -> None:
        app = make_app(tmp_path, FakeChat(), FakeStatus(error=error))
        async with app.run_test(size=size, notifications=True) as pilot:  # the test harness hides toasts
            await until(pilot, lambda: len(app.screen.query(Toast)) == 1, "the fleet's toast")
            await pilot.pause(0.1)
            toast, prompt = app.screen.query_one(Toast), app.query_one(PromptInput)
            assert toast.region.area > 0 and prompt.region.area > 0
            assert not toast.region.overlaps(prompt.region), (toast.region, prompt.region)

    run(main)
