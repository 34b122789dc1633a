"""SVG snapshots of the chat, the fleet and the admin screen at 80×24 and 160×48, with fixed data and a fixed
clock.

The snapshots live in ``__snapshots__/`` beside this file; after a deliberate change of the look, run
``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and review the new SVGs (the failure report,
``snapshot_report.html``, shows the old and the new side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tui.fakes import FakeAdmin, FakeChat, FakePeers, FakeStatus, FixedClock, fleet_status, tokens, until
from tui.admin_screen import AdminScreen
from tui.app import ChatApp
from tui.store import ConversationStore

pytestmark = pytest.mark.tui

ANSWER = [
    "**Paris** is",
    " the capital of France.\n\n",
    "- about 2.1 million people\n",
    "- on the Seine\n\n",
    "```python\n",
    'print("bonjour")\n',
    "```\n",
]


def app_with(
    tmp_path: Path, status: dict[str, Any], peers: FakePeers | None = None, admin: FakeAdmin | None = None
) -> ChatApp:
    clock = FixedClock()
    chat = FakeChat(tokens(*ANSWER, tokens=7, seconds=0.2, drafted=6, accepted=4))
    store = ConversationStore(tmp_path / "conversations.sqlite", clock)
    return ChatApp(chat, FakeStatus(status), store, clock=clock, poll_seconds=0.05, peers=peers, admin=admin)


def answered(*keys: str) -> Any:
    """A ``run_before`` that asks one question, waits for its answer, then presses ``keys``."""

    async def run_before(pilot: Any) -> None:
        app: ChatApp = pilot.app
        await until(pilot, lambda: app.fleet.reachable, "the first status")
        app.prompt.text = "What is the capital of France?"
        await pilot.press("enter")
        await until(pilot, lambda: app.thread.id is not None and not app.streaming, "the answer, saved")
        await pilot.press(*keys)
        # toasts expire on the wall clock, so whether one is still up depends on the machine's speed;
        # the pilot tests check them, the snapshots leave them out
        app.clear_notifications()
        # the screen settles (focus, layout, the next status poll drawn) before it is taken
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.3)

    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_the_chat(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    app = app_with(tmp_path, fleet_status(ready=False))
    assert snap_compare(app, terminal_size=size, run_before=answered())


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_the_fleet_with_an_uncovered_stage(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    app = app_with(tmp_path, fleet_status(stage0=None))
    assert snap_compare(app, terminal_size=size, run_before=answered("f2"))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_the_fleet_with_each_stages_own_figures(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    app = app_with(tmp_path, fleet_status(), FakePeers())

    async def run_before(pilot: Any) -> None:
        await until(pilot, lambda: all(row.load.step_ms for row in app.fleet.stages), "the stage agents' figures")
        await answered("f2")(pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_the_admin_screen_with_a_join_token(snap_compare: Any, tmp_path: Path, size: tuple[int, int]) -> None:
    app = app_with(tmp_path, fleet_status(), admin=FakeAdmin())

    async def run_before(pilot: Any) -> None:
        await answered()(pilot)  # behind the dialog, the same chat as in the others (the plot drawn once at least)
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, AdminScreen) and app.screen.overview is not None, "lists")
        await pilot.press("t")
        await until(pilot, lambda: getattr(app.screen, "invite", None) is not None, "the join token")
        app.clear_notifications()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
