"""`loadertop [ENDPOINT ...]`: the live TUI, or one printed report when not on a terminal."""

from __future__ import annotations

import os
import sys

from loadertop.commands.common import UsageError, open_subscriber, print_error

MIN_REFRESH_S = 0.05


def main(args) -> int:
    if not sys.stdout.isatty() or args.once:
        from loadertop.commands import snapshot

        args.json = False
        return snapshot.main(args)
    if args.refresh < MIN_REFRESH_S:
        print_error(f"--refresh must be at least {MIN_REFRESH_S} s")
        return 2
    try:
        sub = open_subscriber(args.endpoints, key=args.key, server_key=args.server_key)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    return run_app(sub, refresh_s=args.refresh, window_s=args.window,
                   no_color=args.no_color or bool(os.environ.get("NO_COLOR")))


def run_app(sub, *, refresh_s: float, window_s: float, no_color: bool) -> int:
    from loadertop.viewer.app import LoadertopApp
    from loadertop.viewer.subscriber import NetworkFeed

    feed = NetworkFeed(sub, window_s=window_s)
    app = LoadertopApp(feed, refresh_s=refresh_s, no_color=no_color)
    try:
        app.run()
    finally:
        feed.close()
    return 0
