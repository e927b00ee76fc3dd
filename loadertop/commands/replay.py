"""`loadertop replay FILE`: a recording in the live TUI (`loadertop.viewer.replay`)."""

from __future__ import annotations

import os
import sys

from loadertop import environment
from loadertop.commands.common import load_recording, playback_of, print_error
from loadertop.commands.view import EXIT_SIGNALS, MIN_REFRESH_S


def main(args) -> int:
    if args.speed <= 0:
        print_error("--speed must be positive")
        return 2
    if args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    recording, error = load_recording(args.file)
    if recording is None:
        print_error(error)
        return 1
    playback = playback_of(recording, args.window)
    if playback is None:
        return 1
    if not sys.stdout.isatty():
        print_error("replay needs a terminal; for a report of the recording use "
                    f"`loadertop snapshot --from {args.file}` or `loadertop report {args.file}`")
        return 2
    import signal

    from loadertop.viewer.replay import ReplayApp

    app = ReplayApp(playback, os.path.basename(args.file), speed=args.speed, refresh_s=args.refresh,
                    no_color=environment.no_color(args.no_color))

    def exit_app(signum, frame) -> None:
        app.exit()

    previous = {s: signal.signal(s, exit_app) for s in EXIT_SIGNALS}
    try:
        app.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
