"""The admin screen's form for a pin: a node, a stage, and whether the pin is only preferred."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label

from tui.admin import PinEntry
from tui.form_dialog import FormDialog


class PinDialog(FormDialog[PinEntry]):
    """Asks for a node and a stage to pin; dismissed with the pin (ctrl+s, Enter or Pin) or None (Esc)."""

    SAVE_BUTTON = "pin-save"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="pin.cancel"),
        Binding("ctrl+s", "save", "Pin", id="pin.save"),
    ]

    def __init__(self, node: str = "") -> None:
        super().__init__()
        self.node = node

    def compose(self) -> ComposeResult:
        with Vertical(id="pin-dialog", classes="admin-modal") as dialog:
            dialog.border_title = "Pin a stage to a node"
            yield Label("Node (name or node id)")
            yield Input(self.node, placeholder="pc-big", id="pin-node")
            yield Label("Stage")
            yield Input("", placeholder="0", id="pin-stage", type="integer")
            yield Checkbox("preferred: placed elsewhere while the node cannot hold it", id="pin-prefer")
            yield Label("", id="pin-error", markup=False)
            with Horizontal(classes="admin-buttons"):
                yield Button("Pin", variant="primary", id="pin-save")
                yield Button("Cancel", id="pin-cancel")

    def on_mount(self) -> None:
        self.query_one("#pin-stage" if self.node else "#pin-node", Input).focus()

    def action_save(self) -> None:
        node = self.query_one("#pin-node", Input).value.strip()
        stage = self.query_one("#pin-stage", Input).value.strip()
        error = self.query_one("#pin-error", Label)
        if not node:
            error.update("name the node to pin")
            return
        if not stage.isdigit():
            error.update(f"the stage is a stage index (0 or more), not {stage!r}")
            return
        prefer = self.query_one("#pin-prefer", Checkbox).value
        self.dismiss(PinEntry(node, int(stage), required=not prefer))
