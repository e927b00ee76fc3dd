"""The loadertop TUI: a Textual app that renders documents pulled from a *feed*.

Reading is not rendering (memray's live TUI is the model): the feed drains the network on a cheap
``poll`` timer; once per refresh tick the app asks it for the current document and pushes it into the
widgets inside ``batch_update()``. Widgets only render. Tables refresh at most ~2 Hz, and a tick whose
document did not change touches nothing but the header clock. Measured on the reference machine
(FIELD-NOTES): rendering per message cost 67 % of a core, this shape 10–16 % at 10 Hz.

This module imports neither torch nor zmq: the feed is handed in.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.events import Resize
from textual.filter import Monochrome
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer, Static

from loadertop.viewer.widgets import (
    CATEGORIES,
    Banner,
    CpuPanel,
    DiskPanel,
    GpuPanel,
    HeaderBar,
    LoaderPanel,
    MemoryPanel,
    OverviewTable,
    WorkersTable,
    waiting_for,
)


class Feed(Protocol):
    """Where documents come from. The real one reads ZeroMQ; tests use ``FakeFeed``."""

    def poll(self) -> None:
        """Drain the network without blocking; called every ``poll_s``."""

    def document(self) -> dict:
        """The current report (CONTRACT §3 + viewer extras); called once per refresh tick.

        Return a new dict when anything changed: an unchanged (equal) document is not re-rendered.
        """

    def close(self) -> None: ...


#: Refresh intervals that ``+`` / ``-`` step through (seconds).
REFRESH_STEPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: Tables (DataTable re-renders a row per changed cell) refresh at most this often.
TABLE_MIN_INTERVAL_S = 0.5
#: The loader and machine panels (and their graphs' history) at most this often: the probe reports
#: 4 times a second, the machine once, so a faster redraw only repaints jitter. Drawing is the
#: viewer's main cost (Textual's compositor; Model.document is ~1 ms a source): at 10 Hz this keeps
#: the CPU in budget while the header, banner and clock still follow every tick.
PANEL_MIN_INTERVAL_S = 0.25
#: Drain the network at least this often between ticks (each tick drains it first anyway).
POLL_S = 1.0
#: Below this the screen says so instead of drawing a broken layout.
MIN_WIDTH, MIN_HEIGHT = 60, 15
#: Below this the compact layout: one line per machine panel, fewer table columns, stacked.
WIDE_MIN_WIDTH, WIDE_MIN_HEIGHT = 110, 30
#: Ticks of history kept per graph (wider than any graph we draw).
HISTORY_LEN = 300


HELP_TEXT = """\
[b]loadertop[/b] — top for PyTorch DataLoaders

