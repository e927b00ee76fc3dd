"""`loadertop replay FILE`: a recording in the live TUI (`loadertop.tui.replay`)."""

from __future__ import annotations

import os
import sys

from loadertop import environment
from loadertop.commands.common import open_playback, print_error
from loadertop.commands.view import MIN_REFRESH_S, run_until_exit

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop replay",
        description="Play a recording in the live viewer: space pause, ←/→ seek 10 s (shift: 60 s), "
                    "home/end, </> speed. The verdicts are today's loadertop's, from the recorded messages.")
    p.add_argument("file", metavar="FILE", help="a recording, or `last` / a pid: that job's black box")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed (default 1)")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help="seconds between screen refreshes (default 1)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind each figure (default 3)")
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR=1)")
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
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
    from loadertop.recording.blackbox import JobRecording, replay_name
    from loadertop.tui.replay import ReplayApp

    name = os.path.basename(args.file)
    if isinstance(playback.recording, JobRecording):  # a job's black box: its end in the header
        name = replay_name(playback.recording)
    run_until_exit(ReplayApp(playback, name, speed=args.speed,
                             refresh_s=args.refresh, no_color=environment.no_color(args.no_color)))
    return 0
