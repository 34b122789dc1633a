"""The fleet admin's screen (F3, only for a user holding the fleet key): the pins, the enrolled nodes, a join token
to copy, and revocation.

Every action runs in a worker, one at a time (the fleet folder is locked by each anyway), and its result comes
back as a message: the lists are read again after each change. A failure shows as a notification and on the
screen's status line, never as a traceback. Keys: p pin, u unpin the selected pin, t a new join token, c copy it,
r revoke the selected node (after a confirmation), f5 read the lists again, esc close; each is also in the command
palette (``ChatApp.get_system_commands``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Label, Static

from agent.errors import ShoalError
from tui.admin import AdminOutcome, AdminOverview, AdminSource, EnrolledEntry, JoinInvite, PinEntry, Severity
from tui.confirm_dialog import ConfirmDialog
from tui.pin_dialog import PinDialog

log = logging.getLogger(__name__)
T = TypeVar("T")

_MARK = {"ok": "●", "warning": "▲", "error": "✗"}
ADMIN_COMMANDS = (
    ("Pin a node to a stage", "Write a pin into the fleet document and hand it to the agent (p)", "pin"),
    ("Unpin the selected pin", "Remove the pin selected in the pins table (u)", "unpin"),
    ("New join token", "A token for one PC to join the fleet, valid a day (t)", "token"),
    ("Copy the join token", "Put the `shoal join` command on the clipboard (c)", "copy_token"),
    ("Revoke the selected node", "Revoke the node selected in the enrolled table, once confirmed (r)", "revoke"),
    ("Refresh the admin lists", "Read the pins and the enrolled nodes again (f5)", "refresh"),
    ("Close the admin screen", "Back to the chat (esc)", "close"),
)
"""The command palette's entries on this screen: title, help, action."""


