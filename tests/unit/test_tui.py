"""Pilot tests of the TUI, fed by `fakes.FakeFeed` with a fake clock (no network, no torch, no
sleeps). Every document comes from the real model (`tests/fakes.py`), so the verdicts on screen are
the ones `diagnose` really emits.

pytest-asyncio is not a dependency: each test runs its coroutine with ``asyncio.run``.
The refresh timer is set to an hour so only the explicit ``app.tick()`` calls change the screen.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from loadertop import diagnosis
from loadertop.client.document import decode_json, encode_json
from loadertop.tui.app import REFRESH_STEPS, LoadertopApp
from loadertop.tui.theme import CATEGORY_STYLES
from loadertop.tui.widgets import (
    Banner,
    CpuPanel,
    DiskPanel,
    GpuPanel,
    HeaderBar,
    HelpScreen,
    History,
    LoaderPanel,
    MemoryPanel,
    OverviewTable,
    WorkersTable,
    graphics,
)

import fakes
from fakes import GIB, MIB, FakeFeed

SIZE = (120, 40)
NEVER = 3600.0  # refresh interval for tests: ticks happen only when a test calls app.tick()


class FakeClock:
    def __init__(self, now: float = fakes.T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_app(documents, clock: FakeClock | None = None, **kwargs) -> LoadertopApp:
    kwargs.setdefault("refresh_s", NEVER)
    return LoadertopApp(FakeFeed(documents), clock=clock or FakeClock(), **kwargs)


def run(coro_fn, app: LoadertopApp, size=SIZE):
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await coro_fn(app, pilot)

    asyncio.run(main())


def text_of(widget) -> str:
    """What a line-API widget (header, banner, panels) shows, as plain text."""
    return widget.text()


def table_text(table) -> list[list[str]]:
    """A table's rows, cell by cell, as plain text (the columns shown at its width)."""
    return table.rows_text()


# --------------------------------------------------------------------------- keys


def test_q_quits_and_closes_feed():
    app = make_app(fakes.healthy_doc())

    async def body(app, pilot):
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running

    run(body, app)
    assert app.feed.closed


def test_escape_quits():
    app = make_app(fakes.healthy_doc())

    async def body(app, pilot):
        await pilot.press("escape")
        await pilot.pause()
        assert not app.is_running

    run(body, app)


