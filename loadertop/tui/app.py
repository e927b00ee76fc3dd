"""The loadertop TUI: a Textual app that shows the documents a *feed* produces.

Reading is not rendering (memray's live TUI is the model): the feed drains the network on a cheap
``poll`` timer; once per refresh tick (unless paused) the app asks it to ``advance`` to now, and
pushes the one document that returns into the widgets inside ``batch_update()``. Widgets only
render, and being line-API widgets (`widgets.lines`) they repaint only the lines that changed.
Tables refresh at most ~2 Hz and panels ~4 Hz; a tick whose document did not change touches nothing
but the header clock.

The layout is `compose` below: the panels in it (`widgets.Panel`) each say what part of the document
they show and which history series they graph; the app collects those into one `History`.

This module imports neither torch nor zmq: the feed is handed in.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.events import Resize
from textual.filter import Monochrome
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static

from loadertop.client.document import Document, Source
from loadertop.tui.theme import source_labels
from loadertop.tui.widgets import (
    MACHINE_PANELS,
    Banner,
    FindingsBar,
    FindingsScreen,
    HeaderBar,
    HelpScreen,
    History,
    LoaderPanel,
    OverviewTable,
    Panel,
    WorkersTable,
)
from loadertop.tui.widgets.findings import bar_rows, lean
from loadertop.tui.widgets.header import waiting_for


class Feed(Protocol):
    """Where documents come from. The real one reads ZeroMQ (`subscriber.NetworkFeed`); tests use
    ``tests/fakes.FakeFeed``."""

    def poll(self) -> None:
        """Drain the network without blocking; called every ``poll_s`` (and before each tick)."""

    def advance(self, now: float) -> Document:
        """Move the model to ``now`` and return the document as of then; called once per refresh
        tick that is not paused. Return the same object when nothing changed."""
        ...

    def close(self) -> None: ...


#: Refresh intervals that ``+`` / ``-`` step through (seconds).
REFRESH_STEPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: The tables refresh at most this often: a worker's figures change at the probe's 1 Hz sample, and
#: rows that reorder (a sort by CPU) several times a second are hard to read.
TABLE_MIN_INTERVAL_S = 0.5
#: The loader and machine panels (and their graphs' history) at most this often: the probe reports
#: 4 times a second, the machine once, so a faster redraw only repaints jitter, and the graphs keep
#: a useful span of time at 10 Hz. The header, banner and clock still follow every tick.
PANEL_MIN_INTERVAL_S = 0.25
#: Drain the network at least this often between ticks (each tick drains it first anyway).
POLL_S = 1.0
#: Below this the screen says so instead of drawing a broken layout.
MIN_WIDTH, MIN_HEIGHT = 60, 15
#: Below this the compact layout: one line per machine panel, fewer table columns, stacked.
WIDE_MIN_WIDTH, WIDE_MIN_HEIGHT = 110, 30


class _Column(Vertical):
    """The left column. The loader panel sizes its graphs to the column's height, which changes
    when the banner or the findings above it grow or shrink: then the panels are drawn again once
    the new layout is known (as after a resize of the terminal)."""

    def on_resize(self, event: Resize) -> None:
        app = self.app
        if isinstance(app, LoadertopApp):
            app.call_after_refresh(app._render_document, True)


class LoadertopApp(App[None]):
    """``top`` for DataLoaders, fed by ``feed`` (see :class:`Feed`)."""

    CSS_PATH = "loadertop.tcss"
    TITLE = "loadertop"
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("escape", "quit", "Quit", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("e", "findings", "Findings"),
        Binding("space", "toggle_pause", "Pause", key_display="space"),
        Binding("plus", "slower", "Interval", key_display="+/-"),
        Binding("minus", "faster", "Faster", show=False),
        # Not in the footer (80 columns hold the rest): with several sources the header says
        # "tab" itself, and the help lists it.
        Binding("tab", "next_source", "Source", key_display="tab", show=False, priority=True),
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
        """``no_color``: draw without colour (the commands pass ``--no-color`` / ``NO_COLOR``);
        ``note``: an optional line of context for the header, asked once per tick (the demo says
        which phase runs)."""
        super().__init__()
        self.note = note
        self.feed = feed
        self.refresh_s = float(refresh_s)
        self.poll_s = float(poll_s)
        self._clock = clock
        if no_color and not self.no_color:
            # What Textual 8.2.8 itself does for NO_COLOR (App.__init__), for the explicit flag.
            self.no_color = True
            self._filters.append(Monochrome())
        self.paused = False
        self.overview = False
        self.selected = 0
        self.compact = False
        self.too_small = False
        self.document: Document | None = None  # the document on screen
        self.history = History()  # the graphs' points; the panels' series are added on mount
        self.ticks = 0
        self._selected_id: str | None = None
        self._tables_due = True
        self._last_table_tick = -10**9
        self._panels_due = True
        self._last_panel_tick = -10**9
        self._refresh_timer: Timer | None = None
        self._poll_timer: Timer | None = None
        self._main_screen: Screen[Any] | None = None  # set on mount
        self._frozen = False  # the objects made up to the first figures: out of full collections

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield Banner(id="banner")
        yield FindingsBar(id="findings")
        with Container(id="main"):
            with _Column(id="left"):
                yield LoaderPanel("Loader", id="loader")
                yield WorkersTable(id="workers")
                yield OverviewTable(id="overview")
            with Vertical(id="machine"):
                for panel in MACHINE_PANELS:
                    yield panel(panel.TITLE, id=panel.ID)
        yield Static(id="too-small")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        # Direct references: App.query_one would search whichever screen is on top (e.g. help).
        self._header = self.query_one(HeaderBar)
        self._banner = self.query_one(Banner)
        self._findings = self.query_one(FindingsBar)
        self._workers_table = self.query_one(WorkersTable)
        self._overview = self.query_one(OverviewTable)
        self._panels: list[Panel] = list(self.query(Panel))
        self.history.track(series for panel in self._panels for series in panel.SERIES)
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
        screen = self._main_screen
        if screen is None:
            return
        too_small = width < MIN_WIDTH or height < MIN_HEIGHT
        compact = width < WIDE_MIN_WIDTH or height < WIDE_MIN_HEIGHT
        self.too_small = too_small
        screen.set_class(too_small, "-too-small")
        self._too_small.update(
            f"terminal too small: {width}×{height}\n(need ≥ {MIN_WIDTH}×{MIN_HEIGHT})")
        if compact != self.compact:
            self.compact = compact
            screen.set_class(compact, "-compact")
            for panel in self._panels:
                panel.set_compact(compact)
            self._workers_table.compact = compact
            self._overview.compact = compact
            self._render_document(force_tables=True)

    # ------------------------------------------------------------------ the tick

    def _poll(self) -> None:
        self.feed.poll()

    def tick(self) -> None:
        """One refresh: advance the feed to now (unless paused) and show what changed."""
        self.ticks += 1
        if not self.paused:
            self.feed.poll()  # the freshest figures for this tick
            doc = self.feed.advance(self._clock())
            if doc is not self.document and doc != self.document:
                self.document = doc
                self._tables_due = self._panels_due = True
        if self._panels_due or self._tables_due:  # new, or held back by a rate cap
            self._render_document()
        else:
            with self.batch_update():
                self._render_header()
        if not self._frozen and self.document is not None and self.document.sources:
            self._freeze_once()

    def _freeze_once(self) -> None:
        """Move what exists by the first figures on screen (the modules, the screen's widgets,
        each source's history) out of the garbage collector's full collections, for good: they
        live as long as the viewer, and a full collection walked them all every few seconds
        (docs/performance.md, "The TUI watching many sources"). In a terminal only: a headless
        app is a test's, whose process goes on to other tests."""
        self._frozen = True
        if not self.is_headless:
            gc.freeze()

    def _every(self, interval_s: float) -> int:
        """Ticks between two updates of something drawn at most every ``interval_s``."""
        return max(1, math.ceil(interval_s / self.refresh_s - 1e-9))

    def _render_document(self, force_tables: bool = False) -> None:
        doc = self.document
        with self.batch_update():
            src = self._current_source()
            self._render_header()
            height = self.size.height
            self._findings.show(doc, src, rows=bar_rows(height, self.compact), compact=self.compact)
            self._banner.show(doc.diagnosis if doc is not None else None, self._diagnosed_label(),
                              compact=self.compact, waiting=waiting_for(doc),
                              findings_below=bool(self._findings.lines) and lean(height, self.compact))
            if isinstance(self.screen, FindingsScreen) and self.screen.is_mounted:  # it follows
                self.screen.show(doc)
            if force_tables or (self._panels_due and
                                self.ticks - self._last_panel_tick >= self._every(PANEL_MIN_INTERVAL_S)):
                self._panels_due = False
                self._last_panel_tick = self.ticks
                if doc is not None and not force_tables:
                    self.history.record(doc)
                for panel in self._panels:
                    panel.show(panel.data_of(doc, src), self.history)
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
                          selected=self.selected, compact=self.compact, note=note,
                          replay=self.REPLAY)

    def _current_source(self) -> Source | None:
        sources = self.document.sources if self.document is not None else ()
        if not sources:
            return None
        # Keep following the same source when the list changes order or grows.
        if self._selected_id is not None:
            for i, s in enumerate(sources):
                if s.id == self._selected_id:
                    self.selected = i
                    return s
        self.selected = min(self.selected, len(sources) - 1)
        self._selected_id = sources[self.selected].id
        return sources[self.selected]

    def _diagnosed_label(self) -> str | None:
        """The label of the source the top verdict is about (None: about the machine)."""
        doc = self.document
        if doc is None or doc.diagnosis.source is None:
            return None
        labels = source_labels(doc.sources)
        return next((labels[i] for i, s in enumerate(doc.sources) if s.id == doc.diagnosis.source),
                    None)

    # ------------------------------------------------------------------ actions

    #: A recording's replay: the header says "live then", not "live".
    REPLAY = False
    #: Lines of keys a variant of the app adds to the help (the replay's).
    EXTRA_KEYS_HELP = ""

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(REFRESH_STEPS, self.EXTRA_KEYS_HELP))

    def action_findings(self) -> None:
        if not isinstance(self.screen, FindingsScreen):
            self.push_screen(FindingsScreen(self.document))

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
        sources = self.document.sources if self.document is not None else ()
        if len(sources) < 2:
            return
        self.selected = (self.selected + step) % len(sources)
        self._selected_id = sources[self.selected].id
        self._render_document(force_tables=True)

    def action_next_source(self) -> None:
        self._select(+1)

    def action_previous_source(self) -> None:
        self._select(-1)

    def action_toggle_overview(self) -> None:
        self.overview = not self.overview
        if self._main_screen is not None:
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
