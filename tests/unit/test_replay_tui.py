"""`loadertop replay` in Pilot: a real recording (real wire frames of a simulated I/O-bound job,
written by the real writer) played by the real Playback into the live app, with a fake wall clock
that only the tests move."""

from __future__ import annotations

import asyncio

from loadertop.recording.file import read
from loadertop.recording.playback import Playback
from loadertop.tui.replay import SEEK_S, PlaybackClock, ReplayApp, position_text, replay_note
from loadertop.tui.widgets import Banner, HeaderBar, HelpScreen, LoaderPanel

from fakes import T0, io_bound_scenario, write_recording

SIZE = (120, 40)
NEVER = 3600.0


class Wall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def recording(tmp_path, seconds: float = 120.0):
    path = tmp_path / "io.ltrec"
    write_recording(path, io_bound_scenario(), T0 - seconds, T0)
    return read(str(path))


def make_app(tmp_path, wall: Wall, **kwargs) -> ReplayApp:
    return ReplayApp(Playback(recording(tmp_path)), "io.ltrec", wall=wall, refresh_s=NEVER, **kwargs)


def run(coro_fn, app, size=SIZE):
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await coro_fn(app, pilot)

    asyncio.run(main())


def header(app) -> str:
    return app.query_one(HeaderBar).text()


def test_the_playback_clock_plays_pauses_seeks_and_stops_at_the_ends():
    wall = Wall()
    clock = PlaybackClock(100.0, 160.0, wall=wall)
    wall.t += 5
    assert clock.position() == 105.0
    clock.set_speed(4.0)
    wall.t += 5
    assert clock.position() == 125.0
    clock.set_paused(True)
    wall.t += 100
    assert clock.position() == 125.0
    clock.seek(-200)
    assert clock.position() == 100.0
    clock.set_paused(False)
    wall.t += 1000
    assert clock.position() == 160.0 and clock.at_end()
    assert position_text(3723) == "1:02:03" and position_text(65) == "1:05"


def test_replay_plays_in_real_time_and_says_it_is_a_replay(tmp_path):
    wall = Wall()
    app = make_app(tmp_path, wall)

    async def check(app, pilot):
        first = app.document.taken_at
        assert "▶ REPLAY io.ltrec · 0:00 / 1:59 · ×1" in header(app)
        assert "● live then ·" in header(app)
        wall.t += 3.0
        app.tick()
        await pilot.pause()
        assert app.document.taken_at == round(first + 3.0, 3)
        assert "0:03 / 1:59" in header(app)
        # the verdict is today's model's, from the recorded frames
        assert app.document.diagnosis.category == "input_bound_io"
        assert "INPUT-BOUND: WAITING ON I/O" in app.query_one(Banner).text()

    run(check, app)


def test_space_pauses_the_playback_and_the_clock(tmp_path):
    wall = Wall()
    app = make_app(tmp_path, wall)

    async def check(app, pilot):
        await pilot.press("space")
        at = app.document.taken_at
        wall.t += 30.0
        app.tick()
        await pilot.pause()
        assert app.document.taken_at == at and "PAUSED" in header(app)
        await pilot.press("right")  # seeking while paused shows the new point at once
        assert app.document.taken_at == round(at + SEEK_S, 3)
        await pilot.press("space")
        wall.t += 2.0
        app.tick()
        await pilot.pause()
        assert app.document.taken_at == round(at + SEEK_S + 2.0, 3)
        assert "PAUSED" not in header(app)

    run(check, app)


def test_arrows_seek_and_the_graphs_restart_at_the_new_point(tmp_path):
    wall = Wall()
    app = make_app(tmp_path, wall)

    async def check(app, pilot):
        start = app.clock.start
        for _ in range(5):
            wall.t += 1.0
            app.tick()
        await pilot.pause()
        assert app.history.version >= 5
        await pilot.press("shift+right")
        assert app.document.taken_at == round(start + 5.0 + 60.0, 3)
        assert len(app.history.loader(LoaderPanel.SERIES[0], app.document.sources[0].id)) == 1
        await pilot.press("left", "left")
        assert app.document.taken_at == round(start + 45.0, 3)
        await pilot.press("end")
        assert app.document.taken_at == round(app.clock.end, 3)
        assert "end of recording" in header(app)
        await pilot.press("home")
        assert app.document.taken_at == round(start, 3)

    run(check, app)


def test_speed_keys_step_through_the_speeds(tmp_path):
    wall = Wall()
    app = make_app(tmp_path, wall)

    async def check(app, pilot):
        await pilot.press("greater_than_sign", "greater_than_sign")
        assert app.clock.speed == 4.0 and "×4" in header(app)
        at = app.clock.position()
        wall.t += 2.0
        app.tick()
        await pilot.pause()
        assert app.document.taken_at == round(at + 8.0, 3)
        for _ in range(20):
            await pilot.press("less_than_sign")
        assert app.clock.speed == 0.25

    run(check, app)


def test_space_at_the_end_plays_again_from_the_start(tmp_path):
    wall = Wall()
    app = make_app(tmp_path, wall)

    async def check(app, pilot):
        wall.t += 500.0
        app.tick()
        await pilot.pause()
        assert app.clock.at_end()
        await pilot.press("space")
        assert app.document.taken_at == round(app.clock.start, 3) and not app.paused

    run(check, app)


def test_the_help_lists_the_replay_keys(tmp_path):
    app = make_app(tmp_path, Wall())

    async def check(app, pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "seek 10 s" in str(app.screen.query_one("#help").render())

    run(check, app)


def test_the_replay_note_fits_a_compact_header():
    wall = Wall()
    clock = PlaybackClock(0.0, 3600.0, wall=wall)
    assert replay_note("r.ltrec", clock, compact=True) == "▶ REPLAY r.ltrec · 0:00 / 1:00:00 · ×1"
