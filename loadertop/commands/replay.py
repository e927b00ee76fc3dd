"""`loadertop replay FILE`: a recording in the live TUI (`loadertop.tui.replay`)."""

from __future__ import annotations

import os
import sys

from loadertop import environment
from loadertop.commands.common import open_playback, print_error
from loadertop.commands.view import MIN_REFRESH_S, run_until_exit


def main(args) -> int:
    if args.speed <= 0:
        print_error("--speed must be positive")
        return 2
    if args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    playback = open_playback(args.file, args.window)
    if playback is None:
        return 1
    if not sys.stdout.isatty():
        print_error("replay needs a terminal; for a report of the recording use "
                    f"`loadertop snapshot --from {args.file}` or `loadertop report {args.file}`")
        return 2
    from loadertop.tui.replay import ReplayApp

    run_until_exit(ReplayApp(playback, os.path.basename(args.file), speed=args.speed,
                             refresh_s=args.refresh, no_color=environment.no_color(args.no_color)))
    return 0
