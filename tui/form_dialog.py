"""A modal form: Enter in a field or its save button saves, Esc or any other button cancels."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.screen import ModalScreen
from textual.widgets import Button, Input

Result = TypeVar("Result")


class FormDialog(ModalScreen[Result | None]):
    """Base of the TUI's forms (generation settings, a pin). Subclasses compose their fields, set
    ``SAVE_BUTTON`` to their save button's id, and implement ``action_save`` (which dismisses with the result,
    or shows why the input is refused); cancelling dismisses with None."""

    SAVE_BUTTON: ClassVar[str] = "save"

    def action_save(self) -> None:
        raise NotImplementedError

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == self.SAVE_BUTTON:
            self.action_save()
        else:
            self.action_cancel()
