"""Widgets of the loadertop screen. They only render what the app hands them.

Reading is not rendering: the app pulls one document per tick from the feed and calls ``show(...)``
on each widget inside ``batch_update()``. Nothing here talks to the network, keeps a clock or
computes a figure the model already computed; history deques belong to the app.

Graphs are plain text (unicode blocks, one character per tick): textual-plotext at 10 Hz cost 41 %
of a core on the reference machine (FIELD-NOTES), a text sparkline almost nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from rich.text import Text
from textual.widget import Widget
from textual.widgets import DataTable

from loadertop.viewer import ranks
from loadertop.viewer.units import (  # noqa: F401  (re-exported: tests and the app use them here)
    MISSING,
    _num,
    fmt_bytes,
    fmt_duration,
    fmt_float,
    fmt_frac_pct,
    fmt_ms,
    fmt_pair,
    fmt_pct,
    fmt_per_s,
    fmt_rate,
)

# --------------------------------------------------------------------------- one place for words & colours



class Category(NamedTuple):
    words: str  # what the banner says
    colour: str  # Rich colour of the words
    level: str  # CSS class suffix of the banner: ok / warn / bad / none


#: Diagnosis category (CONTRACT §4) → how the screen names and colours it. The only such table.
CATEGORIES: dict[str, Category] = {
    "compute_bound": Category("Healthy: compute-bound", "green", "ok"),
    "input_bound_io": Category("Input-bound: waiting on I/O", "yellow", "warn"),
    "input_bound_cpu": Category("Input-bound: workers CPU-limited", "yellow", "warn"),
    "main_process_bound": Category("Main-process-bound", "#ff8700", "warn"),
    "cpu_saturated": Category("CPU saturated", "red", "bad"),
    "memory_pressure": Category("Memory pressure", "red", "bad"),
    "stalled": Category("Stalled", "red", "bad"),
    "idle": Category("Idle", "#9e9e9e", "none"),
    "insufficient_data": Category("Gathering data", "#9e9e9e", "none"),
}


def category(name: str | None) -> Category:
    if name is None:
        return Category("No diagnosis yet", "#9e9e9e", "none")
    return CATEGORIES.get(name, Category(name.replace("_", " "), "#9e9e9e", "none"))


# Colour thresholds (percent of capacity in use), as named constants, like nvitop's.
LOAD_WARN_PERCENT = 75.0
LOAD_BAD_PERCENT = 90.0
# Wait fraction: PyTorch's profiler plugin flags loading above 5 % of step time.
WAIT_WARN_FRACTION = 0.05
WAIT_BAD_FRACTION = 0.25
# Freshness: seconds without a message before the header says so / calls it disconnected.
STALE_AFTER_S = 3.0
DISCONNECTED_AFTER_S = 30.0
# The loop being inside next() longer than this is worth a red line in the loader panel.
BLOCKED_SHOW_MS = 1000.0

# Hex, not Rich names like grey62: Textual parses colours itself, and a name it does not know costs
# a failed parse plus a difflib suggestion search on every render (measured: the 1 s viewer's CPU).
OK, WARN, BAD, DIM, ACCENT = "green", "yellow", "red", "#9e9e9e", "cyan"


def load_colour(percent: float | None) -> str:
    if percent is None:
        return DIM
    if percent >= LOAD_BAD_PERCENT:
        return BAD
    if percent >= LOAD_WARN_PERCENT:
        return WARN
    return OK


def wait_colour(fraction: float | None) -> str:
    if fraction is None:
        return DIM
    if fraction >= WAIT_BAD_FRACTION:
        return BAD
    if fraction >= WAIT_WARN_FRACTION:
        return WARN
    return OK


# --------------------------------------------------------------------------- units


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# --------------------------------------------------------------------------- text graphics

SPARK_CHARS = "▁▂▃▄▅▆▇█"
BAR_PARTIAL = " ▏▎▍▌▋▊▉"


def sparkline(values: Iterable[float | None], width: int, top: float | None = None) -> str:
    """The last ``width`` values as unicode blocks, right-aligned; None is a gap."""
    vals = list(values)[-width:] if width > 0 else []
    known = [v for v in vals if v is not None]
    peak = top if top is not None else (max(known) if known else 0.0)
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        elif peak <= 0:
            out.append(SPARK_CHARS[0])
        else:
            idx = int(round(min(max(v / peak, 0.0), 1.0) * (len(SPARK_CHARS) - 1)))
            out.append(SPARK_CHARS[idx])
    return " " * (width - len(out)) + "".join(out)


def sparkline_rows(values: Iterable[float | None], width: int, height: int,
                   top: float | None = None) -> list[str]:
    """A sparkline ``height`` rows tall (eighth-block resolution per row), top row first."""
    if height <= 1:
        return [sparkline(values, width, top)]
    vals = list(values)[-width:] if width > 0 else []
    known = [v for v in vals if v is not None]
    peak = top if top is not None else (max(known) if known else 0.0)
    levels = [None if v is None else (0 if peak <= 0 else
              int(round(min(max(v / peak, 0.0), 1.0) * height * 8))) for v in vals]
    # Every known value shows at least the lowest eighth, like the one-row sparkline.
    levels = [None if lv is None else max(1, lv) for lv in levels]
    rows = []
    for r in range(height - 1, -1, -1):  # r = row index from the bottom
        chars = []
        for lv in levels:
            if lv is None:
                chars.append(" ")
                continue
            fill = lv - r * 8
            chars.append(" " if fill <= 0 else "█" if fill >= 8 else SPARK_CHARS[fill - 1])
        rows.append(" " * (width - len(chars)) + "".join(chars))
    return rows


def bar(fraction: float | None, width: int, colour: str = ACCENT) -> Text:
    """A horizontal bar with eighth-block resolution; unknown → a dim empty track."""
    width = max(1, width)
    if fraction is None:
        return Text("·" * width, style=DIM)
    cells = min(max(fraction, 0.0), 1.0) * width
    full = int(cells)
    part = BAR_PARTIAL[int((cells - full) * 8)] if full < width else ""
    filled = "█" * full + part.strip()
    return Text.assemble((filled, colour), ("·" * (width - len(filled)), DIM))


def one_block(lines: Sequence[Text]) -> Text:
    """Lines joined, each cut with an ellipsis at the widget's width rather than wrapped."""
    block = Text("\n").join(lines)
    block.no_wrap = True
    block.overflow = "ellipsis"
    return block


