"""The workers table: one row per DataLoader worker of the selected source, sortable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from loadertop.client.document import Finding, Source, WorkerFigures
from loadertop.client.units import MISSING, fmt_bytes, fmt_float, fmt_ms
from loadertop.tui.theme import BAD, DIM, OK, severity_style, worst
from loadertop.tui.widgets.tables import Cell, Column, LineTable, Row, cell


def _none_low(value: float | None) -> tuple[int, float]:
    return (0, 0.0) if value is None else (1, value)


class WorkerSort(NamedTuple):
    label: str
    key: Callable[[WorkerFigures], tuple[int, float]]
    descending: bool


#: Sort keys (the app's c / m / f / i), on the figures, not on rendered cells.
WORKER_SORTS: dict[str, WorkerSort] = {
    "cpu": WorkerSort("CPU %", lambda w: _none_low(w.cpu_percent), True),
    "mem": WorkerSort("RSS", lambda w: _none_low(w.rss_bytes), True),
    "fetch": WorkerSort("fetch p50", lambda w: _none_low(None if w.fetch_ms is None else w.fetch_ms.p50),
                        True),
    "id": WorkerSort("id", lambda w: _none_low(w.id), False),
}


class WorkersTable(LineTable):
    """Per worker: getting the items (fetch) and the collate_fn, each per batch in ms — together a
    worker's whole time per batch — its CPU share while producing, CPU % and memory. A worker with
    a finding has its severity's mark by its id; a hung one says so, and for how long."""

    COLUMN_SETS = (
        ("id", "pid", "state", "batches", "fetch50", "fetch95", "collate50", "busy", "cpu", "rss"),
        ("id", "pid", "state", "fetch50", "collate50", "busy", "cpu", "rss"),
        ("id", "state", "fetch50", "collate50", "busy", "cpu", "rss"),
    )
    COLUMNS = {
        "id": Column("id", "id"), "pid": Column("pid", "pid"), "state": Column("state", "state"),
        "batches": Column("batches", "batches", "right"),
        "fetch50": Column("fetch50", "fetch p50", "right"),
        "fetch95": Column("fetch95", "fetch p95", "right"),
        "collate50": Column("collate50", "collate p50", "right"),
        "busy": Column("busy", "cpu_frac", "right"),
        "cpu": Column("cpu", "CPU %", "right"), "rss": Column("rss", "RSS", "right"),
    }
    ROWS_NAME = "workers (sort: c m f i)"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_by = "id"
        self.reverse = False

    def column_sets(self) -> Sequence[Sequence[str]]:
        return self.COLUMN_SETS[-1:] if self.compact else self.COLUMN_SETS

    def show(self, src: Source | None) -> None:
        sort = WORKER_SORTS[self.sort_by]
        descending = sort.descending != self.reverse
        workers = sorted(src.workers if src is not None else (), key=sort.key, reverse=descending)
        findings = src.findings if src is not None else ()
        self.set_rows([Row(str(w.id), self._cells(w, [f for f in findings if f.worker == w.id]))
                       for w in workers])
        dead = sum(1 for w in workers if w.alive is False)
        title = f"Workers ({len(workers)}" + (f", [{BAD}]{dead} dead[/]" if dead else "") + ")"
        if not workers and src is not None and src.config.num_workers == 0:
            title = "Workers (none: num_workers=0)"
        self.set_title(f"{title} · sort {sort.label} {'▼' if descending else '▲'}")

    @staticmethod
    def _cells(w: WorkerFigures, findings: list[Finding]) -> dict[str, Cell]:
        hung = any(f.kind == "worker_hung" for f in findings)
        if w.alive is False:
            state = cell(f"dead, exit {MISSING if w.exitcode is None else w.exitcode}", f"bold {BAD}")
        elif hung:
            state = cell(f"hung {fmt_ms(w.busy_ms)}" if w.busy_ms is not None else "hung", f"bold {BAD}")
        elif w.alive is None:
            state = cell(MISSING, DIM)
        else:
            state = cell("alive", OK)
        fetch, collate = w.fetch_ms, w.collate_ms
        cpu = w.cpu_percent
        top = worst(findings)
        mark = severity_style(top.severity) if top is not None else None
        return {
            "id": ((str(w.id), ""), (f" {mark.glyph}", f"bold {mark.colour}")) if mark else cell(str(w.id)),
            "pid": cell(MISSING if w.pid is None else str(w.pid)),
            "state": state,
            "batches": cell(str(w.batches)),
            "fetch50": cell(fmt_ms(None if fetch is None else fetch.p50)),
            "fetch95": cell(fmt_ms(None if fetch is None else fetch.p95)),
            "collate50": cell(fmt_ms(None if collate is None else collate.p50)),
            "busy": cell(fmt_float(w.cpu_fraction)),
            # Not coloured: a worker at 100 % is one that computes (cpu_frac says so), not a
            # saturated machine; the machine's CPU panel shows that, in its bands.
            "cpu": cell(MISSING if cpu is None else f"{cpu:.0f}"),
            "rss": cell(fmt_bytes(w.rss_bytes)),
        }
