"""Pilot tests of the TUI, fed by FakeFeed with a fake clock (no network, no torch, no sleeps).

pytest-asyncio is not a dependency: each test runs its coroutine with ``asyncio.run``.
The refresh timer is set to an hour so only the explicit ``app.tick()`` calls change the screen.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys

import pytest

from loadertop.viewer import fake_feed as ff
from loadertop.viewer.app import REFRESH_STEPS, HelpScreen, LoadertopApp
from loadertop.viewer.widgets import (
    Banner,
    GpuPanel,
    HeaderBar,
    LoaderPanel,
    OverviewTable,
    WorkersTable,
    sparkline,
    sparkline_rows,
)

SIZE = (120, 40)
NEVER = 3600.0  # refresh interval for tests: ticks happen only when a test calls app.tick()


class FakeClock:
    def __init__(self, now: float = ff.T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_app(documents, clock: FakeClock | None = None, **kwargs) -> LoadertopApp:
    kwargs.setdefault("refresh_s", NEVER)
    return LoadertopApp(ff.FakeFeed(documents), clock=clock or FakeClock(), **kwargs)


def run(coro_fn, app: LoadertopApp, size=SIZE):
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await coro_fn(app, pilot)

    asyncio.run(main())


def text_of(widget) -> str:
    """What a widget shows, as plain text (header/banner/panels render rich Text)."""
    return widget.render().plain


def table_text(table) -> list[list[str]]:
    rows = []
    for row_key in table.rows:
        rows.append([c.plain if hasattr(c, "plain") else str(c) for c in table.get_row(row_key)])
    return rows


def column_labels(table) -> list[str]:
    return [c.label.plain for c in table.columns.values()]


# --------------------------------------------------------------------------- keys


def test_q_quits_and_closes_feed():
    app = make_app(ff.healthy_doc())

    async def body(app, pilot):
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running

    run(body, app)
    assert app.feed.closed


def test_escape_quits():
    app = make_app(ff.healthy_doc())

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
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running  # Esc closed the help, it did not quit

    run(body, make_app(ff.healthy_doc()))


def test_pause_freezes_document_but_header_keeps_ticking():
    clock = FakeClock()
    healthy, io = ff.healthy_doc(), ff.io_bound_doc()
    app = make_app([healthy], clock=clock)

    async def body(app, pilot):
        assert "HEALTHY" in text_of(app.query_one(Banner))
        await pilot.press("space")
        await pilot.pause()
        assert app.paused
        assert "PAUSED" in text_of(app.query_one(HeaderBar))
        app.feed.push(io)
        clock.advance(61)
        app.tick()
        await pilot.pause()
        header = text_of(app.query_one(HeaderBar))
        assert "PAUSED" in header
        assert "up 1h03m" in header  # uptime from started_at keeps ticking: 3725 s + 61 s
        assert "HEALTHY" in text_of(app.query_one(Banner))  # the new document is not shown
        assert app.document is healthy
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

    run(body, make_app(ff.healthy_doc(), refresh_s=1.0))


def test_sort_keys_reorder_workers():
    doc = ff.healthy_doc()
    workers = doc["sources"][0]["workers"]
    workers[0]["cpu_percent"], workers[3]["cpu_percent"] = 20.0, 99.0
    workers[1]["rss_bytes"] = 9 * ff.GIB

    async def body(app, pilot):
        table = app.query_one(WorkersTable)
        ids = lambda: [str(k.value) for k in table.rows]  # noqa: E731
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
        assert ids()[0] == "3"  # fetch p95 grows with the id in the fake document
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
        assert "28.1" in text_of(loader)
        await pilot.press("shift+tab", "left_square_bracket")
        await pilot.pause()
        assert "train r0" in str(loader.border_title)
        await pilot.press("left_square_bracket")  # wraps around
        await pilot.pause()
        assert "val r1" in str(loader.border_title)

    run(body, make_app(ff.multi_source_doc()))


def test_overview_toggles_and_marks_straggler():
    async def body(app, pilot):
        overview = app.query_one(OverviewTable)
        assert not overview.display
        await pilot.press("o")
        await pilot.pause()
        assert overview.display and not app.query_one(LoaderPanel).display
        rows = table_text(overview)
        assert len(rows) == 4
        assert any("train r1 ◀" in r for r in rows)
        assert "straggler: train r1" in str(overview.border_title)
        assert "▶" in rows[0][0]
        await pilot.press("tab")
        await pilot.pause()
        assert "▶" in table_text(overview)[1][0]
        await pilot.press("o")
        await pilot.pause()
        assert not overview.display and app.query_one(LoaderPanel).display

    run(body, make_app(ff.multi_source_doc()))


# --------------------------------------------------------------------------- states


def test_dead_worker_shows_dead_and_exit_code():
    async def body(app, pilot):
        rows = table_text(app.query_one(WorkersTable))
        dead = [r for r in rows if any("dead" in c for c in r)]
        assert len(dead) == 1 and "-9" in " ".join(dead[0])
        assert "1 dead" in str(app.query_one(WorkersTable).border_title)
        assert "STALLED" in text_of(app.query_one(Banner))
        assert "blocked in next() for 38 s" in text_of(app.query_one(LoaderPanel))

    run(body, make_app(ff.dead_worker_doc()))


def test_dead_worker_in_compact_layout():
    async def body(app, pilot):
        rows = table_text(app.query_one(WorkersTable))
        assert any("dead, exit -9" in " ".join(r) for r in rows)

    run(body, make_app(ff.dead_worker_doc()), size=(80, 24))


def test_disconnected_feed_is_shown():
    async def body(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "disconnected" in header and "no data for 47 s" in header

    run(body, make_app(ff.disconnected_doc()))


def test_stale_source_says_no_data_for():
    doc = ff.healthy_doc()
    doc["sources"][0]["age_s"] = 7.4

    async def body(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "no data for 7 s" in header and "disconnected" not in header

    run(body, make_app(doc))


def test_no_gpu_shows_honest_panel():
    async def body(app, pilot):
        assert "No GPU: NVML not available" in text_of(app.query_one(GpuPanel))

    run(body, make_app(ff.no_gpu_doc()))

    doc = ff.no_gpu_doc()
    doc["system"]["gpu_status"] = "error: NVML_ERROR_DRIVER_NOT_LOADED"

    async def body_error(app, pilot):
        assert "NVML_ERROR_DRIVER_NOT_LOADED" in text_of(app.query_one(GpuPanel))

    run(body_error, make_app(doc))


def test_waiting_for_system_and_empty_documents():
    async def body(app, pilot):
        assert "waiting for system data" in text_of(app.query_one(GpuPanel))

    run(body, make_app(ff.waiting_for_system_doc()))

    async def body_empty(app, pilot):
        assert "no instrumented DataLoader" in text_of(app.query_one(HeaderBar))
        assert "IDLE" in text_of(app.query_one(Banner))

    run(body_empty, make_app(ff.empty_doc()))


def test_unknown_figures_show_dash_not_zero():
    doc = ff.main_process_doc()  # num_workers=0: no queue, main-process fetch figures

    async def body(app, pilot):
        loader = text_of(app.query_one(LoaderPanel))
        assert "main process loads" in loader and "p50 29.0" in loader
        assert "none: num_workers=0" in str(app.query_one(WorkersTable).border_title)

    run(body, make_app(doc))


def test_too_small_terminal_shows_message():
    async def body(app, pilot):
        msg = app.query_one("#too-small")
        assert msg.display
        assert "too small" in str(msg.render()) and "60×15" in str(msg.render())
        assert not app.query_one("#main").display
        app.tick()
        await pilot.pause()

    run(body, make_app(ff.healthy_doc()), size=(40, 10))


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

    run(body, make_app(ff.healthy_doc()))


# --------------------------------------------------------------------------- architecture


def test_history_grows_only_when_document_changes():
    docs = ff.io_bound_history(5)

    async def body(app, pilot):
        for _ in range(10):
            app.tick()
        await pilot.pause()
        sid = docs[0]["sources"][0]["id"]
        assert len(app._source_history[sid]["wait_p95_ms"]) == 5  # 5 distinct documents
        assert len(app._machine_history["cpu_percent"]) == 5

    run(body, make_app(docs))


def test_feed_polled_by_timer():
    async def body(app, pilot):
        await pilot.pause(0.35)
        assert app.feed.polls >= 2

    run(body, make_app(ff.healthy_doc(), poll_s=0.05))


def test_tables_refresh_at_most_twice_a_second():
    docs = ff.io_bound_history(40)

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
    app = make_app(ff.healthy_doc(), no_color=True)
    assert app.no_color

    async def body(app, pilot):
        assert "HEALTHY" in text_of(app.query_one(Banner))

    run(body, app)


def test_viewer_imports_neither_torch_nor_zmq():
    code = ("import sys, loadertop.viewer.app, loadertop.viewer.fake_feed; "
            "bad = [m for m in ('torch', 'zmq') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


# --------------------------------------------------------------------------- pieces


def test_sparkline_shapes():
    assert sparkline([0, 5, 10], 3) == "▁▅█"
    assert sparkline([1, None, 1], 5) == "  █ █"
    assert sparkline([], 3) == "   "
    rows = sparkline_rows([0, 8, 16], 3, 2, top=16)
    assert rows == ["  █", "▁██"]  # a known 0 still shows the lowest eighth


@pytest.mark.parametrize("builder", [ff.healthy_doc, ff.gpu_doc, ff.no_gpu_doc, ff.io_bound_doc,
                                     ff.dead_worker_doc, ff.disconnected_doc,
                                     ff.multi_source_doc, ff.main_process_doc])
def test_fake_documents_are_complete(builder):
    doc = builder()
    assert doc["schema"] == "loadertop.snapshot/1"
    for key in ("taken_at", "window_s", "sources", "system", "diagnosis", "viewer"):
        assert key in doc
    for src in doc["sources"]:
        for key in ("id", "host", "pid", "rank", "name", "state", "config", "batches",
                    "batches_total", "batches_per_s", "samples_per_s", "wait_ms", "step_ms",
                    "wait_fraction", "queue", "workers", "diagnosis", "command", "endpoint",
                    "started_at", "age_s", "dropped", "probe_cpu_fraction", "blocked_ms", "loop"):
            assert key in src, key
    assert builder() == copy.deepcopy(doc)  # deterministic


# --------------------------------------------------------------------------- before any data


def test_waiting_for_data_is_not_called_disconnected_and_shows_the_note():
    endpoint = "ipc:///tmp/loadertop-demo/demo.sock"

    async def body(app, pilot):
        header, banner = text_of(app.query_one(HeaderBar)), text_of(app.query_one(Banner))
        assert "waiting for data" in header and "disconnected" not in header
        assert endpoint in header
        assert banner.startswith("WAITING FOR DATA") and "IDLE" not in banner
        assert "demo phase 1/4" in header  # the app's note line
        app.feed.push(ff.healthy_doc())
        app.tick()
        await pilot.pause()
        assert "WAITING" not in text_of(app.query_one(Banner))

    run(body, make_app(ff.waiting_doc(endpoint), note=lambda: "demo phase 1/4: healthy"))


def test_two_processes_with_the_same_loader_name_are_told_apart_by_host_pid():
    a = ff.source(name="train", pid=1111, host="node-a")
    b = ff.source(name="train", pid=2222, host="node-a")
    b["id"] = "node-a:2222:train"
    doc = ff.document([a, b])

    async def body(app, pilot):
        header = text_of(app.query_one(HeaderBar))
        assert "train node-a:1111" in header and "train node-a:2222" in header

    run(body, make_app(doc))