def set_content(widget: Widget, old: Text | None, new: Text) -> bool:
    """Repaint ``widget`` for its new content only if it changed, and lay the screen out again only
    if its number of lines did: a relayout redraws everything, and at 10 Hz that was most of the
    viewer's CPU (profiled: Textual's layout and compositor, not our figures)."""
    if old is not None and new == old:
        return False
    widget.refresh(layout=old is None or old.plain.count("\n") != new.plain.count("\n"))
    return True


def set_border_title(widget: Widget, title: str) -> None:
    """Textual repaints on every border_title assignment, equal or not."""
    if getattr(widget, "_lt_border_title", None) != title:
        widget._lt_border_title = title
        widget.border_title = title


def label(text: str, width: int = 0) -> Text:
    return Text(text.ljust(width), style="bold")


def dim(text: str) -> Text:
    return Text(text, style=DIM)


# --------------------------------------------------------------------------- header


def freshness(src: dict | None, viewer: dict | None) -> Text:
    """live / no data for N s / disconnected — from the model's age_s and viewer.connected."""
    connected = (viewer or {}).get("connected", True)
    age = src.get("age_s") if src else None
    if src is None and not (viewer or {}).get("received"):
        return Text("waiting for data", style=DIM)  # nothing ever arrived: not a disconnection
    if connected is False or (age is not None and age >= DISCONNECTED_AFTER_S):
        extra = f" (no data for {age:.0f} s)" if age is not None else ""
        return Text(f"✖ disconnected{extra}", style=f"bold {BAD}")
    if src is None:
        return Text("waiting for data", style=DIM)
    if age is None:
        return Text("waiting for data", style=DIM)
    if age >= STALE_AFTER_S:
        return Text(f"● no data for {age:.0f} s", style=f"bold {WARN}")
    return Text("● live", style=f"bold {OK}")


def waiting_for(doc: dict | None) -> str | None:
    """"waiting for data from ENDPOINT" while connected endpoints have sent nothing yet, else None."""
    if doc is None or doc.get("sources"):
        return None
    viewer = doc.get("viewer") or {}
    endpoints = viewer.get("endpoints") or []
    if not endpoints or viewer.get("received"):
        return None
    shown = ", ".join(endpoints[:2]) + (f" (+{len(endpoints) - 2})" if len(endpoints) > 2 else "")
    return f"waiting for data from {shown}"


def source_title(src: dict) -> str:
    rank = src.get("rank")
    return f"{src.get('name') or '?'}" + (f" r{rank}" if rank is not None else "")


def source_labels(sources: Sequence[dict]) -> list[str]:
    """Each source's title, with host:pid added where two share one (two processes both
    calling their loader "train")."""
    titles = [source_title(s) for s in sources]
    counts: dict[str, int] = {}
    for t in titles:
        counts[t] = counts.get(t, 0) + 1
    return [t if counts[t] == 1 else f"{t} {s.get('host') or MISSING}:{s.get('pid') or MISSING}"
            for t, s in zip(titles, sources)]


