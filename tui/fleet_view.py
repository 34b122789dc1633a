"""The fleet: one row per stage of the plan (node, state with download %, standbys), a banner saying whether
the ring can answer, and apart from them the members that serve no stage."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Label, Static

from tui.fleet import WAITING, FleetReport, Health, Held

_HEALTH_COLOUR = {"ok": "text-success", "busy": "text-warning", "bad": "text-error", "idle": ""}
"""Theme variables of each health: the table follows the light and dark themes."""


class FleetView(Vertical):
    """Shows a :class:`~tui.fleet.FleetReport`; it knows nothing of where the report came from."""

    report: reactive[FleetReport] = reactive(WAITING)
    """The latest report (the app sets it at each status poll; an unchanged one redraws nothing)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Fleet"
        self._banner = Static(id="fleet-banner", markup=False)
        self._summary = Label(id="fleet-summary", markup=False)
        self.stages: DataTable[Any] = DataTable(id="fleet-stages", cursor_type="none", zebra_stripes=True)
        """The table of stages (F2 focuses it)."""
        self._others_title = Label("Not in the ring", id="fleet-others-title")
        self._others: DataTable[Any] = DataTable(id="fleet-others", cursor_type="none")

    def compose(self) -> ComposeResult:
        yield self._banner
        yield self._summary
        yield self.stages
        yield self._others_title
        yield self._others

    def on_mount(self) -> None:
        self.stages.add_columns("Stage", "Node", "State", "Standbys")
        self._others.add_columns("Node", "State", "Role", "Heard")
        # published once the new theme's variables are in place
        self.app.theme_changed_signal.subscribe(self, lambda _: self._show(self.report))
        self._show(self.report)

    def watch_report(self, report: FleetReport) -> None:
        if self.is_mounted:
            self._show(report)

    def _show(self, report: FleetReport) -> None:
        banner = self._banner
        banner.update(report.banner)
        for severity in ("ok", "warning", "error"):
            banner.set_class(report.severity == severity, f"-{severity}")
        summary = self._summary
        summary.update(report.summary)
        summary.display = bool(report.summary)
        stages = self.stages
        stages.clear()
        for row in report.stages:
            held = [self._held(s, with_name=True) for s in row.standbys]
            standbys = Text(", ", end="").join(held) if held else Text("none", end="")
            stages.add_row(
                str(row.stage),
                row.holder.name if row.holder else Text("—", style=self._colour("bad"), end=""),
                self._held(row.state, with_name=False),
                standbys,
                key=str(row.stage),
            )
        stages.display = bool(report.stages)
        others = self._others
        others.clear()
        for member in report.others:
            others.add_row(
                member.name, Text(member.state, style=self._colour(member.health), end=""), member.role, member.heard
            )
        others.display = bool(report.others)
        self._others_title.display = bool(report.others)

    def _held(self, held: Held, with_name: bool) -> Text:
        text = f"{held.name} ({held.text})" if with_name else held.text
        return Text(text, style=self._colour(held.health), end="")

    def _colour(self, health: Health) -> str:
        variable = _HEALTH_COLOUR[health]
        return self.app.theme_variables.get(variable, "") if variable else ""