def test_help_opens_and_escape_closes_it():
    async def body(app, pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help").render())
        assert "space" in help_text and "Healthy: compute-bound" in help_text
        # The numbers the diagnosis decides by (10 % / 7 %), not the old screen's own 5 %.
        assert "input-bound from 10 %" in help_text and "below 7 %" in help_text
        assert "5 % is worth a look" not in help_text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running  # Esc closed the help, it did not quit

    run(body, make_app(fakes.healthy_doc()))


def test_pause_freezes_document_but_header_keeps_ticking():
    clock = FakeClock()
    healthy, io = fakes.healthy_doc(), fakes.io_bound_doc()
    app = make_app([healthy], clock=clock)

    async def body(app, pilot):
        assert "HEALTHY" in text_of(app.query_one(Banner))
        await pilot.press("space")
        await pilot.pause()
        assert app.paused
        assert "PAUSED" in text_of(app.query_one(HeaderBar))
        calls = app.feed.advance_calls
        app.feed.push(io)
        clock.advance(61)
        app.tick()
        await pilot.pause()
        header = text_of(app.query_one(HeaderBar))
        assert "PAUSED" in header
        assert "up 1h03m" in header  # uptime from started_at keeps ticking: 3725 s + 61 s
        assert "HEALTHY" in text_of(app.query_one(Banner))  # the new document is not shown
        assert app.document is healthy
        assert app.feed.advance_calls == calls  # paused: the model is not advanced either
        await pilot.press("space")
        await pilot.pause()
        assert not app.paused
        assert "PAUSED" not in text_of(app.query_one(HeaderBar))
        assert "INPUT-BOUND" in text_of(app.query_one(Banner))

    run(body, app)


def test_plus_minus_change_refresh_interval():
    async def body(app, pilot):
        assert app.refresh_s == 1.0
        await pilot.press("plus")
        assert app.refresh_s == 2.0
        await pilot.press("plus", "plus", "plus")
        assert app.refresh_s == REFRESH_STEPS[-1]  # stops at the slowest step
        for _ in range(len(REFRESH_STEPS) + 2):
            await pilot.press("minus")
        assert app.refresh_s == REFRESH_STEPS[0]
        await pilot.pause()
        assert f"⟳ {REFRESH_STEPS[0]:g} s" in text_of(app.query_one(HeaderBar))
        assert app._refresh_timer is not None and app._refresh_timer._interval == REFRESH_STEPS[0]

    run(body, make_app(fakes.healthy_doc(), refresh_s=1.0))


def test_sort_keys_reorder_workers():
    doc = fakes.workers_doc(cpu_percent=(20.0, 95.0, 96.0, 99.0),
                            rss_bytes=(400 * MIB, 9 * GIB, 410 * MIB, 420 * MIB))

    async def body(app, pilot):
        table = app.query_one(WorkersTable)
        ids = table.row_keys
        assert ids() == ["0", "1", "2", "3"]
        await pilot.press("c")
        await pilot.pause()
        assert ids()[0] == "3" and ids()[-1] == "0"
        assert "sort CPU %" in str(table.border_title)
        await pilot.press("c")  # again: reversed
        await pilot.pause()
        assert ids()[0] == "0"
        await pilot.press("m")
        await pilot.pause()
        assert ids()[0] == "1"
        await pilot.press("f")
        await pilot.pause()
        assert ids()[0] == "3"  # fetch p50 grows with the id in the fake document
        assert "sort fetch p50" in str(table.border_title)
        await pilot.press("i")
        await pilot.pause()
        assert ids() == ["0", "1", "2", "3"]

    run(body, make_app(doc))


def test_source_switching_changes_loader_panel():
    async def body(app, pilot):
        loader = app.query_one(LoaderPanel)
        assert "train r0" in str(loader.border_title)
        await pilot.press("tab")
        await pilot.pause()
        assert "val r0" in str(loader.border_title)
        assert "Idle" in str(loader.border_title)
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert "train r1" in str(loader.border_title)
        assert "28.0 batches/s" in text_of(loader)
        await pilot.press("shift+tab", "left_square_bracket")
        await pilot.pause()
        assert "train r0" in str(loader.border_title)
        await pilot.press("left_square_bracket")  # wraps around
        await pilot.pause()
        assert "val r1" in str(loader.border_title)

    run(body, make_app(fakes.multi_source_doc()))


def test_overview_toggles_and_marks_straggler():
    doc = fakes.multi_source_doc()
    assert doc.ranks.straggler == "gpu-node-2:50200:train"  # the model's rule names it

    async def body(app, pilot):
        overview = app.query_one(OverviewTable)
        assert not overview.display
        await pilot.press("o")
        await pilot.pause()
        assert overview.display and not app.query_one(LoaderPanel).display
        rows = table_text(overview)
        assert len(rows) == 4
        assert [r for r in rows if any("◀" in c for c in r)] == [rows[2]]  # train r1 only
        assert "train r1 ◀" in rows[2]
        assert "straggler: train r1" in str(overview.border_title)
        assert "▶" in rows[0][0]
        await pilot.press("tab")
        await pilot.pause()
        assert "▶" in table_text(overview)[1][0]
        await pilot.press("o")
        await pilot.pause()
        assert not overview.display and app.query_one(LoaderPanel).display

    run(body, make_app(doc))


# --------------------------------------------------------------------------- states


def test_dead_worker_shows_dead_and_exit_code():
    async def body(app, pilot):
        rows = table_text(app.query_one(WorkersTable))
        dead = [r for r in rows if any("dead" in c for c in r)]
        assert len(dead) == 1 and "-9" in " ".join(dead[0])
        assert "1 dead" in str(app.query_one(WorkersTable).border_title)
        assert "STALLED" in text_of(app.query_one(Banner))
        assert "blocked in next() for 38 s" in text_of(app.query_one(LoaderPanel))

    run(body, make_app(fakes.dead_worker_doc()))


def test_dead_worker_in_compact_layout():
    async def body(app, pilot):
        rows = table_text(app.query_one(WorkersTable))
        assert any("dead, exit -9" in " ".join(r) for r in rows)

    run(body, make_app(fakes.dead_worker_doc()), size=(80, 24))


def test_disconnected_feed_is_shown():
    async def body(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "disconnected" in header and "no data for 47 s" in header

    run(body, make_app(fakes.disconnected_doc()))


def test_stale_source_says_no_data_for():
    async def body(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "no data for 7 s" in header and "disconnected" not in header

    run(body, make_app(fakes.stale_doc(age_s=7.4)))


def test_no_gpu_shows_honest_panel():
    async def body(app, pilot):
        assert "No GPU: NVML not available" in text_of(app.query_one(GpuPanel))

    run(body, make_app(fakes.no_gpu_doc()))

    async def body_error(app, pilot):
        assert "NVML_ERROR_DRIVER_NOT_LOADED" in text_of(app.query_one(GpuPanel))

    run(body_error, make_app(fakes.no_gpu_doc(gpu_status="error: NVML_ERROR_DRIVER_NOT_LOADED")))


def test_two_gpus_each_shown():
    async def body(app, pilot):
        gpu = text_of(app.query_one(GpuPanel))
        assert "GPU0 NVIDIA A100-SXM4-80GB" in gpu and "GPU1 NVIDIA A100-SXM4-80GB" in gpu
        assert "96 %" in gpu and "93 %" in gpu

    run(body, make_app(fakes.gpu_doc()))


def test_waiting_for_system_and_empty_documents():
    async def body(app, pilot):
        assert "waiting for system data" in text_of(app.query_one(GpuPanel))

    run(body, make_app(fakes.waiting_for_system_doc()))

    async def body_empty(app, pilot):
        assert "no instrumented DataLoader" in text_of(app.query_one(HeaderBar))
        assert "IDLE" in text_of(app.query_one(Banner))

    run(body_empty, make_app(fakes.empty_doc()))


def test_unknown_figures_show_dash_not_zero():
    doc = fakes.main_process_doc()  # num_workers=0: no queue, main-process fetch figures

    async def body(app, pilot):
        loader = text_of(app.query_one(LoaderPanel))
        assert "main process loads" in loader and "p50 29.0" in loader
        assert "none: num_workers=0" in str(app.query_one(WorkersTable).border_title)

    run(body, make_app(doc))

    async def body_before_data(app, pilot):
        loader = text_of(app.query_one(LoaderPanel))
        assert "No instrumented DataLoader yet" in loader
        memory = text_of(app.query_one(DiskPanel))
        assert "waiting for system data" in memory and " 0 " not in memory

    run(body_before_data, make_app(fakes.empty_doc()))


def test_too_small_terminal_shows_message():
    async def body(app, pilot):
        msg = app.query_one("#too-small")
        assert msg.display
        assert "too small" in str(msg.render()) and "60×15" in str(msg.render())
        assert not app.query_one("#main").display
        app.tick()
        await pilot.pause()

    run(body, make_app(fakes.healthy_doc()), size=(40, 10))


def test_resize_switches_compact_and_too_small():
    async def body(app, pilot):
        assert app.compact is False
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.compact is True and app.query_one(GpuPanel).compact
        await pilot.resize_terminal(50, 12)
        await pilot.pause()
        assert app.too_small
        await pilot.resize_terminal(160, 50)
        await pilot.pause()
        assert not app.too_small and not app.compact

    run(body, make_app(fakes.healthy_doc()))


# --------------------------------------------------------------------------- the banner


def test_banner_reads_as_the_diagnosis_means_it():
    doc = fakes.io_bound_doc()
    verdict = doc.diagnosis

    async def body(app, pilot):
        banner = text_of(app.query_one(Banner))
        flat = " ".join(banner.split())  # wide: the lines wrap
        assert banner.startswith("INPUT-BOUND: WAITING ON I/O  [train]")
        assert verdict.summary in flat
        # what decided: the first evidence whole, the next begun (the advice keeps its two rows)
        assert verdict.evidence[0] in flat and verdict.evidence[1][:40] in flat
        assert "→ " + verdict.advice[0] in flat  # the first thing to try
        assert verdict.advice[1] not in flat  # one piece of advice: the first
        assert app.query_one(Banner).has_class("-warn")

    run(body, make_app(doc))

    async def compact(app, pilot):
        lines = text_of(app.query_one(Banner)).splitlines()
        assert len(lines) == 3
        assert lines[1].startswith("evidence " + verdict.evidence[0])
        assert lines[2].startswith("→ try num_workers=")

    run(compact, make_app(doc), size=(80, 24))


def test_banner_names_the_straggler_and_machine_wide_verdicts():
    async def body(app, pilot):
        banner = text_of(app.query_one(Banner))
        assert banner.startswith("INPUT-BOUND: WORKERS CPU-LIMITED  [train r1]  rank 1 holds the "
                                 "job back: its loop waits 34 % of the time for data")
        # the same words as the text report's top verdict (issue 37)
        assert fakes.multi_source_doc().diagnosis.summary in " ".join(banner.split())

    run(body, make_app(fakes.multi_source_doc()))

    straggler = fakes.straggler_doc()

    async def io_straggler(app, pilot):
        flat = " ".join(text_of(app.query_one(Banner)).split())
        assert flat.startswith("INPUT-BOUND: WAITING ON I/O [train r1] rank 1 holds the job back: "
                               "its loop waits 75 % of the time for data")
        assert straggler.diagnosis.summary in flat
        assert "→ " + straggler.diagnosis.advice[0] in flat

    run(io_straggler, make_app(straggler))

    async def same_name(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "train node-a:1111" in header and "train node-a:2222" in header
        assert "[train node-a:1111]" in text_of(app.query_one(Banner))

    run(same_name, make_app(fakes.same_name_doc()))


def test_banner_says_a_held_verdict_with_todays_figures_and_the_change_it_holds_back():
    """Issue 50: a few seconds after the demo turned I/O-bound, the banner still shows the healthy
    category (the hysteresis), but with the wait the loader panel under it shows, and says that
    a change is pending, next to the category: a compact banner cuts its summary, never that."""
    doc = fakes.held_verdict_doc()
    assert doc.diagnosis.pending == "input_bound_io"

    async def body(app, pilot):
        banner = text_of(app.query_one(Banner))
        flat = " ".join(banner.split())
        assert flat.startswith("HEALTHY: COMPUTE-BOUND · changing to input-bound? "
                               "[train] the loader keeps up (the loop waits 21 %)")
        assert "evidence wait fraction 21 % (threshold 10 %)" in flat
        assert "waiting 21 % of the time" in text_of(app.query_one(LoaderPanel))
        assert app.query_one(Banner).has_class("-ok")

    run(body, make_app(doc))

    async def compact(app, pilot):
        lines = text_of(app.query_one(Banner)).splitlines()
        assert lines[0].startswith("HEALTHY: COMPUTE-BOUND · changing to input-bound?")
        assert lines[1].startswith("evidence wait fraction 21 % (threshold 10 %)")

    run(compact, make_app(doc), size=(80, 24))


def test_wait_colour_agrees_with_the_verdict():
    """A healthy loop's wait is green (the old screen showed 5 %..10 % in yellow beside a green
    Healthy); an input-bound one is not."""
    async def body(app, pilot):
        wait = [line for line in app.query_one(LoaderPanel).lines if line and line[0][0] == "wait  "]
        (styles,) = [[s for t, s in line if t.endswith("%")] for line in wait]
        assert styles == [f"bold {CATEGORY_STYLES[diagnosis.COMPUTE_BOUND].colour}"]

    run(body, make_app(fakes.healthy_doc()))


def test_a_wait_held_by_the_margin_is_coloured_as_the_banner_says():
    """8.5 % waiting after an input-bound spell: the verdict stays input-bound (its evidence says
    the margin held it), and the wait figure stays in the input-bound colour, not green."""
    docs = fakes.margin_history()

    async def body(app, pilot):
        for _ in range(len(docs)):
            app.tick()
        await pilot.pause()
        assert "INPUT-BOUND" in text_of(app.query_one(Banner))
        assert "held until below 7 %" in text_of(app.query_one(Banner))
        wait = [line for line in app.query_one(LoaderPanel).lines if line and line[0][0] == "wait  "]
        (styles,) = [[s for t, s in line if t.endswith("%")] for line in wait]
        assert styles == [f"bold {CATEGORY_STYLES[diagnosis.INPUT_BOUND_CPU].colour}"]

    run(body, make_app(docs))


def test_header_counts_the_frames_the_viewer_dropped():
    async def body(app, pilot):
        assert "bad 4" in text_of(app.query_one(HeaderBar))

    run(body, make_app(fakes.bad_frames_doc(malformed=3, wrong_version=1)))


# --------------------------------------------------------------------------- architecture


def test_history_grows_only_when_document_changes():
    docs = fakes.io_bound_history(5)

    async def body(app, pilot):
        for _ in range(10):
            app.tick()
        await pilot.pause()
        sid = docs[0].sources[0].id
        assert len(app.history.loader(LoaderPanel.WAIT_P95, sid)) == 5  # 5 distinct documents
        assert len(app.history.machine(CpuPanel.TOTAL)) == 5  # 5 machine samples, 1 s apart
        assert len(app.history.machine(GpuPanel.UTIL, 0)) == 5

    run(body, make_app(docs))


def test_history_one_machine_point_per_sample_and_sources_forgotten():
    docs = fakes.io_bound_history(3)
    history = History([LoaderPanel.WAIT_P95, CpuPanel.TOTAL])
    for doc in docs:
        history.record(doc)
        history.record(doc)  # the same document again adds nothing
    assert len(history.machine(CpuPanel.TOTAL)) == 3
    assert len(history.loader(LoaderPanel.WAIT_P95, docs[0].sources[0].id)) == 3
    # Two documents (equal, not the same object) holding one machine sample: the loader gets a
    # point per document, the machine one per sample (`sent_at`).
    first, second = fakes.healthy_doc(), fakes.healthy_doc()
    assert first.system.sent_at == second.system.sent_at
    history.record(first)
    history.record(second)
    assert len(history.machine(CpuPanel.TOTAL)) == 4
    assert len(history.loader(LoaderPanel.WAIT_P95, first.sources[0].id)) == 3 + 2  # same source id
    # Sources that are not in the next document: their history goes with them.
    other = fakes.same_name_doc()
    history.record(other)
    assert history.sources() == {s.id for s in other.sources}
    assert history.loader(LoaderPanel.WAIT_P95, first.sources[0].id) == ()


def spy_refreshes(widget) -> list[tuple[tuple, dict]]:
    """Record every ``widget.refresh(*regions, **kwargs)`` call (and still make it)."""
    calls: list[tuple[tuple, dict]] = []
    original = widget.refresh

    def refresh(*regions, **kwargs):
        calls.append((regions, kwargs))
        return original(*regions, **kwargs)

    widget.refresh = refresh
    return calls


def test_an_unchanged_tick_repaints_only_the_clock_line():
    clock = FakeClock()

    async def body(app, pilot):
        header = spy_refreshes(app.query_one(HeaderBar))
        others = [spy_refreshes(app.query_one(cls)) for cls in (Banner, LoaderPanel, CpuPanel, GpuPanel)]
        clock.advance(1.0)
        app.tick()  # the feed repeats its one document: only the clock moved
        await pilot.pause()
        assert others == [[], [], [], []]
        assert len(header) == 1
        (region,), kwargs = header[0]
        assert (region.y, region.height) == (0, 1) and not kwargs.get("layout")

    run(body, make_app(fakes.healthy_doc(), clock=clock))


def test_a_new_document_repaints_only_the_lines_that_changed():
    docs = fakes.io_bound_history(6)

    async def body(app, pilot):
        for _ in range(4):
            app.tick()
        await pilot.pause()
        disk, memory = spy_refreshes(app.query_one(DiskPanel)), spy_refreshes(app.query_one(MemoryPanel))
        app.tick()
        await pilot.pause()
        # A new machine sample: the disk graphs moved, memory (constant in the scenario) did not.
        assert disk and all(len(regions) == 1 and regions[0].height == 1 for regions, _ in disk)
        assert not any(kwargs.get("layout") for _, kwargs in disk)
        assert memory == []

    run(body, make_app(docs))


def test_feed_advanced_once_per_tick_and_polled_by_timer():
    async def body(app, pilot):
        start = app.feed.advance_calls
        for _ in range(3):
            app.tick()
        assert app.feed.advance_calls == start + 3
        # With no tick due (an hour apart), only the poll timer polls now: two of its polls, waited
        # for with a deadline (a fixed pause counted them as the machine's speed allowed; and each
        # tick polls too, so the count is taken from here).
        polls, deadline = app.feed.polls, asyncio.get_running_loop().time() + 30
        while app.feed.polls < polls + 2:
            assert asyncio.get_running_loop().time() < deadline, "the poll timer never polled"
            await pilot.pause(0.05)
        assert app.feed.advance_calls == start + 3  # polled, never advanced: that is the tick's

    run(body, make_app(fakes.healthy_doc(), poll_s=0.05))


def test_tables_refresh_at_most_twice_a_second():
    docs = fakes.io_bound_history(40)

    async def body(app, pilot):
        calls = []
        show = app._workers_table.show
        app._workers_table.show = lambda src: (calls.append(app.ticks), show(src))
        for _ in range(20):
            app.tick()
        # Every tick brings a new document, but at 0.1 s per tick the table is redone every 5th.
        assert 3 <= len(calls) <= 5
        assert all(b - a >= 5 for a, b in zip(calls, calls[1:]))

    run(body, make_app(docs, refresh_s=0.1))


def test_no_color_flag():
    app = make_app(fakes.healthy_doc(), no_color=True)
    assert app.no_color

    async def body(app, pilot):
        assert "HEALTHY" in text_of(app.query_one(Banner))

    run(body, app)


def test_viewer_imports_neither_torch_nor_zmq():
    code = ("import sys, loadertop.tui.app, loadertop.tui.widgets; "
            "bad = [m for m in ('torch', 'zmq') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_fake_documents_are_valid_and_deterministic():
    for builder in (fakes.healthy_doc, fakes.gpu_doc, fakes.no_gpu_doc, fakes.io_bound_doc,
                    fakes.dead_worker_doc, fakes.disconnected_doc, fakes.multi_source_doc,
                    fakes.main_process_doc, fakes.main_process_bound_doc, fakes.unpaired_doc):
        doc = builder()
        assert decode_json(encode_json(doc)) == doc  # a strict decode into the document's types
        assert builder() == doc


# --------------------------------------------------------------------------- before any data


def test_waiting_for_data_is_not_called_disconnected_and_shows_the_note():
    endpoint = "ipc:///tmp/loadertop-demo/demo.sock"

    async def body(app, pilot):
        header, banner = text_of(app.query_one(HeaderBar)), text_of(app.query_one(Banner))
        assert "waiting for data" in header and "disconnected" not in header
        assert endpoint in header
        assert banner.startswith("WAITING FOR DATA") and "IDLE" not in banner
        assert "demo phase 1/4" in header  # the app's note line
        app.feed.push(fakes.healthy_doc())
        app.tick()
        await pilot.pause()
        assert "WAITING" not in text_of(app.query_one(Banner))

    run(body, make_app(fakes.waiting_doc(endpoint), note=lambda: "demo phase 1/4: healthy"))


def test_more_workers_than_rows_says_how_many_more():
    n = 40
    doc = fakes.workers_doc(cpu_percent=[50.0 + i for i in range(n)], rss_bytes=[400 * MIB] * n)

    async def body(app, pilot):
        table = app.query_one(WorkersTable)
        lines = text_of(table).splitlines()
        assert table.row_count == n and len(lines) == table.size.height
        shown = len(lines) - 2  # less the header and the "more" line
        assert lines[-1].strip() == f"… {n - shown} more workers (sort: c m f i)"
        await pilot.press("c")  # sorted by CPU: the busiest come first
        await pilot.pause()
        assert text_of(table).splitlines()[1].split()[0] == str(n - 1)

    run(body, make_app(doc))


# --------------------------------------------------------------------------- where the time goes


def _line(panel, start: str) -> str:
    return next(line.strip() for line in text_of(panel).splitlines()
                if line.lstrip().startswith(start))


def _bar_cells(line: str) -> dict[str, int]:
    """The cells of each glyph inside the bar's ▕ … ▏."""
    bar = line[line.index("▕") + 1:line.index("▏")]
    return {glyph: bar.count(glyph) for glyph in "█▓▒·"}


def test_time_bar_shows_the_measured_split():
    """main_process_bound: 40 % of the window waiting, 84 % of that after the batch was produced.
    The bar and its figures: step 60 %, waiting for workers 0.4 × 16 % = 6.4 %, handoff 34 %."""
    doc = fakes.main_process_bound_doc()
    src = doc.sources[0]
    assert src.diagnosis.category == diagnosis.MAIN_PROCESS_BOUND
    split = src.stages.wait_split
    assert src.wait_fraction == 0.4 and split is not None and split.handoff == 0.841

    async def body(app, pilot):
        loader = app.query_one(LoaderPanel)
        line = _line(loader, "time")
        assert "█ step 60 %" in line and "▓ waiting for workers 6.4 %" in line
        assert "▒ handoff 34 %" in line and "…" not in line
        cells = _bar_cells(line)
        width = sum(cells.values())
        assert width >= 20 and cells["·"] == 0  # the three parts fill the bar
        assert abs(cells["█"] / width - 0.6) <= 1 / width
        assert abs(cells["▒"] / width - 0.4 * 0.841) <= 1 / width
        assert abs(cells["▓"] / width - 0.4 * 0.159) <= 1 / width
        assert "batch p50 fetch 11.5  collate 0.60  handoff 10.8  ms" in _line(loader, "batch")
        assert "1024 tensors · 24.0 MiB" in _line(loader, "batch")

    run(body, make_app(doc), size=(160, 50))

    async def compact(app, pilot):
        loader = app.query_one(LoaderPanel)
        line = _line(loader, "time")
        # 80 columns: the same figures, "waiting for workers" said shorter, nothing cut.
        assert "█ step 60 %" in line and "▓ workers 6.4 %" in line and "▒ handoff 34 %" in line
        assert "…" not in line and sum(_bar_cells(line).values()) >= 20
        assert "handoff 10.8" in _line(loader, "batch")

    run(compact, make_app(doc), size=(80, 24))


def test_time_bar_with_the_split_unknown_says_why():
    doc = fakes.unpaired_doc("in_order_false")
    src = doc.sources[0]
    assert src.stages.wait_split is None and src.stages.unpaired == "in_order_false"

    for size in ((160, 50), SIZE, (80, 24)):
        async def body(app, pilot, size=size):
            loader = app.query_one(LoaderPanel)
            line = _line(loader, "time")
            # The step and the whole wait only, and why: never a made-up split.
            assert "█ step 37 %" in line and "▓ waiting 63 %" in line and "…" not in line
            assert "handoff" not in line and "▒" not in line
            # Beside the bar; in a narrow wide panel (120 columns) on the line below it.
            lines = [row.strip() for row in text_of(loader).splitlines()]
            below = lines[lines.index(line) + 1]
            assert "split unknown: in_order=False" in (below if size == SIZE else line)
            assert "handoff –" in _line(loader, "batch")

        run(body, make_app(doc), size=size)


def test_time_bar_without_workers_and_without_batches():
    async def no_workers(app, pilot):
        line = _line(app.query_one(LoaderPanel), "time")
        assert "▓ fetching in the loop 55 %" in line and "waiting for workers" not in line
        assert "█ step 45 %" in line and "▒ handoff 0.4 %" in line

    run(no_workers, make_app(fakes.main_process_doc()), size=(160, 50))

    async def stalled(app, pilot):
        line = _line(app.query_one(LoaderPanel), "time")
        assert "▓ waiting 100 %" in line and "split unknown: no batch received" in line
        assert "…" not in line

    run(stalled, make_app(fakes.dead_worker_doc()), size=(80, 24))

    async def idle(app, pilot):
        await pilot.press("tab")  # rank 0's val loader: not iterated
        await pilot.pause()
        loader = app.query_one(LoaderPanel)
        assert "val" in str(loader.border_title)
        assert "not iterated in the window" in _line(loader, "time")

    run(idle, make_app(fakes.multi_source_doc()))


def test_workers_table_has_fetch_and_collate_columns():
    async def body(app, pilot):
        table = app.query_one(WorkersTable)
        labels = table.column_labels()
        assert "fetch p50" in labels and "collate p50" in labels
        column = labels.index("collate p50")
        assert [r[column] for r in table_text(table)] == ["0.60"] * 4

    for size in (SIZE, (80, 24), (200, 50)):
        run(body, make_app(fakes.main_process_bound_doc()), size=size)


def test_stacked_bar_cells_add_up():
    def cells(parts, width):
        return [(text[0], len(text)) for text, _ in graphics.stacked_bar(parts, width, "dim")]

    # Largest remainder: 0.6/0.064/0.336 of 25 cells is 15/1.6/8.4 → 15, 2, 8.
    assert cells([(0.6, "█", "g"), (0.064, "▓", "y"), (0.336, "▒", "o")], 25) == [
        ("█", 15), ("▓", 2), ("▒", 8)]
    assert cells([(0.37, "█", "g"), (0.63, "▓", "y")], 11) == [("█", 4), ("▓", 7)]
    assert cells([(0.25, "█", "g"), (None, "▓", "y")], 8) == [("█", 2), ("·", 6)]  # unknown: none
    assert cells([(0.62, "█", "g"), (0.381, "▓", "y")], 10) == [("█", 6), ("▓", 4)]  # over 1: scaled
    assert cells([(0.004, "█", "g"), (0.996, "▓", "y")], 20) == [("▓", 20)]
    assert cells([], 6) == [("·", 6)]