class HeaderBar(Widget):
    """Identity of the selected source, uptime, freshness, losses, overhead, refresh, clock."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._content = Text("loadertop", style="bold")

    def show(self, doc: dict | None, src: dict | None, *, now: float, paused: bool,
             refresh_s: float, selected: int, compact: bool, note: str | None = None) -> None:
        content = self._build(doc, src, now, paused, refresh_s, selected, compact, note)
        old, self._content = self._content, content
        set_content(self, old, content)

    def render(self) -> Text:
        return self._content

    def _build(self, doc: dict | None, src: dict | None, now: float, paused: bool,
               refresh_s: float, selected: int, compact: bool, note: str | None = None) -> Text:
        viewer = (doc or {}).get("viewer") or {}
        sep = dim(" · ")
        left = Text()
        left.append("loadertop ", style=f"bold {ACCENT}")
        if src is not None:
            left.append(source_title(src), style="bold")
            left.append_text(dim(f" {src.get('host') or MISSING}:{src.get('pid') or MISSING}"))
        elif doc is not None:
            left.append_text(dim(waiting_for(doc) or "no instrumented DataLoader found"))
        else:
            left.append_text(dim("starting"))

        right = Text()
        if paused:
            right.append(" ⏸ PAUSED ", style="bold reverse")
            right.append(" ")
        right.append_text(dim(f"⟳ {refresh_s:g} s "))
        right.append(time.strftime("%H:%M:%S", time.localtime(now)), style="bold")

        status = Text()
        status.append_text(freshness(src, viewer))
        if src is not None:
            started = src.get("started_at")
            status.append_text(sep)
            status.append_text(dim("up "))
            status.append(fmt_duration(None if started is None else now - started))
            dropped = src.get("dropped")
            bad = viewer.get("bad_messages")
            status.append_text(sep)
            status.append_text(dim("dropped "))
            status.append(MISSING if dropped is None else str(dropped),
                          style=WARN if dropped else "")
            if bad or viewer.get("wrong_version"):
                status.append_text(dim(" bad "))
                status.append(str((bad or 0) + (viewer.get("wrong_version") or 0)), style=WARN)
            status.append_text(sep)
            status.append_text(dim("probe "))
            probe = src.get("probe_cpu_fraction")
            status.append(MISSING if probe is None else f"{probe * 100:.1f} % cpu")

        width = max(self.size.width, 20)
        # Line 1: identity (+ command when it fits) ... paused/refresh/clock on the right.
        line1 = left.copy()
        if src is not None and src.get("command"):
            room = width - line1.cell_len - right.cell_len - 4
            if room > 12:
                line1.append_text(dim("  $ "))
                line1.append(shorten(src["command"], room))
        pad = width - line1.cell_len - right.cell_len
        if pad < 1:
            line1.truncate(max(1, width - right.cell_len - 1), overflow="ellipsis")
            pad = width - line1.cell_len - right.cell_len
        line1.append(" " * max(1, pad))
        line1.append_text(right)
        lines = [line1, status]
        if note:
            lines.append(Text(note, style=ACCENT))

        sources = (doc or {}).get("sources") or []
        if len(sources) > 1:
            tabs = Text()
            tabs.append_text(dim("sources "))
            for i, title in enumerate(source_labels(sources)):
                name = f" {title} "
                tabs.append(name, style="bold reverse" if i == selected else "")
                tabs.append(" ")
            tabs.append_text(dim("(tab/[ ] switch, o overview)"))
            if compact:
                status.append_text(sep)
                status.append_text(dim(f"source {selected + 1}/{len(sources)} (tab)"))
            else:
                lines.append(tabs)
        return one_block(lines)


# --------------------------------------------------------------------------- banner


class Banner(Widget):
    """The bottleneck: category words in colour, summary, top evidence, first advice."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._content = Text("Waiting for data…", style=DIM)
        self._shown_rows = 1
        self._key: Any = None
        self.set_class(True, "-none")

    def show(self, diag: dict | None, src: dict | None, *, compact: bool,
             waiting: str | None = None) -> None:
        """``waiting``: no data has arrived yet (say so, rather than diagnose an empty window)."""
        key = (repr(diag), src.get("id") if src else None, compact, waiting)
        if key == self._key:
            return
        self._key = key
        if waiting:
            for level in ("ok", "warn", "bad", "none"):
                self.set_class(level == "none", f"-{level}")
            self._content = Text.assemble(("WAITING FOR DATA", f"bold {DIM}"), "  ",
                                          dim(waiting.replace("waiting for data ", "")),
                                          dim("  — the job may still be starting"))
            self.refresh(layout=True)
            return
        cat = category(diag.get("category") if diag else None)
        for level in ("ok", "warn", "bad", "none"):
            self.set_class(level == cat.level, f"-{level}")
        text = Text()
        text.append(f"{cat.words.upper()}", style=f"bold {cat.colour}")
        if src is not None:
            text.append_text(dim(f"  [{source_title(src)}]"))
        if diag and diag.get("summary"):
            text.append("  ")
            text.append(diag["summary"])
        lines = [text]
        evidence = (diag or {}).get("evidence") or []
        advice = (diag or {}).get("advice") or []
        if evidence:
            shown = evidence[:1] if compact else evidence[:3]
            lines.append(Text.assemble(("evidence ", DIM), "; ".join(shown)))
        if advice:
            lines.append(Text.assemble(("→ ", f"bold {cat.colour}"), advice[0]))
        old, self._content = self._content, one_block(lines) if compact else Text("\n").join(lines)
        # Wide, the lines wrap: the row count to compare is the wrapped one, not the line count.
        rows = self._rows(self._content, compact)
        if rows != self._shown_rows:
            self._shown_rows = rows
            self.refresh(layout=True)
        else:
            set_content(self, old, self._content)

    def _rows(self, content: Text, compact: bool) -> int:
        width = self.content_size.width
        if compact or width <= 0 or not self.is_mounted:
            return content.plain.count("\n") + 1
        return len(content.wrap(self.app.console, width))

    def render(self) -> Text:
        return self._content


# --------------------------------------------------------------------------- panels


