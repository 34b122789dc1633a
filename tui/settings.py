"""The generation settings dialog: temperature, top-p, top-k, max tokens and seed of the next answers."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Button, Input, Label

from agent.errors import ConfigError
from tui.form_dialog import FormDialog
from tui.generation import GenerationSettings

_FIELDS = (
    ("temperature", "Temperature", "0: greedy (the same answer each time)"),
    ("top_p", "Top-p", "keep the likeliest tokens up to this mass (1: all)"),
    ("top_k", "Top-k", "keep this many likeliest tokens (0: all)"),
    ("max_tokens", "Max tokens", "the longest answer"),
    ("seed", "Seed", "empty: a new one each answer"),
)


class SettingsScreen(FormDialog[GenerationSettings]):
    """Edits a copy of the settings; dismissed with the new settings (ctrl+s or Save) or None (Esc)."""

    SAVE_BUTTON = "settings-save"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="settings.cancel"),
        Binding("ctrl+s", "save", "Save", id="settings.save"),
    ]

    def __init__(self, settings: GenerationSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        values = {
            "temperature": f"{self.settings.temperature:g}",
            "top_p": f"{self.settings.top_p:g}",
            "top_k": str(self.settings.top_k),
            "max_tokens": str(self.settings.max_tokens),
            "seed": "" if self.settings.seed is None else str(self.settings.seed),
        }
        with Vertical(id="settings-dialog") as dialog:
            dialog.border_title = "Generation settings"
            with Grid(id="settings-grid"):
                for name, label, hint in _FIELDS:
                    yield Label(label)
                    yield Input(values[name], placeholder=hint, id=f"setting-{name}", tooltip=hint)
            yield Label("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="settings-save")
                yield Button("Cancel", id="settings-cancel")

    def _values(self) -> dict[str, str]:
        return {name: self.query_one(f"#setting-{name}", Input).value for name, _, _ in _FIELDS}

    def action_save(self) -> None:
        try:
            settings = GenerationSettings.parse(**self._values())
        except ConfigError as exc:
            self.query_one("#settings-error", Label).update(str(exc))
            return
        self.dismiss(settings)