class AdminScreen(ModalScreen[None]):
    """Lists what an :class:`~tui.admin.AdminSource` reports and asks it for changes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close", id="admin.close"),
        Binding("p", "pin", "Pin", id="admin.pin"),
        Binding("u", "unpin", "Unpin", id="admin.unpin"),
        Binding("t", "token", "Join token", id="admin.token"),
        Binding("c", "copy_token", "Copy", id="admin.copy"),
        Binding("r", "revoke", "Revoke", id="admin.revoke"),
        Binding("f5", "refresh", "Refresh", id="admin.refresh"),
    ]

    class Loaded(Message):
        def __init__(self, overview: AdminOverview) -> None:
            super().__init__()
            self.overview = overview

    class Changed(Message):
        def __init__(self, outcome: AdminOutcome) -> None:
            super().__init__()
            self.outcome = outcome

    class Invited(Message):
        def __init__(self, invite: JoinInvite) -> None:
            super().__init__()
            self.invite = invite

    class Failed(Message):
        def __init__(self, error: str) -> None:
            super().__init__()
            self.error = error

    def __init__(self, source: AdminSource) -> None:
        super().__init__()
        self.source = source
        self.overview: AdminOverview | None = None
        """The lists shown (None: not read yet)."""
        self.invite: JoinInvite | None = None
        """The last join token made here (None: none yet)."""
        self.status: tuple[str, Severity] = ("reading the fleet folder…", "ok")
        """What the screen's status line says."""
        self._lock = asyncio.Lock()
        self.pins: DataTable[Any] = DataTable(id="admin-pins", cursor_type="row", zebra_stripes=True)
        self.nodes: DataTable[Any] = DataTable(id="admin-nodes", cursor_type="row", zebra_stripes=True)

    def compose(self) -> ComposeResult:
        with Vertical(id="admin-dialog") as dialog:
            dialog.border_title = "Fleet admin"
            yield Label("", id="admin-summary", markup=False)
            yield Label("Pins", classes="admin-title")
            yield self.pins
            yield Label("No pin: every stage is placed automatically.", id="admin-no-pins", classes="admin-empty")
            yield Label("Enrolled nodes", classes="admin-title")
            yield self.nodes
            yield Label("", id="admin-no-nodes", classes="admin-empty", markup=False)
            yield Label("Join token", classes="admin-title")
            yield Static("none yet: t makes one", id="admin-token", markup=False)
            yield Label("", id="admin-status", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        self.pins.add_columns("Node", "Stage", "Kind")
        self.nodes.add_columns("Name", "Node id", "Enrolled (UTC)", "How", "Status")
        self._show_status(*self.status)
        self._show(None)
        self.nodes.focus()
        self.action_refresh()

    # -- actions ----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Actions that need a selection or a token are shown disabled without one."""
        if action == "unpin":
            return self._selected_pin() is not None or None
        if action == "revoke":
            return self._selected_node() is not None or None
        if action == "copy_token":
            return self.invite is not None or None
        return True

    def action_close(self) -> None:
        self.dismiss(None)

    def action_refresh(self) -> None:
        self._run(self.source.overview, self.Loaded)

    def action_pin(self) -> None:
        selected = self._selected_node()
        default = selected.name if selected is not None and not selected.revoked else ""

        def chosen(pin: PinEntry | None) -> None:
            if pin is not None:
                self._show_status(f"pinning {pin.node} to stage {pin.stage}…", "ok")
                self._run(lambda: self.source.pin(pin.node, pin.stage, not pin.required), self.Changed)

        self.app.push_screen(PinDialog(default), chosen)

    def action_unpin(self) -> None:
        pin = self._selected_pin()
        if pin is None:
            self._fail("select a pin in the pins table first")
            return
        self._show_status(f"unpinning {pin.node}…", "ok")
        self._run(lambda: self.source.unpin(pin.node), self.Changed)

    def action_token(self) -> None:
        self._show_status("making a join token…", "ok")
        self._run(self.source.token, self.Invited)

    def action_copy_token(self) -> None:
        if self.invite is None:
            self._fail("no join token yet: t makes one")
            return
        self.app.copy_to_clipboard(self.invite.command)
        self.notify(self.invite.command, title="Copied to the clipboard", timeout=4)
        self._show_status(f"copied token {self.invite.token_id}'s command to the clipboard", "ok")

    def action_revoke(self) -> None:
        node = self._selected_node()
        if node is None:
            self._fail("select a node in the enrolled table first")
            return
        if node.revoked:
            self._fail(f"{node.name} is revoked already")
            return

        pins = [p for p in self.overview.pins if p.node in (node.name, node.node_id)] if self.overview else []

        def confirmed(yes: bool | None) -> None:
            if yes:
                self._show_status(f"revoking {node.name}…", "ok")
                self._run(lambda: self.source.revoke(node.node_id, drop_pins=bool(pins)), self.Changed)

        question = (
            f"Revoke {node.name} (node id {node.node_id})? Every agent refuses its certificate once the "
            "revocation list reaches it; that PC must join again with a new token."
        )
        if pins:
            stages = ", ".join(str(p.stage) for p in pins)
            question += f" Its pin (stage {stages}) is dropped too, unless another enrolled PC has its name."
        self.app.push_screen(ConfirmDialog(question, "Revoke"), confirmed)

    # -- the source, in a worker ------------------------------------------------------------------
    def _run(self, call: Callable[[], Awaitable[T]], reply: Callable[[T], Message]) -> None:
        self._call(call, reply)

    @work(group="admin", exit_on_error=False)
    async def _call(self, call: Callable[[], Awaitable[Any]], reply: Callable[[Any], Message]) -> None:
        """Await ``call`` (one at a time) and post what ``reply`` makes of its result, or :class:`Failed`."""
        try:
            async with self._lock:
                result = await call()
        except ShoalError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        except Exception as exc:  # the UI's edge: whatever broke shows as a line, never as a traceback
            log.exception("an admin action failed")
            self.post_message(self.Failed(f"the action failed: {exc}"))
            return
        self.post_message(reply(result))

    def on_admin_screen_loaded(self, message: Loaded) -> None:
        self._show(message.overview)
        if self.status[0].startswith("reading"):
            self._show_status(f"fleet document version {message.overview.version}", "ok")

    def on_admin_screen_changed(self, message: Changed) -> None:
        outcome = message.outcome
        self._show_status(outcome.text, outcome.severity)
        self.notify(
            outcome.text, title="Fleet admin", severity="information" if outcome.severity == "ok" else "warning"
        )
        self.action_refresh()

    def on_admin_screen_invited(self, message: Invited) -> None:
        invite = self.invite = message.invite
        uses = "once" if invite.uses == 1 else f"{invite.uses} times"
        token = Text(invite.command, style="bold", end="")
        token.append(f"\nvalid until {invite.expires} UTC, usable {uses}. c copies it.", style="")
        if invite.note:
            token.append(f" {invite.note}")
        self.query_one("#admin-token", Static).update(token)
        self._show_status(f"join token {invite.token_id} made", "ok")
        self.refresh_bindings()

    def on_admin_screen_failed(self, message: Failed) -> None:
        self._fail(message.error)

    # -- showing ----------------------------------------------------------------------------------
    def _fail(self, error: str) -> None:
        self.notify(error, title="Fleet admin", severity="error", timeout=8)
        self._show_status(error, "error")

    def _show_status(self, text: str, severity: Severity) -> None:
        self.status = (text, severity)
        line = self.query_one("#admin-status", Label)
        line.update(f"{_MARK[severity]} {text}")
        for name in _MARK:
            line.set_class(name == severity, f"-{name}")

    def _show(self, overview: AdminOverview | None) -> None:
        self.overview = overview
        summary = "reading…"
        if overview is not None:
            model = overview.model or "no model yet"
            summary = f"fleet folder {overview.fleet_dir} · document version {overview.version} · {model}"
        self.query_one("#admin-summary", Label).update(summary)
        pins, nodes = self.pins, self.nodes
        pin_row, node_row = pins.cursor_row, nodes.cursor_row
        pins.clear()
        nodes.clear()
        for pin in overview.pins if overview else ():
            pins.add_row(pin.node, str(pin.stage), pin.kind, key=pin.node)
        error = self.app.theme_variables.get("text-error", "")
        for node in overview.nodes if overview else ():
            status = Text("revoked", style=error, end="") if node.revoked else ""
            nodes.add_row(node.name, node.node_id, node.enrolled_at, node.how, status, key=node.node_id)
        # the selection stays where it was (clamped): after a revoke, the next key acts on a neighbour, not row 0
        if pins.row_count:
            pins.move_cursor(row=min(pin_row, pins.row_count - 1))
        if nodes.row_count:
            nodes.move_cursor(row=min(node_row, nodes.row_count - 1))
        loaded = overview is not None
        pins.display = bool(pins.row_count)
        self.query_one("#admin-no-pins").display = loaded and not pins.row_count
        no_nodes = self.query_one("#admin-no-nodes", Label)
        no_nodes.update(overview.note if overview and overview.note else "No node is enrolled yet.")
        no_nodes.display = loaded and not nodes.row_count
        nodes.display = bool(nodes.row_count)
        self.refresh_bindings()

    def _selected_pin(self) -> PinEntry | None:
        if self.overview is None or not self.pins.row_count:
            return None
        row = self.pins.cursor_row
        return self.overview.pins[row] if 0 <= row < len(self.overview.pins) else None

    def _selected_node(self) -> EnrolledEntry | None:
        if self.overview is None or not self.nodes.row_count:
            return None
        row = self.nodes.cursor_row
        return self.overview.nodes[row] if 0 <= row < len(self.overview.nodes) else None

    @on(DataTable.RowHighlighted)
    def _selection_moved(self) -> None:
        self.refresh_bindings()
