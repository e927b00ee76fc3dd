"""Snapshots of the main TUI states at 80×24 (compact) and 160×50 (wide).

Deterministic: the documents come from `tests/fakes.py` (real wire messages through the real
model, so the banner shows what `diagnose` really says), the clock is fake (and the time zone UTC),
and the refresh timer is set to an hour so only the ticks done in ``run_before`` change the screen.
The SVGs pin textual 8.2.8 (pytest-textual-snapshot 1.1.0). Regenerate with
``pytest tests/snapshots --snapshot-update`` and look at each SVG (``rsvg-convert`` makes PNGs).
"""

from __future__ import annotations

import time

import pytest

from loadertop.tui.app import LoadertopApp

import fakes
from fakes import FakeFeed

SIZES = {"80x24": (80, 24), "160x50": (160, 50)}


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def make_app(documents) -> LoadertopApp:
    return LoadertopApp(FakeFeed(documents), refresh_s=3600.0, clock=lambda: fakes.T0 + 12.0)


def ticks(n: int):
    """run_before: n more refresh ticks (one document each), then let the screen settle."""
    async def run_before(pilot) -> None:
        await pilot.pause()
        for _ in range(n):
            pilot.app.tick()
        await pilot.pause()
    return run_before


def keys(*names: str):
    async def run_before(pilot) -> None:
        await pilot.pause()
        await pilot.press(*names)
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_healthy(snap_compare, size):
    assert snap_compare(make_app(fakes.gpu_doc()), terminal_size=SIZES[size], run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_held_verdict(snap_compare, size):
    """A verdict the hysteresis holds, said with today's figures, and the change it holds back."""
    assert snap_compare(make_app(fakes.held_verdict_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_io_bound_with_history(snap_compare, size):
    app = make_app(fakes.io_bound_history(48))
    assert snap_compare(app, terminal_size=SIZES[size], run_before=ticks(47))


@pytest.mark.parametrize("size", SIZES)
def test_dead_worker(snap_compare, size):
    assert snap_compare(make_app(fakes.dead_worker_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_multi_source_overview(snap_compare, size):
    assert snap_compare(make_app(fakes.multi_source_doc()), terminal_size=SIZES[size],
                        run_before=keys("tab", "tab", "o"))


@pytest.mark.parametrize("size", SIZES)
def test_main_process_bound(snap_compare, size):
    """The wait split measured: most of the wait is the handoff (the "time" bar's ▒)."""
    assert snap_compare(make_app(fakes.main_process_bound_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_split_unknown(snap_compare, size):
    """in_order=False: the probe cannot split the wait; the bar says so instead of guessing."""
    assert snap_compare(make_app(fakes.unpaired_doc()), terminal_size=SIZES[size], run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_autotune_inside_an_epoch(snap_compare, size):
    """`run --autotune` settled inside one long epoch: its line, and (wide) the latest switch."""
    assert snap_compare(make_app(fakes.autotuned_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_no_gpu(snap_compare, size):
    assert snap_compare(make_app(fakes.no_gpu_doc()), terminal_size=SIZES[size], run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, size):
    assert snap_compare(make_app(fakes.healthy_doc()), terminal_size=SIZES[size],
                        run_before=keys("question_mark"))


# --------------------------------------------------------------------------- findings (docs/contract.md §5)


@pytest.mark.parametrize("size", SIZES)
def test_worker_hung(snap_compare, size):
    """A worker stuck in a network read: its finding under the banner with its stack (80×24: one
    row from the user's frame in), the loop's own hang below it, the worker marked "hung"."""
    assert snap_compare(make_app(fakes.worker_hung_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_findings_list(snap_compare, size):
    """`e`: every finding with evidence, advice and the whole stack."""
    assert snap_compare(make_app(fakes.worker_hung_doc()), terminal_size=SIZES[size],
                        run_before=keys("e"))


@pytest.mark.parametrize("size", SIZES)
def test_crashed(snap_compare, size):
    """A worker SIGKILLed, torch's RuntimeError ending the loop: "crashed" and the error."""
    assert snap_compare(make_app(fakes.killed_worker_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_warnings(snap_compare, size):
    """A slow worker, a shared random state and slow epoch starts: warnings and info."""
    assert snap_compare(make_app(fakes.pitfalls_doc()), terminal_size=SIZES[size],
                        run_before=ticks(0))


@pytest.mark.parametrize("size", SIZES)
def test_findings_in_overview(snap_compare, size):
    """The overview counts each source's findings; the shown one points at the others'."""
    assert snap_compare(make_app(fakes.findings_multi_source_doc()), terminal_size=SIZES[size],
                        run_before=keys("o"))


@pytest.mark.parametrize("size", SIZES)
def test_replay(snap_compare, size, tmp_path):
    """A recording of the I/O-bound job, 40 s into it at double speed: the replay line under the
    header, "live then", the graphs of the 10 s before the point."""
    from loadertop.recording.file import read
    from loadertop.recording.playback import Playback
    from loadertop.tui.replay import ReplayApp

    path = tmp_path / "io.ltrec"
    fakes.write_recording(path, fakes.io_bound_scenario(), fakes.T0 - 90.0, fakes.T0)
    wall = [0.0]
    app = ReplayApp(Playback(read(str(path))), "train-2026-12-01.ltrec", wall=lambda: wall[0],
                    refresh_s=3600.0)

    async def run_before(pilot) -> None:
        await pilot.pause()
        await pilot.press("right", "right", "right", "greater_than_sign")
        for _ in range(5):
            wall[0] += 1.0
            pilot.app.tick()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZES[size], run_before=run_before)