class Panel(Widget):
    """A bordered text panel: ``show`` stores what to draw; ``render`` lays it out at its width."""

    compact = False

    def __init__(self, title: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self._data: Any = None
        self._history: dict[str, Sequence[float | None]] = {}
        self._content: Text | None = None  # what render() returns, built for _content_width
        self._content_width = -1

    def show(self, data: Any, history: dict[str, Sequence[float | None]]) -> None:
        self._data = data
        self._history = history
        self._update()

    def _update(self) -> None:
        """Build the content now; repaint (or relayout) only when it changed."""
        width = self._width()
        old, self._content, self._content_width = self._content, self._build(width), width
        set_content(self, old, self._content)

    def set_compact(self, compact: bool) -> None:
        if compact != self.compact:
            self.compact = compact
            self.set_class(compact, "-compact")
            self._content = None
            self.refresh(layout=True)

    def _width(self) -> int:
        return max(10, self.content_size.width)

    def _build(self, width: int) -> Text:
        try:
            lines = self.lines(width)
        except Exception as exc:  # a malformed document must not kill the screen
            lines = [Text(f"cannot show: {exc!r}", style=BAD)]
        return one_block(lines)

    def render(self) -> Text:
        width = self._width()
        if self._content is None or width != self._content_width:  # first draw, or resized
            self._content, self._content_width = self._build(width), width
        return self._content

    def lines(self, width: int) -> list[Text]:  # pragma: no cover - overridden
        return []


def stats_text(st: dict | None, keys: Sequence[str] = ("p50", "p95", "p99")) -> Text:
    t = Text()
    for k in keys:
        t.append(f"{k} ", style=DIM)
        t.append(fmt_ms((st or {}).get(k)))
        t.append("  ")
    t.append("ms", style=DIM)
    return t


MAX_GRAPH_ROWS = 8  # taller is a wall of blocks, not more information
#: A graph grows one row per this many points: a few points drawn tall are a solid block.
POINTS_PER_GRAPH_ROW = 3


def graph_height(values: Sequence[float | None], width: int, room: int) -> int:
    """Rows for a graph of ``values``: what the room allows, but no taller than its history."""
    known = sum(1 for v in list(values)[-width:] if v is not None)
    return max(1, min(MAX_GRAPH_ROWS, room, known // POINTS_PER_GRAPH_ROW))


def graph_caption(name: str, values: Sequence[float | None], width: int, unit: str,
                  fmt: Any, colour: str) -> Text:
    """"wait p95  73.2 ms   max 114 · 1 s/col" — the line above a graph: what, now, scale."""
    shown = list(values)[-width:]
    known = [v for v in shown if v is not None]
    now = shown[-1] if shown else None
    line = Text()
    line.append(name, style="bold")
    line.append("  ")
    line.append(fmt(now), style=f"bold {colour}")
    line.append(f" {unit}" if unit else "", style=DIM)
    if known:
        line.append(f"   max {fmt(max(known))}", style=DIM)
    return line


def graph_lines(name: str, values: Sequence[float | None], width: int, height: int, label_w: int,
                colour: str, fmt: Any) -> list[Text]:
    """A one-row graph with its label in front and its peak after (compact layouts)."""
    known = [v for v in list(values)[-width:] if v is not None]
    peak = f" {fmt(max(known)) if known else MISSING} max"
    out = []
    for row, chars in enumerate(sparkline_rows(values, width, height)):
        line = Text()
        line.append((name if row == height - 1 else "").ljust(label_w), style=DIM)
        line.append(chars, style=colour)
        if row == 0:
            line.append(peak, style=DIM)
        out.append(line)
    return out


class LoaderPanel(Panel):
    """The selected source: wait history, percentiles, throughput, wait fraction, queue fill."""

    def show(self, src: dict | None, history: dict[str, Sequence[float | None]]) -> None:
        if src is None:
            set_border_title(self, "Loader")
        else:
            cat = category((src.get("diagnosis") or {}).get("category"))
            set_border_title(self, f"Loader · {source_title(src)} · [{cat.colour}]{cat.words}[/]")
        super().show(src, history)

    #: Rows the workers table keeps below the panel at least (header, a few rows, its border).
    MIN_TABLE_ROWS = 6

    def _graph_room(self, fixed_lines: int, workers: int) -> int:
        """Rows left for the two graphs: the column's height less the table's and our own text."""
        column = self.parent.content_size.height if self.parent is not None else 0
        if column <= 0:
            return 2
        table = max(self.MIN_TABLE_ROWS, workers + 3)
        border = self.styles.gutter.height  # our border and padding
        return max(2, column - table - border - fixed_lines)

    def lines(self, width: int) -> list[Text]:
        src = self._data
        if src is None:
            return [dim("No instrumented DataLoader yet. Start your job with loadertop.instrument() "
                        "or `loadertop run`.")]
        out: list[Text] = []
        cfg = src.get("config") or {}
        state = src.get("state") or MISSING
        state_style = {"running": OK, "waiting": WARN, "stalled": f"bold {BAD}",
                       "gone": BAD}.get(state, DIM)
        line = Text()
        line.append(state, style=state_style)
        line.append("  batch ", style=DIM)
        total = src.get("batches_total")
        line.append(f"{src.get('batches', MISSING)}" + (f"/{total}" if total else ""))
        line.append("  ")
        line.append(fmt_per_s(src.get("batches_per_s")), style="bold")
        line.append(" batches/s  ", style=DIM)
        line.append(fmt_per_s(src.get("samples_per_s")), style="bold")
        line.append(" samples/s", style=DIM)
        out.append(line)

        wf = src.get("wait_fraction")
        line = Text()
        line.append("wait  ", style="bold")
        line.append_text(stats_text(src.get("wait_ms")))
        line.append("   waiting ", style=DIM)
        line.append(fmt_frac_pct(wf), style=f"bold {wait_colour(wf)}")
        line.append(" of the time", style=DIM)
        out.append(line)

        blocked = src.get("blocked_ms")
        if blocked is not None and blocked >= BLOCKED_SHOW_MS:
            out.append(Text(f"blocked in next() for {fmt_ms(blocked)}", style=f"bold {BAD}"))

        if not self.compact:
            line = Text()
            line.append("step  ", style="bold")
            line.append_text(stats_text(src.get("step_ms"), ("p50", "p95")))
            out.append(line)

        queue = src.get("queue") or {}
        capacity = queue.get("capacity")
        if capacity:
            ready, in_flight = queue.get("ready"), queue.get("in_flight")
            bar_w = max(8, min(capacity * 2, width // 4))
            line = Text()
            line.append("queue ", style="bold")
            line.append("▕", style=DIM)
            fill = None if ready is None else ready / capacity
            line.append_text(bar(fill, bar_w, OK if (fill or 0) >= 0.5 else WARN))
            line.append("▏ ", style=DIM)
            line.append(f"{MISSING if ready is None else ready}")
            line.append(" ready · ", style=DIM)
            line.append(f"{MISSING if in_flight is None else in_flight}")
            line.append(" in flight", style=DIM)
            line.append(f" / {capacity}")
            if not self.compact and queue.get("ready_mean") is not None:
                extra = Text.assemble(("   avg ", DIM), fmt_float(queue.get("ready_mean"), 1),
                                      (" ready", DIM))
                if queue.get("ready_when_waiting") is not None:
                    extra.append_text(Text.assemble(
                        (" · ready while waiting ", DIM),
                        fmt_frac_pct(queue.get("ready_when_waiting"))))
                if line.cell_len + extra.cell_len <= width:  # extra detail only when it fits
                    line.append_text(extra)
            out.append(line)
        else:
            loop = src.get("loop") or {}
            line = Text()
            line.append("main process loads (num_workers=0)  ", style="bold")
            line.append("fetch ", style=DIM)
            line.append_text(stats_text(loop.get("fetch_ms"), ("p50", "p95")))
            line.append("  cpu ", style=DIM)
            line.append(fmt_float(loop.get("cpu_fraction")))
            out.append(line)

        waits = self._history.get("wait_p95_ms") or []
        rates = self._history.get("batches_per_s") or []
        if self.compact:
            label_w = 13
            out += graph_lines("wait p95 ms", waits, max(4, width - label_w - 12), 1, label_w,
                               wait_colour(wf), fmt_ms)
            return out
        # Wide: each graph under a caption, full width, sharing the rows the workers table leaves
        # (60/40); the panel is as tall as its content, the table takes the rest.
        room = self._graph_room(len(out) + 3, len(src.get("workers") or []))
        wait_room = min(MAX_GRAPH_ROWS, max(1, math.ceil(room * 0.6)))
        rate_room = min(MAX_GRAPH_ROWS, max(1, room - wait_room))
        wait_h = graph_height(waits, width, wait_room)
        rate_h = graph_height(rates, width, rate_room)
        # Rows a young graph does not use yet stay blank above it: the panel keeps its height while
        # the history grows (a height change relayouts the whole screen).
        out.append(graph_caption("wait p95", waits, width, "ms", fmt_ms, wait_colour(wf)))
        out += [Text()] * (wait_room - wait_h)
        out += [Text(row, style=wait_colour(wf)) for row in sparkline_rows(waits, width, wait_h)]
        out.append(graph_caption("batches/s", rates, width, "", fmt_per_s, ACCENT))
        out += [Text()] * (rate_room - rate_h)
        out += [Text(row, style=ACCENT) for row in sparkline_rows(rates, width, rate_h)]
        parts = [f"{cfg.get('num_workers', MISSING)} workers"]
        if cfg.get("prefetch_factor"):
            parts.append(f"prefetch {cfg['prefetch_factor']}")
        parts.append(f"batch {cfg.get('batch_size', MISSING)}")
        if cfg.get("pin_memory"):
            parts.append("pin_memory")
        if cfg.get("persistent_workers"):
            parts.append("persistent")
        if cfg.get("worker_context"):
            parts.append(str(cfg["worker_context"]))
        if cfg.get("dataset"):
            parts.append(str(cfg["dataset"]))
        out.append(dim(" · ".join(parts)))
        return out


def _gpu_lines(gpu: dict, width: int, compact: bool, history: Sequence[float | None]) -> list[Text]:
    util = gpu.get("util_percent")
    used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
    mem_frac = used / total if used is not None and total else None
    head = Text()
    head.append(f"GPU{gpu.get('index', '?')} ", style="bold")
    if compact:
        head.append("util ", style=DIM)
        head.append(fmt_pct(util), style=ACCENT)
        head.append("  mem ", style=DIM)
        head.append(fmt_pair(used, total))
        head.append("  ")
        head.append(MISSING if gpu.get("temperature_c") is None else f"{gpu['temperature_c']:.0f}°C")
        head.append("  ")
        head.append(MISSING if gpu.get("power_w") is None else f"{gpu['power_w']:.0f} W")
        return [head]
    head.append(gpu.get("name") or "", style=DIM)
    temp, power, limit = gpu.get("temperature_c"), gpu.get("power_w"), gpu.get("power_limit_w")
    head.append("  ")
    head.append(MISSING if temp is None else f"{temp:.0f}°C")
    head.append("  ")
    head.append(MISSING if power is None else f"{power:.0f}")
    head.append(f"/{limit:.0f} W" if limit else " W", style=DIM)
    bar_w = max(6, width - 24)
    util_line = Text.assemble(("util ", DIM), bar(None if util is None else util / 100, bar_w, ACCENT),
                              f" {fmt_pct(util):>6}")
    mem_line = Text.assemble(("mem  ", DIM), bar(mem_frac, bar_w, load_colour(
        None if mem_frac is None else mem_frac * 100)),
        f" {fmt_pair(used, total)}")
    hist = Text.assemble(("util ", DIM), (sparkline(history, max(4, width - 5), top=100.0), ACCENT))
    return [head, util_line, mem_line, hist]


class GpuPanel(Panel):
    def lines(self, width: int) -> list[Text]:
        sys_ = self._data
        if sys_ is None:
            return [dim("GPU: waiting for system data")]
        status = sys_.get("gpu_status") or ""
        gpus = sys_.get("gpus") or []
        if status == "no_nvml":
            return [dim("No GPU: NVML not available")]
        if status == "no_gpu" or (status == "ok" and not gpus):
            return [dim("No GPU found")]
        if status.startswith("error"):
            return [Text(f"GPU {status}", style=BAD)]
        out: list[Text] = []
        for gpu in gpus:
            out += _gpu_lines(gpu, width, self.compact,
                              self._history.get(f"gpu{gpu.get('index')}_util") or [])
        return out


class CpuPanel(Panel):
    def lines(self, width: int) -> list[Text]:
        sys_ = self._data
        if sys_ is None:
            return [dim("CPU: waiting for system data")]
        total = sys_.get("cpu_percent")
        head = Text()
        head.append("CPU ", style="bold")
        head.append(fmt_pct(total), style=f"bold {load_colour(total)}")
        head.append(f"  {sys_.get('cpu_count', MISSING)} cores", style=DIM)
        avail = sys_.get("cores_available")
        if avail is not None and avail != sys_.get("cpu_count"):
            # Only a limit is worth the room (a cgroup's version or usage is not news here).
            quota = (sys_.get("cgroup") or {}).get("cpu_quota_cores")
            head.append(f" ({avail:g} available{', cgroup quota' if quota else ''})", style=DIM)
        head.append("  load ", style=DIM)
        head.append(fmt_float(sys_.get("load_avg_1m"), 1))
        per_cpu = sys_.get("per_cpu_percent") or []
        if self.compact:
            room = width - head.cell_len - 2
            if per_cpu and room >= 4:
                head.append("  ")
                head.append(sparkline(per_cpu[:room], min(room, len(per_cpu)), top=100.0),
                            style=ACCENT)
            return [head]
        out = [head]
        hist = self._history.get("cpu_percent") or []
        out.append(Text.assemble(("total ", DIM),
                                 (sparkline(hist, max(4, width - 6), top=100.0), ACCENT)))
        out += _core_grid(per_cpu, width)
        return out


MAX_CORE_ROWS = 4
MIN_CORE_BAR = 3


def _core_grid(per_cpu: Sequence[float | None], width: int) -> list[Text]:
    """Per-core bars in up to 4 rows; with too many cores for the room, one block per core."""
    if not per_cpu:
        return []
    n = len(per_cpu)
    rows = min(n, MAX_CORE_ROWS)
    cols = math.ceil(n / rows)
    num_w = len(str(n - 1))
    # A cell: "15▕███████▏ 97%" + a space between cells.
    bar_w = (width + 1) // cols - (num_w + 2 + 5 + 1)
    if bar_w < MIN_CORE_BAR:
        out = []
        chunk = max(1, width - 6)
        for start in range(0, n, chunk):
            part = per_cpu[start:start + chunk]
            out.append(Text.assemble(("cores " if start == 0 else "      ", DIM),
                                     (sparkline(part, len(part), top=100.0), ACCENT)))
        return out
    out = []
    for r in range(rows):
        line = Text()
        for c in range(cols):
            i = c * rows + r
            if i >= n:
                break
            if c:
                line.append(" ")
            v = per_cpu[i]
            line.append(f"{i:>{num_w}}", style=DIM)
            line.append("▕", style=DIM)
            line.append_text(bar(None if v is None else v / 100, bar_w, load_colour(v)))
            line.append("▏", style=DIM)
            line.append(f"{MISSING if v is None else f'{v:.0f}':>3}%".rjust(5))
        out.append(line)
    return out


class MemoryPanel(Panel):
    def lines(self, width: int) -> list[Text]:
        sys_ = self._data
        if sys_ is None:
            return [dim("Memory: waiting for system data")]
        total, avail = sys_.get("mem_total_bytes"), sys_.get("mem_available_bytes")
        used_pct = sys_.get("mem_used_percent")
        used = total - avail if total is not None and avail is not None else None
        swap_total, swap_used = sys_.get("swap_total_bytes"), sys_.get("swap_used_bytes")
        s_in, s_out = sys_.get("swap_in_bytes_per_s"), sys_.get("swap_out_bytes_per_s")
        swapping = bool(s_in) or bool(s_out)
        if self.compact:
            line = Text()
            line.append("RAM ", style="bold")
            line.append(fmt_pct(used_pct), style=f"bold {load_colour(used_pct)}")
            line.append(f" {fmt_pair(used, total)}")
            line.append("  swap ", style="bold")
            line.append(fmt_pair(swap_used, swap_total))
            line.append(" in ", style=DIM)
            line.append(fmt_rate(s_in), style=BAD if s_in else "")
            line.append(" out ", style=DIM)
            line.append(fmt_rate(s_out), style=BAD if s_out else "")
            return [line]
        swap_frac = swap_used / swap_total if swap_total and swap_used is not None else None
        swap_pct = None if swap_frac is None else swap_frac * 100
        limited = (sys_.get("cgroup") or {}).get("mem_limit_bytes") is not None
        ram_tail = f" {fmt_pct(used_pct):>5} {fmt_pair(used, total)}" + (" (cgroup)" if limited else "")
        swap_tail = f" {fmt_pct(swap_pct):>5} {fmt_pair(swap_used, swap_total)}"
        # The bars take what the figures leave, the same length on both lines.
        bar_w = max(6, width - 5 - max(len(ram_tail), len(swap_tail)))
        ram = Text.assemble(("RAM  ", "bold"), bar(None if used_pct is None else used_pct / 100,
                                                   bar_w, load_colour(used_pct)), ram_tail)
        swap = Text.assemble(("swap ", "bold"), bar(swap_frac, bar_w, load_colour(swap_pct)),
                             swap_tail)
        activity = Text.assemble(("swap in ", DIM), (fmt_rate(s_in), BAD if s_in else ""),
                                 ("  out ", DIM), (fmt_rate(s_out), BAD if s_out else ""),
                                 ("  swapping!" if swapping else "", f"bold {BAD}"),
                                 ("  avail ", DIM), fmt_bytes(avail))
        return [ram, swap, activity]


class DiskPanel(Panel):
    def lines(self, width: int) -> list[Text]:
        sys_ = self._data
        if sys_ is None:
            return [dim("I/O: waiting for system data")]
        iowait = sys_.get("iowait_percent")
        rd, wr = sys_.get("disk_read_bytes_per_s"), sys_.get("disk_write_bytes_per_s")
        iowait_style = BAD if (iowait or 0) >= 20 else WARN if (iowait or 0) >= 5 else ""
        if self.compact:
            line = Text()
            line.append("I/O ", style="bold")
            line.append("iowait ", style=DIM)
            line.append(fmt_pct(iowait, 1), style=iowait_style)
            line.append("  read ", style=DIM)
            line.append(fmt_rate(rd))
            line.append("  write ", style=DIM)
            line.append(fmt_rate(wr))
            return [line]
        value_w = 12
        graph_w = max(4, width - 8 - value_w)

        def row(name: str, value: str, key: str, style: str = "", top: float | None = None) -> Text:
            return Text.assemble((name.ljust(8), DIM), (value.rjust(value_w - 1), style), " ",
                                 (sparkline(self._history.get(key) or [], graph_w, top=top), ACCENT))

        return [row("iowait", fmt_pct(iowait, 1), "iowait_percent", iowait_style, top=100.0),
                row("read", fmt_rate(rd), "disk_read"),
                row("write", fmt_rate(wr), "disk_write")]


# --------------------------------------------------------------------------- tables


class Column(NamedTuple):
    key: str
    label: str
    width: int | None = None


def sync_table(table: DataTable, columns: Sequence[Column],
               rows: Sequence[tuple[str, Sequence[Any]]]) -> bool:
    """Make ``table`` show ``rows`` (key, cells) under ``columns``, touching as little as possible.

    Same columns and row order: only changed cells are updated (each ``update_cell`` re-renders
    its row). Otherwise the table is rebuilt. Returns whether anything changed.
    """
    col_keys = [c.key for c in columns]
    current_cols = [str(k.value) for k in table.columns]
    if current_cols != col_keys:
        table.clear(columns=True)
        for col in columns:
            table.add_column(col.label, key=col.key, width=col.width)
    current_rows = [str(k.value) for k in table.rows]
    if current_rows != [key for key, _ in rows]:
        table.clear()
        for key, cells in rows:
            table.add_row(*cells, key=key)
        return True
    changed = False
    for key, cells in rows:
        old = table.get_row(key)
        for col_key, old_cell, new_cell in zip(col_keys, old, cells):
            if old_cell != new_cell:
                table.update_cell(key, col_key, new_cell, update_width=True)
                changed = True
    return changed


def fit_columns(table: DataTable, column_sets: Sequence[Sequence[str]],
                columns: dict[str, Column], rows: Sequence[dict[str, Any]]) -> list[Column]:
    """The first (widest) column set whose content fits the table's width; else the last."""
    # Less the vertical scrollbar's column and a margin for DataTable's own rounding.
    room = (table.content_size.width or 200) - 2
    for keys in column_sets:
        need = 0
        for key in keys:
            cells = [len(r[key]) if isinstance(r[key], str) else r[key].cell_len for r in rows]
            need += max([len(columns[key].label), *cells]) + 2 * table.cell_padding
        if need <= room:
            return [columns[k] for k in keys]
    return [columns[k] for k in column_sets[-1]]


def right(text: str, style: str = "") -> Text:
    return Text(text, style=style, justify="right")


WORKER_SORTS = {
    # key: (label, sort key on a worker dict, descending?)
    "cpu": ("CPU %", lambda w: _none_low(w.get("cpu_percent")), True),
    "mem": ("RSS", lambda w: _none_low(w.get("rss_bytes")), True),
    "fetch": ("fetch p95", lambda w: _none_low((w.get("fetch_ms") or {}).get("p95")), True),
    "id": ("id", lambda w: _none_low(w.get("id")), False),
}


def _none_low(value: Any) -> tuple[int, Any]:
    return (0, 0) if value is None else (1, value)


class WorkersTable(DataTable):
    """One row per worker. Sorting is done here (on raw numbers), not on rendered cells."""

    can_focus = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="none", zebra_stripes=False, show_cursor=False, **kwargs)
        self.sort_by = "id"
        self.reverse = False
        self.compact = False
        self._shown = False
        self._last_src: dict | None = None

    #: Column sets, widest first; the first that fits the table's width is used.
    COLUMN_SETS = (
        ("id", "pid", "state", "batches", "fetch50", "fetch95", "busy", "cpu", "rss"),
        ("id", "pid", "state", "fetch50", "fetch95", "busy", "cpu", "rss"),
        ("id", "state", "fetch95", "busy", "cpu", "rss"),
    )
    COLUMNS = {
        "id": Column("id", "id"), "pid": Column("pid", "pid"), "state": Column("state", "state"),
        "batches": Column("batches", "batches"), "fetch50": Column("fetch50", "fetch p50"),
        "fetch95": Column("fetch95", "fetch p95"), "busy": Column("busy", "cpu_frac"),
        "cpu": Column("cpu", "CPU %"), "rss": Column("rss", "RSS"),
    }

    def columns_for(self, rows: Sequence[dict[str, Any]] = ()) -> list[Column]:
        sets = self.COLUMN_SETS[-1:] if self.compact else self.COLUMN_SETS
        return fit_columns(self, sets, self.COLUMNS, rows)

    def on_resize(self) -> None:
        # The column set depends on the width: refit once the new size is known.
        if self._shown:  # show what is current when the call runs, not what was at resize
            self.call_after_refresh(lambda: self.show(self._last_src))

    def show(self, src: dict | None) -> None:
        self._shown, self._last_src = True, src
        workers = list((src or {}).get("workers") or [])
        _, key_fn, descending = WORKER_SORTS[self.sort_by]
        workers.sort(key=key_fn, reverse=descending != self.reverse)
        cells = [self._cells(w) for w in workers]
        columns = self.columns_for(cells)
        rows = [(str(w.get("id")), [c[col.key] for col in columns]) for w, c in zip(workers, cells)]
        sync_table(self, columns, rows)
        arrow = "▼" if descending != self.reverse else "▲"
        n = len(workers)
        dead = sum(1 for w in workers if w.get("alive") is False)
        title = f"Workers ({n}" + (f", [red]{dead} dead[/]" if dead else "") + ")"
        if n == 0 and src is not None:
            title = "Workers (none: num_workers=0)"
        set_border_title(self, f"{title} · sort {WORKER_SORTS[self.sort_by][0]} {arrow}")

    def _cells(self, w: dict) -> dict[str, Any]:
        fetch = w.get("fetch_ms") or {}
        if w.get("alive") is False:
            code = w.get("exitcode")
            words = "dead, exit " + (MISSING if code is None else str(code))
            state = Text(words, style=f"bold {BAD}")
        elif w.get("alive") is None:
            state = dim(MISSING)
        else:
            state = Text("alive", style=OK)
        cpu = w.get("cpu_percent")
        frac = w.get("cpu_fraction")
        cells: dict[str, Any] = {
            "id": str(w.get("id", MISSING)),
            "pid": str(w.get("pid") or MISSING),
            "state": state,
            "batches": right(str(w.get("batches", MISSING) if w.get("batches") is not None
                                 else MISSING)),
            "fetch50": right(fmt_ms(fetch.get("p50"))),
            "fetch95": right(fmt_ms(fetch.get("p95"))),
            "busy": right(fmt_float(frac)),
            "cpu": right(MISSING if cpu is None else f"{cpu:.0f}", load_colour(cpu)),
            "rss": right(fmt_bytes(w.get("rss_bytes"))),
        }
        return cells


class OverviewTable(DataTable):
    """Every source on one line; the selected one marked, the straggler rank flagged."""

    can_focus = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="none", zebra_stripes=False, show_cursor=False, **kwargs)
        self.border_title = "All sources"
        self.compact = False
        self._last: tuple[dict | None, int] | None = None

    def on_resize(self) -> None:
        if self._last is not None:
            self.call_after_refresh(lambda: self._last and self.show(*self._last))

    COLUMNS = {
        "sel": Column("sel", " "), "source": Column("source", "source"),
        "name": Column("name", "name"), "rank": Column("rank", "rank"),
        "where": Column("where", "host:pid"), "state": Column("state", "state"),
        "rate": Column("rate", "batch/s"), "p95": Column("p95", "wait p95"),
        "wf": Column("wf", "wait %"), "cat": Column("cat", "diagnosis"),
    }
    COLUMN_SETS = (
        ("sel", "name", "rank", "where", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "where", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "state", "rate", "p95", "wf", "cat"),
        ("sel", "source", "rate", "wf", "cat"),
    )

    def show(self, doc: dict | None, selected: int) -> None:
        self._last = (doc, selected)
        sources = (doc or {}).get("sources") or []
        straggler = straggler_index(doc)
        all_cells = []
        labels = source_labels(sources)
        for i, s in enumerate(sources):
            cat = category((s.get("diagnosis") or {}).get("category"))
            wf = s.get("wait_fraction")
            rank = s.get("rank")
            all_cells.append({
                "sel": Text("▶" if i == selected else " ", style=f"bold {ACCENT}"),
                "source": Text.assemble((labels[i], "bold" if i == selected else ""),
                                        (" ◀" if i == straggler else "", f"bold {WARN}")),
                "name": Text.assemble((s.get("name") or MISSING, "bold" if i == selected else ""),
                                      (" ◀" if i == straggler else "", f"bold {WARN}")),
                "rank": MISSING if rank is None else str(rank),
                "where": f"{s.get('host') or MISSING}:{s.get('pid') or MISSING}",
                "state": s.get("state") or MISSING,
                "rate": right(fmt_per_s(s.get("batches_per_s"))),
                "p95": right(fmt_ms((s.get("wait_ms") or {}).get("p95"))),
                "wf": right(fmt_frac_pct(wf), wait_colour(wf)),
                "cat": Text(cat.words, style=cat.colour),
            })
        sets = self.COLUMN_SETS[1:] if self.compact else self.COLUMN_SETS
        columns = fit_columns(self, sets, self.COLUMNS, all_cells)
        rows = [(s.get("id") or str(i), [c[col.key] for col in columns])
                for i, (s, c) in enumerate(zip(sources, all_cells))]
        sync_table(self, columns, rows)
        title = f"All sources ({len(sources)})"
        if straggler is not None:
            title += (f" · [{WARN}]◀ straggler: {source_title(sources[straggler])}"
                      f" waits most[/]")
        set_border_title(self, title)


def straggler_index(doc: dict | None) -> int | None:
    """The index of the straggler rank named by the document (`ranks.straggler`, computed by the
    model with loadertop.viewer.ranks — one rule for the screen and `snapshot --json`)."""
    doc = doc or {}
    sources = doc.get("sources") or []
    found = (doc.get("ranks") or {}).get("straggler") if "ranks" in doc else ranks.straggler(sources)
    return next((i for i, s in enumerate(sources) if s.get("id") == found), None) if found else None
