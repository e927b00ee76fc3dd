"""`LineTable`: the line-API table under the workers and overview tables.

A header row and one row per item, columns sized to their content (one cell of padding each side,
as Textual's DataTable), the widest column set that fits the width, and — when there are more rows
than room — the rows that fit and a line saying how many more. Built from spans like every other
line-API widget here (`lines.LineWidget`), so a tick that changes one cell repaints that row.

Why not DataTable: re-rendering a changed row costs it a Rich render per cell, and any
`update_cell` invalidates its whole cell cache (Textual 8.2): at the default refresh that was a
large share of the viewer's CPU even with a single worker row (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

from rich.style import Style

from loadertop.tui.theme import DIM
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line, Span
from loadertop.tui.widgets.lines import LineWidget

Cell = Line  # a cell is spans too: ("train r1", "") + (" ◀", "bold yellow")


def cell(text: str, style: str = "") -> Cell:
    return ((text, style),)


class Column(NamedTuple):
    key: str
    label: str
    justify: Literal["left", "right"] = "left"


class Row(NamedTuple):
    key: str
    cells: Mapping[str, Cell]


class LineTable(LineWidget):
    """Subclasses say what the columns are (`COLUMNS`, `COLUMN_SETS` widest first) and call
    `set_rows` with the rows to show."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"table--header"}
    DEFAULT_CSS = """
    LineTable > .table--header {
        text-style: bold;
        background: $panel;
        color: $foreground;
    }
    """
    COLUMNS: ClassVar[Mapping[str, Column]] = {}
    COLUMN_SETS: ClassVar[Sequence[Sequence[str]]] = ()
    #: What the overflow line calls the rows left out ("… 3 more workers").
    ROWS_NAME: ClassVar[str] = "rows"

    can_focus = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.compact = False
        self._rows: list[Row] = []
        self._built_height = -1
        self._header_style: Style | None = None

    # ------------------------------------------------------------------ content

    def set_rows(self, rows: Sequence[Row]) -> None:
        self._rows = list(rows)
        self.update_lines()

    def column_sets(self) -> Sequence[Sequence[str]]:
        return self.COLUMN_SETS

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def row_keys(self) -> list[str]:
        return [row.key for row in self._rows]

    def rows_text(self) -> list[list[str]]:
        """Every row's cells as plain text, in the column set now shown (tests read them)."""
        keys = self._fitting(self._width())
        return [[graphics.plain(row.cells[k]) for k in keys] for row in self._rows]

    def column_labels(self) -> list[str]:
        return [self.COLUMNS[k].label for k in self._fitting(self._width())]

    # ------------------------------------------------------------------ layout

    def _widths(self, keys: Sequence[str]) -> list[int]:
        return [max([len(self.COLUMNS[k].label), *(graphics.line_len(row.cells[k]) for row in self._rows)])
                for k in keys]

    def _fitting(self, width: int) -> Sequence[str]:
        """The first (widest) column set whose content fits ``width``; else the last."""
        sets = self.column_sets()
        for keys in sets:
            if sum(w + 2 for w in self._widths(keys)) <= width:
                return keys
        return sets[-1]

    def _header(self) -> Style:
        if self._header_style is None:
            self._header_style = self.get_component_rich_style("table--header")
        return self._header_style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._header_style = None

    def build(self, width: int) -> list[Line]:
        keys = self._fitting(width)
        widths = self._widths(keys)
        columns = [self.COLUMNS[k] for k in keys]
        header_style = self._header()
        header: list[Span] = []
        for col, w in zip(columns, widths):
            label = col.label.rjust(w) if col.justify == "right" else col.label.ljust(w)
            header.append((f" {label} ", header_style))
        lines: list[Line] = [tuple(header)]
        rows = self._rows
        room = self.size.height - 1  # less the header
        if 0 < room < len(rows):
            shown, hidden = rows[:max(0, room - 1)], len(rows) - max(0, room - 1)
        else:
            shown, hidden = rows, 0
        for row in shown:
            line: list[Span] = []
            for col, w in zip(columns, widths):
                spans = row.cells[col.key]
                pad = " " * (w - graphics.line_len(spans))
                line += [(" " + pad, ""), *spans, (" ", "")] if col.justify == "right" \
                    else [(" ", ""), *spans, (pad + " ", "")]
            lines.append(graphics.merge(line))
        if hidden:
            lines.append(((f" … {hidden} more {self.ROWS_NAME}", DIM),))
        return lines

    def on_resize(self) -> None:
        super().on_resize()
        if self.size.height != self._built_height:  # the rows that fit depend on the height
            self._built_height = self.size.height
            self.update_lines()