[b]Keys[/b]
  q, Esc        quit (Esc/q/? close this help)
  ?             this help
  space         pause: stop showing new data (the clock keeps ticking)
  + / -         refresh slower / faster ({steps} s)
  tab, ]        next source        shift+tab, \\[   previous source
  o             overview: all sources (ranks, train/val) in one table
  c m f i       sort workers by CPU %, memory (RSS), fetch p95, id (again: reverse)

[b]Reading the screen[/b]
  wait       how long the training loop was blocked in next() per batch
  waiting    share of wall time spent waiting for data (above 5 % is worth a look)
  queue      batches ready for the loop / requested from workers / capacity
  cpu_frac   worker CPU time ÷ wall time while producing a batch:
             near 1 the worker computes, near 0 it waits (disk, network, locks)
  –          unknown on this machine (never a made-up 0)

[b]Diagnoses[/b]
{categories}
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close", show=True)]

    def compose(self) -> ComposeResult:
        cats = "\n".join(f"  [{c.colour}]{c.words}[/]" for c in CATEGORIES.values())
        steps = "/".join(f"{s:g}" for s in REFRESH_STEPS)
        yield Static(HELP_TEXT.format(categories=cats, steps=steps), id="help")


class LoadertopApp(App[None]):
    """``top`` for DataLoaders, fed by ``feed`` (see :class:`Feed`)."""

    CSS_PATH = "loadertop.tcss"
    TITLE = "loadertop"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("escape", "quit", "Quit", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("space", "toggle_pause", "Pause", key_display="space"),
        Binding("plus", "slower", "Interval", key_display="+/-"),
        Binding("minus", "faster", "Faster", show=False),
        Binding("tab", "next_source", "Source", key_display="tab", priority=True),
        Binding("shift+tab", "previous_source", "Previous source", show=False, priority=True),
        Binding("right_square_bracket", "next_source", "Next source", show=False),
        Binding("left_square_bracket", "previous_source", "Previous source", show=False),
        Binding("o", "toggle_overview", "Overview"),
        Binding("c", "sort('cpu')", "Sort", key_display="c/m/f/i"),
        Binding("m", "sort('mem')", "Sort by memory", show=False),
        Binding("f", "sort('fetch')", "Sort by fetch", show=False),
        Binding("i", "sort('id')", "Sort by id", show=False),
    ]

    def __init__(self, feed: Feed, *, refresh_s: float = 1.0, clock: Callable[[], float] = time.time,
                 no_color: bool = False, poll_s: float = POLL_S,
                 note: Callable[[], str | None] | None = None) -> None:
        """``note``: an optional line of context for the header, asked once per tick (the demo
        says which phase runs)."""
        super().__init__()
        self.note = note
        self.feed = feed
        self.refresh_s = float(refresh_s)
        self.poll_s = float(poll_s)
        self._clock = clock
        if (no_color or "NO_COLOR" in os.environ) and not self.no_color:
            # What Textual 8.2.8 itself does for NO_COLOR (App.__init__), for the explicit flag.
            self.no_color = True
            self._filters.append(Monochrome())
        self.paused = False
        self.overview = False
        self.selected = 0
        self.compact = False
        self.too_small = False
        self.document: dict | None = None  # the document on screen
        self.ticks = 0
        self._selected_id: str | None = None
        self._tables_due = True
        self._last_table_tick = -10**9
        self._panels_due = True
        self._last_panel_tick = -10**9
        self._last_system_sent: Any = None
        self._refresh_timer: Timer | None = None
        self._poll_timer: Timer | None = None
        self._main_screen: Any = None  # set on mount
        # History, one entry per tick whose document changed: per source id, and for the machine.
        self._source_history: dict[str, dict[str, deque]] = {}
        self._machine_history: dict[str, deque] = {}

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Banner(id="banner")
        with Container(id="main"):
            with Vertical(id="left"):
                yield LoaderPanel("Loader", id="loader")
                yield WorkersTable(id="workers")
                yield OverviewTable(id="overview")
            with Vertical(id="machine"):
                yield GpuPanel("GPU", id="gpu")
                yield CpuPanel("CPU", id="cpu")
                yield MemoryPanel("Memory", id="memory")
                yield DiskPanel("Disk I/O", id="disk")
        yield Static(id="too-small")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Direct references: App.query_one would search whichever screen is on top (e.g. help).
        self._header = self.query_one(HeaderBar)
        self._banner = self.query_one(Banner)
        self._loader = self.query_one(LoaderPanel)
        self._workers_table = self.query_one(WorkersTable)
        self._overview = self.query_one(OverviewTable)
        self._machine_panels = (self.query_one(GpuPanel), self.query_one(CpuPanel),
                                self.query_one(MemoryPanel), self.query_one(DiskPanel))
        self._too_small = self.query_one("#too-small", Static)
        self._main_screen = self.screen
        self._apply_size(self.size.width, self.size.height)
        self._poll_timer = self.set_interval(self.poll_s, self._poll, name="feed-poll")
        self._refresh_timer = self.set_interval(self.refresh_s, self.tick, name="refresh")
        self.call_after_refresh(self.tick)  # first figures at once, not after one interval

    def on_unmount(self) -> None:
        self.feed.close()

    def on_resize(self, event: Resize) -> None:
        self._apply_size(event.size.width, event.size.height)
        # Table column sets depend on the width: redo them once the new layout is known.
        self.call_after_refresh(self._render_document, True)

    def _apply_size(self, width: int, height: int) -> None:
        if self._main_screen is None:
            return
        too_small = width < MIN_WIDTH or height < MIN_HEIGHT
        compact = width < WIDE_MIN_WIDTH or height < WIDE_MIN_HEIGHT
        screen = self._main_screen
        self.too_small = too_small
        screen.set_class(too_small, "-too-small")
        self._too_small.update(
            f"terminal too small: {width}×{height}\n(need ≥ {MIN_WIDTH}×{MIN_HEIGHT})")
        if compact != self.compact:
            self.compact = compact
            screen.set_class(compact, "-compact")
            for panel in (self._loader, *self._machine_panels):
                panel.set_compact(compact)
            self._workers_table.compact = compact
            self._overview.compact = compact
            self._render_document(force_tables=True)

    # ------------------------------------------------------------------ the tick

    def _poll(self) -> None:
        self.feed.poll()

    def tick(self) -> None:
        """One refresh: pull the document (unless paused) and push it into the widgets."""
        self.ticks += 1
        changed = False
        if not self.paused:
            self.feed.poll()  # the freshest figures for this tick
            doc = self.feed.document()
            if doc is not self.document and doc != self.document:
                self.document = doc
                self._tables_due = self._panels_due = True
                changed = True
        if changed or self._panels_due or self._tables_due:  # due: held back by a rate cap
            self._render_document()
        else:
            with self.batch_update():
                self._render_header()

    def _every(self, interval_s: float) -> int:
        """Ticks between two updates of something drawn at most every ``interval_s``."""
        return max(1, math.ceil(interval_s / self.refresh_s - 1e-9))

    def _render_document(self, force_tables: bool = False) -> None:
        doc = self.document
        src = self._current_source()
        with self.batch_update():
            self._render_header()
            self._banner.show((doc or {}).get("diagnosis"), self._diagnosed_source(),
                              compact=self.compact, waiting=waiting_for(doc))
            if force_tables or (self._panels_due and
                                self.ticks - self._last_panel_tick >= self._every(PANEL_MIN_INTERVAL_S)):
                self._panels_due = False
                self._last_panel_tick = self.ticks
                if doc is not None and not force_tables:
                    self._record_history(doc)
                src = self._current_source()
                history = self._source_history.get(src.get("id"), {}) if src else {}
                self._loader.show(src, history)
                sys_ = (doc or {}).get("system")
                for panel in self._machine_panels:
                    panel.show(sys_, self._machine_history)
            if force_tables or (self._tables_due and
                                self.ticks - self._last_table_tick >= self._every(TABLE_MIN_INTERVAL_S)):
                self._tables_due = False
                self._last_table_tick = self.ticks
                self._workers_table.show(src)
                if self.overview:  # hidden otherwise: shown fresh when toggled on
                    self._overview.show(doc, self.selected)

    def _render_header(self) -> None:
        note = None
        if self.note is not None:
            try:
                note = self.note()
            except Exception as exc:  # context only: never let it take the screen down
                note = f"note unavailable: {exc!r}"
        self._header.show(self.document, self._current_source(), now=self._clock(),
                          paused=self.paused, refresh_s=self.refresh_s,
                          selected=self.selected, compact=self.compact, note=note)

    def _current_source(self) -> dict | None:
        sources = (self.document or {}).get("sources") or []
        if not sources:
            return None
        # Keep following the same source when the list changes order or grows.
        if self._selected_id is not None:
            for i, s in enumerate(sources):
                if s.get("id") == self._selected_id:
                    self.selected = i
                    return s
        self.selected = min(self.selected, len(sources) - 1)
        self._selected_id = sources[self.selected].get("id")
        return sources[self.selected]

    def _diagnosed_source(self) -> dict | None:
        diag = (self.document or {}).get("diagnosis") or {}
        for s in (self.document or {}).get("sources") or []:
            if s.get("id") == diag.get("source"):
                return s
        return None

    def _record_history(self, doc: dict) -> None:
        def push(store: dict[str, deque], key: str, value: Any) -> None:
            if key not in store:
                store[key] = deque(maxlen=HISTORY_LEN)
            store[key].append(value)

        seen = set()
        for s in doc.get("sources") or []:
            sid = s.get("id")
            seen.add(sid)
            hist = self._source_history.setdefault(sid, {})
            push(hist, "wait_p95_ms", (s.get("wait_ms") or {}).get("p95"))
            push(hist, "batches_per_s", s.get("batches_per_s"))
        for sid in list(self._source_history):
            if sid not in seen:
                del self._source_history[sid]
        sys_ = doc.get("system")
        if sys_ is None:
            return
        # One point per machine sample (1 Hz from the probe), not per tick: a 10 Hz screen would
        # otherwise draw each sample ten times over. Documents without `sent_at` (tests) count
        # every time.
        sent = sys_.get("sent_at")
        if sent is not None and sent == self._last_system_sent:
            return
        self._last_system_sent = sent
        m = self._machine_history
        push(m, "cpu_percent", sys_.get("cpu_percent"))
        push(m, "iowait_percent", sys_.get("iowait_percent"))
        push(m, "disk_read", sys_.get("disk_read_bytes_per_s"))
        push(m, "disk_write", sys_.get("disk_write_bytes_per_s"))
        for gpu in sys_.get("gpus") or []:
            push(m, f"gpu{gpu.get('index')}_util", gpu.get("util_percent"))

    # ------------------------------------------------------------------ actions

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.tick()

    def _set_refresh(self, seconds: float) -> None:
        self.refresh_s = seconds
        if self._refresh_timer is not None:
            self._refresh_timer.stop()
        self._refresh_timer = self.set_interval(seconds, self.tick, name="refresh")
        with self.batch_update():
            self._render_header()

    def action_slower(self) -> None:
        longer = [s for s in REFRESH_STEPS if s > self.refresh_s + 1e-9]
        if longer:
            self._set_refresh(longer[0])

    def action_faster(self) -> None:
        shorter = [s for s in REFRESH_STEPS if s < self.refresh_s - 1e-9]
        if shorter:
            self._set_refresh(shorter[-1])

    def _select(self, step: int) -> None:
        sources = (self.document or {}).get("sources") or []
        if len(sources) < 2:
            return
        self.selected = (self.selected + step) % len(sources)
        self._selected_id = sources[self.selected].get("id")
        self._render_document(force_tables=True)

    def action_next_source(self) -> None:
        self._select(+1)

    def action_previous_source(self) -> None:
        self._select(-1)

    def action_toggle_overview(self) -> None:
        self.overview = not self.overview
        self._main_screen.set_class(self.overview, "-overview")
        # The overview table fits its columns to its width, known only once it is laid out.
        self.call_after_refresh(self._render_document, True)

    def action_sort(self, key: str) -> None:
        table = self._workers_table
        if table.sort_by == key:
            table.reverse = not table.reverse
        else:
            table.sort_by, table.reverse = key, False
        with self.batch_update():
            table.show(self._current_source())

