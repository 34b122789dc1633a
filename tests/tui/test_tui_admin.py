"""The admin screen driven by Pilot at 80×24: against the real admin source (``agent/cli/chat_admin.py``, the
code of ``shoal pin``/``unpin``/``fleet token``/``fleet revoke``) on a fleet folder made here with
``shoal fleet init``'s code, and against a fake for what the real one cannot show (the screen's absence without
the key, the command palette). What is checked is in the fleet folder afterwards, not only on the screen."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.command import CommandList
from textual.widgets import Checkbox, DataTable, Input, Label

from agent.cli.chat_admin import FleetAdmin, holds_fleet_key
from agent.cli.chat_cmd import admin_source
from agent.cli.fleet_cmd import node_rows
from agent.fleet.authority import init_fleet, issue_node
from agent.fleet.enrollment import JoinToken, load_tokens
from agent.fleet.revocation import fleet_revocations
from discovery.admin import current_fleet_document
from discovery.fleet_document import Pin
from tests.tui.fakes import FakeAdmin, FakeChat, FakeStatus, FixedClock, fleet_status, run, until
from tui.admin import PinEntry
from tui.admin_screen import AdminScreen
from tui.app import ChatApp
from tui.confirm_dialog import ConfirmDialog
from tui.pin_dialog import PinDialog
from tui.store import ConversationStore

pytestmark = pytest.mark.tui
SIZE = (80, 24)


def make_app(tmp_path: Path, admin: Any) -> ChatApp:
    clock = FixedClock()
    store = ConversationStore(tmp_path / "conversations.sqlite", clock)
    return ChatApp(FakeChat(), FakeStatus(fleet_status()), store, clock=clock, poll_seconds=0.05, admin=admin)


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    """A fleet folder as ``shoal fleet init`` and ``shoal fleet issue alpha beta`` leave it."""
    folder = tmp_path / "fleet"
    init_fleet(folder, "office")
    for node in ("alpha", "beta"):
        issue_node(folder, node)
    return folder


async def open_admin(app: ChatApp, pilot: Any) -> AdminScreen:
    await pilot.press("f3")
    await until(pilot, lambda: isinstance(app.screen, AdminScreen) and app.screen.overview is not None, "the lists")
    assert isinstance(app.screen, AdminScreen)
    return app.screen


def status_of(screen: AdminScreen) -> tuple[str, str]:
    return screen.status


def test_pin_and_unpin_from_the_screen_change_the_fleet_document(tmp_path: Path, fleet_dir: Path) -> None:
    async def main() -> None:
        app = make_app(tmp_path, FleetAdmin(fleet_dir, None))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_admin(app, pilot)
            assert [n.name for n in screen.overview.nodes] == ["alpha", "beta"]  # type: ignore[union-attr]
            assert screen.overview is not None and screen.overview.pins == ()
            screen.nodes.move_cursor(row=1)  # beta
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, PinDialog), "the pin dialog")
            dialog = app.screen
            assert dialog.query_one("#pin-node", Input).value == "beta"  # the selected node, ready to pin
            await pilot.press("1", "enter")
            await until(pilot, lambda: current_fleet_document(fleet_dir).pins == (Pin("beta", 1, True),), "the pin")
            await until(pilot, lambda: screen.overview is not None and screen.overview.pins != (), "the pins again")
            assert screen.overview.pins == (PinEntry("beta", 1, True),)
            # no identity to reach an agent with: written, and the status line says it was not handed over
            text, severity = status_of(screen)
            assert severity == "warning" and "pinned stage 1 to beta" in text and "not handed" in text, text
            # a preferred pin of alpha on stage 0
            screen.nodes.move_cursor(row=0)
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, PinDialog), "the pin dialog")
            app.screen.query_one("#pin-prefer", Checkbox).value = True
            await pilot.press("0", "enter")
            await until(pilot, lambda: len(current_fleet_document(fleet_dir).pins) == 2, "the second pin")
            assert Pin("alpha", 0, False) in current_fleet_document(fleet_dir).pins
            await until(pilot, lambda: screen.pins.row_count == 2, "both pins listed")
            # unpin the one selected in the pins table: beta's
            screen.pins.focus()
            assert screen.overview is not None
            screen.pins.move_cursor(row=[p.node for p in screen.overview.pins].index("beta"))
            await pilot.press("u")
            await until(pilot, lambda: current_fleet_document(fleet_dir).pins == (Pin("alpha", 0, False),), "unpinned")
            await until(pilot, lambda: screen.pins.row_count == 1, "one pin listed")
            assert current_fleet_document(fleet_dir).version == 3  # pin, pin, unpin: one version each

    run(main)


def test_a_bad_pin_and_a_second_revoke_fail_with_a_notification_and_a_status_line(
    tmp_path: Path, fleet_dir: Path
) -> None:
    async def main() -> None:
        app = make_app(tmp_path, FleetAdmin(fleet_dir, None))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_admin(app, pilot)
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, PinDialog), "the pin dialog")
            # the dialog refuses a stage that is not a number, and says so, before anything is written
            app.screen.query_one("#pin-node", Input).value = "not a name!"
            await pilot.press("x", "enter")
            assert "stage index" in str(app.screen.query_one("#pin-error", Label).render())
            app.screen.query_one("#pin-stage", Input).value = "2"
            await pilot.press("enter")
            # the fleet document's rules refuse the node name: the error shows, no traceback, nothing written
            await until(pilot, lambda: status_of(screen)[1] == "error", "the refusal")
            assert "node id or node name" in status_of(screen)[0]
            assert any(n.severity == "error" for n in app._notifications)
            assert current_fleet_document(fleet_dir).version == 0
            assert app.is_running and isinstance(app.screen, AdminScreen)

    run(main)


def test_revoke_asks_first_then_the_node_is_revoked_in_the_list(tmp_path: Path, fleet_dir: Path) -> None:
    async def main() -> None:
        app = make_app(tmp_path, FleetAdmin(fleet_dir, None))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_admin(app, pilot)
            screen.nodes.move_cursor(row=0)  # alpha
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
            await pilot.press("enter")  # the focus is on Cancel: Enter alone does not revoke
            await until(pilot, lambda: app.screen is screen, "back without revoking")
            assert fleet_revocations(fleet_dir) is None
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question again")
            await pilot.press("y")
            await until(pilot, lambda: node_rows(fleet_dir)[0].revoked, "alpha revoked in the fleet folder")
            revocations = fleet_revocations(fleet_dir)
            assert revocations is not None and [r.name for r in revocations.revoked] == ["alpha"]
            assert not node_rows(fleet_dir)[1].revoked
            await until(
                pilot, lambda: screen.overview is not None and screen.overview.nodes[0].revoked, "the list again"
            )
            table = screen.query_one("#admin-nodes", DataTable)
            assert [str(c) for c in table.get_row_at(0)][0::4] == ["alpha", "revoked"]
            assert str(table.get_row_at(1)[4]) == ""
            assert "revoked alpha" in status_of(screen)[0]
            # revoking it again is refused on the screen, with no question asked
            await pilot.press("r")
            assert isinstance(app.screen, AdminScreen)
            assert status_of(screen) == ("alpha is revoked already", "error")

    run(main)


def test_revoking_a_pinned_node_drops_its_pin_and_it_cannot_be_pinned_again(tmp_path: Path, fleet_dir: Path) -> None:
    async def main() -> None:
        admin = FleetAdmin(fleet_dir, None)
        await admin.pin("beta", 1, prefer=False)
        app = make_app(tmp_path, admin)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_admin(app, pilot)
            screen.nodes.move_cursor(row=1)  # beta
            await pilot.press("r")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the question")
            assert isinstance(app.screen, ConfirmDialog) and "Its pin (stage 1) is dropped too" in app.screen.question
            await pilot.press("y")
            await until(pilot, lambda: current_fleet_document(fleet_dir).pins == (), "the pin dropped")
            assert node_rows(fleet_dir)[1].revoked and current_fleet_document(fleet_dir).version == 2
            await until(pilot, lambda: "dropped the required pin of beta on stage 1" in status_of(screen)[0], "said")
            # the shared check refuses a pin of the revoked node, in one line on the status line
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, PinDialog), "the pin dialog")
            app.screen.query_one("#pin-node", Input).value = "beta"
            app.screen.query_one("#pin-stage", Input).value = "1"
            await pilot.press("enter")
            await until(pilot, lambda: status_of(screen)[1] == "error", "the refusal")
            assert status_of(screen)[0].startswith("cannot pin stage 1 to beta: beta is revoked")
            assert current_fleet_document(fleet_dir).version == 2

    run(main)


def test_a_join_token_is_made_stored_and_copied(tmp_path: Path, fleet_dir: Path) -> None:
    async def main() -> None:
        app = make_app(tmp_path, FleetAdmin(fleet_dir, None, enrollment=("10.0.0.5", 7300)))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_admin(app, pilot)
            assert screen.check_action("copy_token", ()) is None  # nothing to copy yet: shown disabled
            await pilot.press("t")
            await until(pilot, lambda: screen.invite is not None, "the token")
            invite = screen.invite
            assert invite is not None and invite.command.startswith("shoal join ")
            token, _, where = invite.command.removeprefix("shoal join ").rpartition("@")
            assert where == "10.0.0.5:7300"
            assert JoinToken.parse(token).token_id == invite.token_id in load_tokens(fleet_dir)
            await pilot.press("c")
            assert app.clipboard == invite.command

    run(main)


def test_the_admin_screen_is_there_only_with_the_fleet_key_and_in_the_palette(tmp_path: Path) -> None:
    folder = tmp_path / "fleet"
    assert not holds_fleet_key(folder) and admin_source(folder, None, tmp_path) is None
    init_fleet(folder, "office")
    assert holds_fleet_key(folder) and isinstance(admin_source(folder, None, tmp_path), FleetAdmin)
    (folder / "ca.key").unlink()  # a member's PC: the CA certificate, not its key
    assert admin_source(folder, None, tmp_path) is None

    async def main() -> None:
        without = make_app(tmp_path / "a", None)
        async with without.run_test(size=SIZE) as pilot:
            assert "Fleet admin" not in [c.title for c in without.get_system_commands(without.screen)]
            assert not without.check_action("admin", ())
            await pilot.press("f3")
            assert not isinstance(without.screen, AdminScreen)
        admin = FakeAdmin()
        app = make_app(tmp_path / "b", admin)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+p")
            await pilot.press(*"fleet admin")
            await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0, "the palette's match")
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, AdminScreen), "the admin screen, from the palette")
            screen = app.screen
            assert isinstance(screen, AdminScreen)
            titles = [c.title for c in app.get_system_commands(screen)]
            for title in (
                "Pin a node to a stage",
                "Unpin the selected pin",
                "New join token",
                "Revoke the selected node",
            ):
                assert title in titles
            await until(pilot, lambda: screen.overview is not None, "the lists")
            await pilot.press("ctrl+p")
            await pilot.press(*"new join token")
            await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0, "the palette's match")
            await pilot.press("enter")
            await until(pilot, lambda: screen.invite is not None, "a token, from the palette")
            assert admin.calls == [("token",)]
            await pilot.press("escape")
            assert not isinstance(app.screen, AdminScreen)

    run(main)


def test_a_change_says_whether_this_pcs_agent_took_it(tmp_path: Path, fleet_dir: Path) -> None:
    me = issue_node(fleet_dir, "me")
    admin = FleetAdmin(fleet_dir, me)
    outcome = asyncio.run(admin.pin("alpha", 0, prefer=False))
    assert outcome.severity == "warning" and "no agent runs on this PC" in outcome.text, outcome
    # an agent's record left behind by one that died: the change is written, and the line says it was not handed
    (me.cert.parent / "agent.json").write_text('{"node": "me", "listen": "127.0.0.1:9", "pid": 1}')
    outcome = asyncio.run(admin.unpin("alpha"))
    assert outcome.severity == "warning" and "not handed to the agent at 127.0.0.1:9" in outcome.text, outcome
    assert current_fleet_document(fleet_dir).version == 2 and current_fleet_document(fleet_dir).pins == ()
