"""`loadertop [ENDPOINT ...]`: the live TUI, or one printed report when not on a terminal."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from loadertop import environment
from loadertop.commands.common import UsageError, open_subscriber, print_error

MIN_REFRESH_S = 0.05
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # leave the screen in order on these


def main(args) -> int:
    if not sys.stdout.isatty() or args.once:
        from loadertop.commands import snapshot

        args.json = False
        return snapshot.main(args)
    if args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    try:
        sub = open_subscriber(args.endpoints, window_s=args.window, key=args.key,
                              server_key=args.server_key)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    return run_app(sub, refresh_s=args.refresh, no_color=environment.no_color(args.no_color))


def run_app(sub, *, refresh_s: float, no_color: bool,
            note: Callable[[], str | None] | None = None) -> int:
    """The TUI on `sub` until the user quits; the subscriber is closed afterwards.

    `note`: a line of context for the header, asked once per refresh (the demo's phase).
    SIGTERM and SIGHUP (a `kill`, a closed terminal) make the app exit as `q` does, so the
    terminal is left in order — and the demo, which runs this, gets to stop its job."""
    from loadertop.viewer.app import LoadertopApp
    from loadertop.viewer.subscriber import NetworkFeed

    feed = NetworkFeed(sub)
    try:
        app = LoadertopApp(feed, refresh_s=refresh_s, no_color=no_color, note=note)

        def exit_app(signum, frame) -> None:
            app.exit()

        previous = {s: signal.signal(s, exit_app) for s in EXIT_SIGNALS}
        try:
            app.run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    finally:
        feed.close()
    return 0
