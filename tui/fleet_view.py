"""The fleet: one row per stage of the plan (node, its layers as a span bar over the model, device, state with
download %, step latency, sessions, memory, share of the ring's time, standbys: as many as the width holds), a
banner saying whether the ring can answer, and apart from them the members that serve no stage."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import DataTable, Label, Static

from tui.fleet import UNKNOWN, WAITING, FleetReport, Health, Held, StageRow
from tui.fleet_columns import FILLED, TableLayout, layout_for, row_cells

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
        self._layout: TableLayout | None = None
        """The stage table's columns now (they change with the width: :func:`~tui.fleet_columns.layout_for`)."""

    def compose(self) -> ComposeResult:
        yield self._banner
        yield self._summary
        yield self.stages
        yield self._others_title
        yield self._others

    def on_mount(self) -> None:
        self._others.add_columns("Node", "State", "Role", "Heard")
        # published once the new theme's variables are in place
        self.app.theme_changed_signal.subscribe(self, lambda _: self._show(self.report))
        self._show(self.report)

    def watch_report(self, report: FleetReport) -> None:
        if self.is_mounted:
            self._show(report)

    def on_resize(self) -> None:
        if layout_for(self.report, self.size.width) != self._layout:
            self._show(self.report)

    def _show(self, report: FleetReport) -> None:
        banner = self._banner
        banner.update(report.banner)
        for severity in ("ok", "warning", "error"):
            banner.set_class(report.severity == severity, f"-{severity}")
        summary = self._summary
        summary.update(report.summary)
        summary.display = bool(report.summary)
        self._show_stages(report)
        others = self._others
        others.clear()
        for member in report.others:
            others.add_row(
                member.name, Text(member.state, style=self._colour(member.health), end=""), member.role, member.heard
            )
        others.display = bool(report.others)
        self._others_title.display = bool(report.others)

    def _show_stages(self, report: FleetReport) -> None:
        stages = self.stages
        layout = layout_for(report, self.size.width)
        if layout != self._layout:
            # columns anew: a DataTable's column keeps the width of its widest cell so far, bars included
            stages.clear(columns=True)
            stages.add_columns(*layout.headers())
        else:
            stages.clear()
        self._layout = layout
        shares = [row.share for row in report.stages if row.share is not None]
        widest = max(shares) if len(shares) > 1 else None  # one stage alone sets no pace worth marking
        for row in report.stages:
            texts = dict(zip(layout.keys, row_cells(row, report.layers, layout), strict=True))
            stages.add_row(*(self._cell(key, text, row, widest) for key, text in texts.items()), key=str(row.stage))
        stages.display = bool(report.stages)

    def _cell(self, key: str, text: str, row: StageRow, widest: float | None) -> Text | str:
        """A cell, coloured where colour tells something: health, the span, the stage that sets the pace."""
        health = row.state.health
        if key == "node" and row.holder is None:
            return Text(text, style=self._colour("bad"), end="")
        if key == "state":
            return Text(text, style=self._colour(health), end="")
        if key == "standbys":
            held = [self._held(s, with_name=True) for s in row.standbys]
            return Text(", ", end="").join(held) if held else Text("none", end="")
        if key == "layers" and text != UNKNOWN:
            cell = Text(text, end="")
            colour = self._colour(health) or self.app.theme_variables.get("primary", "")
            for i, char in enumerate(text):
                if char == FILLED:
                    cell.stylize(colour, i, i + 1)
            return cell
        if key == "share" and widest is not None and row.share == widest:
            return Text(text, style="bold", end="")  # the slowest stage: the one to move or split first
        return text

    def _held(self, held: Held, with_name: bool) -> Text:
        text = f"{held.name} ({held.text})" if with_name else held.text
        return Text(text, style=self._colour(held.health), end="")

    def _colour(self, health: Health) -> str:
        variable = _HEALTH_COLOUR[health]
        return self.app.theme_variables.get(variable, "") if variable else ""
