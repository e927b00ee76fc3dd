"""The overview table (`o`): every source on one line, the selected one marked, the straggler rank
flagged as the model named it (`Document.ranks`: one rule for the screen and `snapshot`), and a
source with findings marked by its name: how many, in the colour of the worst ("val ✖ 2")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadertop.client.document import Document
from loadertop.client.units import MISSING, fmt_frac_pct, fmt_ms, fmt_per_s
from loadertop.tui.theme import (
    ACCENT,
    STATE_COLOURS,
    WARN,
    category_style,
    source_labels,
    source_title,
    wait_colour,
)
from loadertop.tui.widgets.findings import marks
from loadertop.tui.widgets.graphics import Line
from loadertop.tui.widgets.tables import Column, LineTable, Row, cell
from loadertop.views.text import shown_state

STRAGGLER_MARK = " ◀"


def straggler_index(doc: Document | None) -> int | None:
    """The index in ``doc.sources`` of the straggler rank the model named, or None."""
    if doc is None or doc.ranks.straggler is None:
        return None
    return next((i for i, s in enumerate(doc.sources) if s.id == doc.ranks.straggler), None)


class OverviewTable(LineTable):
    COLUMNS = {
        "sel": Column("sel", " "), "source": Column("source", "source"),
        "name": Column("name", "name"), "rank": Column("rank", "rank"),
        "where": Column("where", "host:pid"), "state": Column("state", "state"),
        "rate": Column("rate", "batch/s", "right"), "p95": Column("p95", "wait p95", "right"),
        "wf": Column("wf", "wait %", "right"), "cat": Column("cat", "diagnosis"),
    }
    COLUMN_SETS = (
        ("sel", "name", "rank", "where", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "where", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "rate", "wf", "cat"),
    )
    ROWS_NAME = "sources (tab to reach them)"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.set_title("All sources")

    def column_sets(self) -> Sequence[Sequence[str]]:
        return self.COLUMN_SETS[1:] if self.compact else self.COLUMN_SETS

    def show(self, doc: Document | None, selected: int) -> None:
        sources = doc.sources if doc is not None else ()
        straggler = straggler_index(doc)
        labels = source_labels(sources)
        rows = []
        for i, s in enumerate(sources):
            cat = category_style(s.diagnosis.category)
            weight = "bold" if i == selected else ""
            mark: Line = ((STRAGGLER_MARK, f"bold {WARN}"),) if i == straggler else ()
            found = marks(s.findings)
            if found:
                mark += ((" ", ""), *found)
            rows.append(Row(s.id, {
                "sel": cell("▶" if i == selected else " ", f"bold {ACCENT}"),
                "source": ((labels[i], weight), *mark),
                "name": ((s.name or MISSING, weight), *mark),
                "rank": cell(MISSING if s.rank is None else str(s.rank)),
                "where": cell(f"{s.host or MISSING}:{s.pid}"),
                "state": cell(shown_state(s), STATE_COLOURS.get(shown_state(s), "")),
                "rate": cell(fmt_per_s(s.batches_per_s)),
                "p95": cell(fmt_ms(None if s.wait_ms is None else s.wait_ms.p95)),
                "wf": cell(fmt_frac_pct(s.wait_fraction), wait_colour(s.wait_fraction, s.diagnosis.category)),
                "cat": cell(cat.words, cat.colour),
            }))
        self.set_rows(rows)
        title = f"All sources ({len(sources)})"
        if straggler is not None:
            s = sources[straggler]
            title += f" · [{WARN}]◀ straggler: {source_title(s.name, s.rank)} waits most[/]"
        self.set_title(title)
