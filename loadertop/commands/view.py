"""`loadertop [ENDPOINT ...]`: the live TUI, or one printed report when not on a terminal."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from loadertop import environment
from loadertop.commands.common import UsageError, open_subscriber, print_error

MIN_REFRESH_S = 0.05
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # leave the screen in order on these


RECORD_POLL_S = 0.5  # while recording, drain (and so flush) at least this often: "at most a second"


def main(args) -> int:
    if args.max_size is not None and args.record is None:
        print_error("--max-size goes with --record FILE")
        return 2
    if args.record is not None and (not sys.stdout.isatty() or args.once):
        print_error("--record goes with the live screen; without one: "
                    f"`loadertop record -o {args.record}`")
        return 2
    if not sys.stdout.isatty() or args.once:
        from loadertop.commands import snapshot

        if args.seconds <= 0:
            print_error("--seconds must be positive")
            return 2
        return snapshot.report_live(args.endpoints, args.seconds, as_json=False, key=args.key,
                                    server_key=args.server_key)
    if args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    try:
        sub = open_subscriber(args.endpoints, window_s=args.window, key=args.key,
                              server_key=args.server_key)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    if args.record is None:
        return run_app(sub, refresh_s=args.refresh, no_color=environment.no_color(args.no_color))
    from loadertop.commands.record import open_writer, size_text

    try:
        writer = open_writer(args.record, args.max_size, ["loadertop", *sys.argv[1:]])
    except UsageError as exc:
        sub.close()
        print_error(str(exc))
        return 2
    sub.recorder = writer

    def recording_note() -> str:
        if writer.full:
            return f"● recording stopped at --max-size {args.max_size}: {args.record}"
        return f"● recording to {args.record} ({size_text(writer.written)})"

    try:
        return run_app(sub, refresh_s=args.refresh, no_color=environment.no_color(args.no_color),
                       note=recording_note, poll_s=RECORD_POLL_S)
    finally:
        writer.close()
        print(f"loadertop: recorded {writer.frames} messages to {args.record} "
              f"({size_text(writer.written)})", file=sys.stderr)


def run_app(sub, *, refresh_s: float, no_color: bool,
            note: Callable[[], str | None] | None = None, poll_s: float | None = None) -> int:
    """The TUI on `sub` until the user quits; the subscriber is closed afterwards.

    `note`: a line of context for the header, asked once per refresh (the demo's phase).
    SIGTERM and SIGHUP (a `kill`, a closed terminal) make the app exit as `q` does, so the
    terminal is left in order — and the demo, which runs this, gets to stop its job."""
    from loadertop.client.subscriber import NetworkFeed
    from loadertop.tui.app import LoadertopApp

    feed = NetworkFeed(sub)
    try:
        extra = {"poll_s": min(poll_s, refresh_s)} if poll_s is not None else {}
        run_until_exit(LoadertopApp(feed, refresh_s=refresh_s, no_color=no_color, note=note, **extra))
    finally:
        feed.close()
    return 0


def run_until_exit(app) -> None:
    """Run a Textual app until the user quits; SIGTERM and SIGHUP (a `kill`, a closed terminal)
    make it exit as `q` does, so the terminal is left in order."""

    def exit_app(signum, frame) -> None:
        app.exit()

    previous = {s: signal.signal(s, exit_app) for s in EXIT_SIGNALS}
    try:
        app.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
