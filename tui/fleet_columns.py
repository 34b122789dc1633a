"""Which columns of the stage table fit a width, and what each cell says (pure functions over a report).

A wide fleet view shows every column: the stage, its node, its layers as a span bar over the whole model
(Petals' health monitor draws one per server) with their range, the device, the state, the step latency, the
sessions open and parked, the agent's memory, the stage's share of the ring's time and the standbys. A narrower
one first drops the standbys (the members table lists them too), then abbreviates headers and figures, then
drops the layers' range (the bar stays), then the least telling columns one by one (:data:`DROP_ORDER`).
Whatever is left over widens the span bars.

The choice is made with room for the figures that come once the ring works (a step latency, sessions, memory,
a share: :data:`ROOM`), so that the first answer does not change the columns (issue 40 §7: the layers lost
their range when the step column filled in).
"""

from __future__ import annotations

from dataclasses import dataclass

from tui.fleet import UNKNOWN, FleetReport, StageRow

CELL_PADDING = 2
"""Columns a DataTable adds to each of its columns (``cell_padding`` 1 on each side)."""
BAR_MIN = 8
"""Cells of the narrowest span bar: a stage's place in the model still shows."""
BAR_MAX = 24
"""Cells of the widest one (and never more than the model has layers: a cell is at least one layer)."""
FILLED, EMPTY = "█", "░"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    short: str
    """The header in a compact table."""


COLUMNS = (
    Column("stage", "Stage", "#"),
    Column("node", "Node", "Node"),
    Column("layers", "Layers", "Layers"),
    Column("device", "Device", "Dev"),
    Column("state", "State", "State"),
    Column("step", "Step", "Step"),
    Column("sessions", "Sessions", "Sess"),
    Column("memory", "Memory", "Mem"),
    Column("share", "Share", "Share"),
    Column("standbys", "Standbys", "Standbys"),
)
DROP_ORDER = ("memory", "device", "sessions", "share", "step", "layers")
"""The columns a compact table gives up, first to last, until it fits; stage, node and state always stay."""
ROOM = {
    "step": ("99.9 ms", "99.9 ms"),
    "sessions": ("1, 0 parked", "1/0"),
    "memory": ("999 MiB", "999M"),
    "share": ("99 %", "99 %"),
}
"""Cells kept for the figures a stage's agent reports once it works (full, compact): before they come, a cell
shows only ``—``."""


@dataclass(frozen=True)
class TableLayout:
    columns: tuple[Column, ...]
    compact: bool
    """Short headers and figures."""
    bar: int
    """Cells of each span bar."""
    ranges: bool = True
    """The layers' range beside each bar (``0-9``)."""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c.key for c in self.columns)

    def headers(self) -> tuple[str, ...]:
        return tuple(c.short if self.compact else c.header for c in self.columns)


def layout_for(report: FleetReport, width: int) -> TableLayout:
    """The fullest table of ``report``'s stages that fits ``width`` columns (the last resort may not)."""
    dropped: tuple[str, ...] = ("standbys",)
    levels = [(False, True, ()), (False, True, dropped), (True, True, dropped), (True, False, dropped)]
    for key in DROP_ORDER:
        dropped = (*dropped, key)
        levels.append((True, False, dropped))
    for compact, ranges, drop in levels:
        layout = TableLayout(tuple(c for c in COLUMNS if c.key not in drop), compact, BAR_MIN, ranges)
        spare = width - table_width(report, layout)
        if spare >= 0 or drop == dropped:
            bar = BAR_MIN
            if "layers" in layout.keys:
                edges = {edge for row in report.stages if row.layers is not None for edge in row.layers}
                bar = _bar_width(report.layers, BAR_MIN + max(spare, 0), edges)
            return TableLayout(layout.columns, compact, bar, ranges)
    raise AssertionError("unreachable: the last level is always returned")


def _bar_width(layers: int | None, room: int, edges: set[int]) -> int:
    """Cells of the span bars in ``room`` cells at most: as many as fit, up to :data:`BAR_MAX` and the model's
    layer count, preferring a count where every stage's ``edges`` fall between two cells (30 layers cut at 10
    and 20: 9, 12, 15... cells), so that equal stages draw equal spans."""
    most = max(BAR_MIN, min(room, BAR_MAX, layers or BAR_MIN))
    if not layers:
        return most
    even = [w for w in range(BAR_MIN, most + 1) if all(edge * w % layers == 0 for edge in edges)]
    return even[-1] if even else most


def table_width(report: FleetReport, layout: TableLayout) -> int:
    """Columns the table of ``report`` takes in ``layout``, with :data:`ROOM` for the figures to come."""
    rows = [row_cells(row, report.layers, layout) for row in report.stages]
    room = [len(ROOM[key][layout.compact]) if key in ROOM and rows else 0 for key in layout.keys]
    return sum(
        max([len(header), room[i], *(len(cells[i]) for cells in rows)]) + CELL_PADDING
        for i, header in enumerate(layout.headers())
    )


def row_cells(row: StageRow, total: int | None, layout: TableLayout) -> tuple[str, ...]:
    """The text of each of ``layout``'s cells for ``row`` (``total``: the model's layers)."""
    every = cells(row, total, layout.compact, layout.bar, layout.ranges)
    return tuple(every[key] for key in layout.keys)


def cells(row: StageRow, total: int | None, compact: bool, bar: int, ranges: bool = True) -> dict[str, str]:
    """Every column's text for ``row``; :data:`~tui.fleet.UNKNOWN` where no status said."""
    load = row.load
    span = span_bar(row.layers, total, bar)
    layers = UNKNOWN
    if span is not None and row.layers is not None:
        layers = f"{span} {row.layers[0]}-{row.layers[1] - 1}" if ranges else span
    standbys = ", ".join(f"{s.name} ({s.text})" for s in row.standbys) or "none"
    return {
        "stage": str(row.stage),
        "node": row.holder.name if row.holder is not None else UNKNOWN,
        "layers": layers,
        "device": load.device or UNKNOWN,
        "state": row.state.text,
        "step": UNKNOWN if load.step_ms is None else _milliseconds(load.step_ms),
        "sessions": _sessions(load.sessions, load.parked, compact),
        "memory": _memory(load.memory_mb, compact),
        "share": UNKNOWN if row.share is None else f"{row.share * 100:.0f} %",
        "standbys": standbys,
    }


def span_bar(layers: tuple[int, int] | None, total: int | None, width: int) -> str | None:
    """``width`` cells over the model's ``total`` layers, those of ``layers`` (``[start, stop)``) filled; None
    when either is unknown. A cell is filled when the layer at its middle is the stage's, and a stage always
    fills at least one cell (its first layer's), so a one-layer stage of a big model still shows."""
    if layers is None or total is None or width <= 0 or not 0 <= layers[0] < layers[1] <= total:
        return None
    start, stop = layers
    filled = [start <= (i + 0.5) * total / width < stop for i in range(width)]
    if not any(filled):
        filled[min(width - 1, start * width // total)] = True
    return "".join(FILLED if f else EMPTY for f in filled)


def _milliseconds(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def _sessions(sessions: int | None, parked: int | None, compact: bool) -> str:
    if sessions is None:
        return UNKNOWN
    if parked is None:
        return str(sessions)
    return f"{sessions}/{parked}" if compact else f"{sessions}, {parked} parked"


def _memory(mb: int | None, compact: bool) -> str:
    if mb is None:
        return UNKNOWN
    if mb < 1024:
        return f"{mb}M" if compact else f"{mb} MiB"
    return f"{mb / 1024:.1f}G" if compact else f"{mb / 1024:.1f} GiB"
