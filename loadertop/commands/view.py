"""`loadertop [ENDPOINT ...]`: the live TUI, or one printed report when not on a terminal.

The viewer is `loadertop` with no command, so its --help is the program's: it lists every command.
"""

from __future__ import annotations

import os
import signal
import sys

from loadertop._version import __version__
from loadertop.commands import UsageError
from loadertop.commands.common import add_key_options, open_subscriber, print_error

# `loadertop --help` and `--version` import this module: what only the screen needs (the
# environment's rules, typing) is imported where it is used.
TYPE_CHECKING = False  # not typing's
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

    from textual.app import App

    from loadertop.client.subscriber import Subscriber

MIN_REFRESH_S = 0.05
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # leave the screen in order on these
# How long the screen may take to leave in order after one of them before the process ends
# regardless: Textual 8.2's shutdown writes its last output through a writer thread's bounded
# queue (LinuxDriver.close -> WriterThread.stop), and once the terminal is gone that wait was
# seen to last forever, with the demo's job left training.
EXIT_GRACE_S = 5.0


RECORD_POLL_S = 0.5  # while recording, drain (and so flush) at least this often: "at most a second"

DESCRIPTION = """\
top for PyTorch input pipelines: live DataLoader wait times, queue, workers, the machine,
and the bottleneck named.

commands:
  loadertop [ENDPOINT ...]              the live viewer (default: every instrumented process found)
  loadertop snapshot [--json] [--seconds S] [ENDPOINT ...]
                                        watch S seconds, print one report and exit
  loadertop snapshot --from FILE [--at S] [--json]
                                        the report as it stood S seconds into a recording
  loadertop record [-o FILE] [--seconds S] [--max-size SIZE] [ENDPOINT ...]
                                        record what the viewer receives to FILE (Ctrl-C stops)
  loadertop replay FILE                 a recording in the live viewer (space, arrows, < >)
  loadertop report FILE [-o OUT.html]   a self-contained HTML report with plots of a recording
  loadertop ls [--json]                 this user's live and ended jobs (their black boxes)
  loadertop run [--] COMMAND ...        run COMMAND with every DataLoader instrumented
  loadertop attach [--listen ENDPOINT] PID
                                        instrument a running job started without loadertop
  loadertop attach --detach PID         undo it
  loadertop tune [--workers LIST | --max-workers N] [--trial-seconds S] [--json] [--] COMMAND ...
                                        find the best num_workers for COMMAND by running it
  loadertop export [--listen HOST:PORT] [ENDPOINT ...]
                                        serve every source as Prometheus metrics (/metrics)
  loadertop demo                        a synthetic training job with the viewer on it
  loadertop keys [DIR]                  create a CurveZMQ key pair for remote viewing

ENDPOINT: tcp://HOST:PORT, HOST:PORT, ipc://PATH, or the pid of an instrumented process.
FILE: a recording, or `last` / the pid of a job in `loadertop ls` (its black box).
Instrument a loader with:  train = loadertop.instrument(DataLoader(...), name="train")
"""


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"loadertop {__version__}")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help="seconds between screen refreshes (default 1)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind each figure (default 3)")
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR=1)")
    p.add_argument("--once", action="store_true",
                   help="print one report instead of the live screen (also when not a terminal)")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S",
                   help="with --once: how long to watch (default 3)")
    p.add_argument("--record", metavar="FILE", default=None,
                   help="also record what is received to FILE (as `loadertop record` does)")
    p.add_argument("--max-size", metavar="SIZE", default=None,
                   help="with --record: stop recording at this size (e.g. 500M)")
    add_key_options(p)
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from loadertop import environment

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
        return run_app(sub, refresh_s=args.refresh, no_color=environment.no_color(args.no_color),
                       note=last_job_note(sub) if sub.discover else None)
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


LAST_JOB_RECHECK_S = 10.0  # how often the screen with no source looks at the state directory again


def last_job_note(sub: Subscriber, clock: Callable[[], float] | None = None) -> Callable[[], str | None]:
    """The header's note while no instrumented process runs: which job ended last and how
    (docs/contract.md §9), looked up again every LAST_JOB_RECHECK_S; nothing once a source shows."""
    import time

    from loadertop.commands.common import last_ended_line

    now = clock or time.monotonic
    line: str | None = None
    looked_at = -LAST_JOB_RECHECK_S

    def note() -> str | None:
        nonlocal line, looked_at
        if sub.model.sources:
            return None
        if now() - looked_at >= LAST_JOB_RECHECK_S:
            ended = last_ended_line()
            if ended:  # two lines, so how it ended and the command that opens it fit 80 columns
                who, _, how = ended.partition(" ago: ")
                line = (f"no instrumented process running; {who} ago:\n  {how}" if how
                        else f"no instrumented process running; {ended}")
            else:
                line = None
            looked_at = now()
        return line

    return note


def run_app(sub: Subscriber, *, refresh_s: float, no_color: bool,
            note: Callable[[], str | None] | None = None, poll_s: float | None = None,
            on_stuck: Callable[[], object] | None = None) -> int:
    """The TUI on `sub` until the user quits; the subscriber is closed afterwards.

    `note`: a line of context for the header, asked once per refresh (the demo's phase).
    SIGTERM and SIGHUP (a `kill`, a closed terminal) make the app exit as `q` does, so the
    terminal is left in order — and the demo, which runs this, gets to stop its job (or, where
    that exit hangs, `on_stuck` stops it: `run_until_exit`)."""
    from loadertop.client.subscriber import NetworkFeed
    from loadertop.tui.app import LoadertopApp

    feed = NetworkFeed(sub)
    try:
        extra: dict[str, Any] = {"poll_s": min(poll_s, refresh_s)} if poll_s is not None else {}
        run_until_exit(LoadertopApp(feed, refresh_s=refresh_s, no_color=no_color, note=note, **extra),
                       on_stuck)
    finally:
        feed.close()
    return 0


def run_until_exit(app: App[Any], on_stuck: Callable[[], object] | None = None,
                   grace_s: float = EXIT_GRACE_S) -> None:
    """Run a Textual app until the user quits; SIGTERM and SIGHUP (a `kill`, a closed terminal)
    make it exit as `q` does, so the terminal is left in order. Where that exit has not returned
    `grace_s` after the signal, a watchdog thread calls `on_stuck` (the demo stops its job there)
    and ends the process with 128 + the signal's number, as the signal's default would have."""
    import threading

    done = threading.Event()

    def give_up(signum: int) -> None:
        if done.wait(grace_s):
            return
        try:
            if on_stuck is not None:
                on_stuck()
        finally:
            os._exit(128 + signum)

    def exit_app(signum: int, frame: FrameType | None) -> None:
        if not done.is_set():
            threading.Thread(target=give_up, args=(signum,), name="loadertop-exit-watchdog",
                             daemon=True).start()
        app.exit()

    previous = {s: signal.signal(s, exit_app) for s in EXIT_SIGNALS}
    try:
        app.run()
    finally:
        done.set()
        for s, handler in previous.items():
            signal.signal(s, handler)
