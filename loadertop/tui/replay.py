"""`loadertop replay FILE`: the live TUI, fed from a recording instead of the network.

The app is the live one (`LoadertopApp`); only its feed and its clock differ. The feed answers
`advance(t)` with `Playback.document_at(t)`, and the app's clock is the *recording's* time, moved
by a `PlaybackClock` (real timing by default; paused, sped up, seeked). So every panel, the header's
clock and every age on screen read as they did at that moment of the recording, and the verdicts
are today's model's, recomputed from the recorded messages.

Keys added to the live ones: space pauses the playback (the live app's pause: the screen and the
clock stop), ←/→ seek 10 s, shift+←/→ 60 s, home/end, </> speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.binding import Binding

from loadertop.client.document import Document
from loadertop.recording.playback import Playback
from loadertop.tui.app import LoadertopApp
from loadertop.tui.widgets import History

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
SEEK_S = 10.0
SEEK_LONG_S = 60.0


class PlaybackClock:
    """Recording time as it plays: `position()` moves `speed` recording seconds per wall second
    while playing, stays while paused, and stops at the end."""

    def __init__(self, start: float, end: float, *, speed: float = 1.0,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.start, self.end = start, end
        self.speed = speed
        self._wall = wall
        self._anchor_pos = start
        self._anchor_wall = wall()
        self.paused = False

    def position(self) -> float:
        if self.paused:
            return self._anchor_pos
        pos = self._anchor_pos + (self._wall() - self._anchor_wall) * self.speed
        return min(pos, self.end)

    def at_end(self) -> bool:
        return self.position() >= self.end

    def _rebase(self, pos: float) -> None:
        self._anchor_pos = min(max(pos, self.start), self.end)
        self._anchor_wall = self._wall()

    def set_paused(self, paused: bool) -> None:
        self._rebase(self.position())
        self.paused = paused

    def seek(self, delta_s: float) -> None:
        self._rebase(self.position() + delta_s)

    def seek_to(self, pos: float) -> None:
        self._rebase(pos)

    def set_speed(self, speed: float) -> None:
        self._rebase(self.position())
        self.speed = speed


class ReplayFeed:
    """The app's `Feed` over a `Playback`: nothing to poll, `advance(t)` is the document at `t`."""

    def __init__(self, playback: Playback) -> None:
        self.playback = playback

    def poll(self) -> None:
        pass

    def advance(self, now: float) -> Document:
        return self.playback.document_at(now)

    def close(self) -> None:
        pass


def position_text(seconds: float) -> str:
    """A media player's position: 7:05, 1:02:03."""
    s = max(0, int(seconds))
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def replay_note(name: str, clock: PlaybackClock, compact: bool = False) -> str:
    """The header's replay line: the file, where in it we are, the speed, the keys."""
    pos = clock.position() - clock.start
    total = clock.end - clock.start
    where = f"{position_text(pos)} / {position_text(total)}"
    state = "end of recording" if clock.at_end() else f"×{clock.speed:g}"
    keys = "" if compact else "   space pause · ←/→ seek · </> speed"
    return f"▶ REPLAY {name} · {where} · {state}{keys}"


class ReplayApp(LoadertopApp):
    """The live app on a recording. `space` is the live pause (which stops the playback clock too)."""

    BINDINGS = [
        Binding("left", "seek(-1)", "Seek", key_display="←/→"),
        Binding("right", "seek(1)", "Seek", show=False),
        Binding("shift+left", "seek(-6)", "Seek back 60 s", show=False),
        Binding("shift+right", "seek(6)", "Seek on 60 s", show=False),
        Binding("home", "seek_edge('start')", "Start", show=False),
        Binding("end", "seek_edge('end')", "End", show=False),
        Binding("less_than_sign", "speed(-1)", "Speed", key_display="</>"),
        Binding("greater_than_sign", "speed(1)", "Faster", show=False),
    ]

    REPLAY = True
    EXTRA_KEYS_HELP = (
        "  [b]replay[/b]        space pause/play · ←/→ seek 10 s (shift: 60 s) · home/end\n"
        f"                < / > speed ({'/'.join(f'{s:g}' for s in SPEEDS)}×)\n")

    def __init__(self, playback: Playback, name: str, *, speed: float = 1.0,
                 wall: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        self.playback = playback
        self.clock = PlaybackClock(playback.start, playback.end, speed=speed, wall=wall)
        super().__init__(ReplayFeed(playback), clock=self.clock.position,
                         note=lambda: replay_note(name, self.clock, self.compact), **kwargs)

    def action_toggle_pause(self) -> None:
        if self.clock.at_end() and self.paused is False:
            # Space at the end plays it again from the start, as a media player does.
            self._restart_history()
            self.clock.seek_to(self.clock.start)
            self.tick()
            return
        self.clock.set_paused(not self.paused)
        super().action_toggle_pause()

    def _restart_history(self) -> None:
        # The graphs' points are in the order shown; after a jump they would join two times.
        history = History()
        history.track(self.history.loader_series)
        history.track(self.history.machine_series)
        self.history = history

    def _show_now(self) -> None:
        """Show the document at the clock's position at once, paused or not."""
        self.document = self.feed.advance(self.clock.position())
        self.history.record(self.document)
        self._tables_due = self._panels_due = True
        self._render_document(force_tables=True)

    def action_seek(self, steps: int) -> None:
        self._restart_history()
        self.clock.seek(steps * SEEK_S)
        self._show_now()

    def action_seek_edge(self, edge: str) -> None:
        self._restart_history()
        self.clock.seek_to(self.clock.start if edge == "start" else self.clock.end)
        self._show_now()

    def action_speed(self, step: int) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.clock.speed))
        self.clock.set_speed(SPEEDS[min(max(i + step, 0), len(SPEEDS) - 1)])
        with self.batch_update():
            self._render_header()
