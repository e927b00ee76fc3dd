"""`loadertop export [--listen HOST:PORT] [--per-worker] [--tensorboard DIR] [ENDPOINT ...]`: the
sources as Prometheus metrics, as TensorBoard scalars, or both.

A headless viewer, one per machine like node_exporter: the same discovery and endpoints as the
TUI, serving `/metrics` (docs/contract.md §8) and/or writing TensorBoard runs under DIR
(docs/contract.md §11) until SIGINT or SIGTERM (exit 0; the TensorBoard files written once more
and closed). `--tensorboard` alone writes only those; with `--listen` too, both. A --listen that
cannot be served on (in use, not an address of this machine) is one line on stderr and exit 2; a
TensorBoard directory that cannot be written is one line, and the rest goes on.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from loadertop.commands import UsageError
from loadertop.commands.common import add_key_options, open_subscriber, print_error

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse
    from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TENSORBOARD_EVERY_S = 5.0  # as tensorboard.WRITE_EVERY_S, without importing it for --help


def parser() -> argparse.ArgumentParser:
    import argparse

    from loadertop.exporter import DEFAULT_LISTEN  # the package alone: no prometheus_client

    p = argparse.ArgumentParser(
        prog="loadertop export",
        description="Serve every instrumented process found (or the ENDPOINTs given) as "
                    "Prometheus metrics on http://HOST:PORT/metrics, and/or write them as "
                    "TensorBoard scalars, until interrupted.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"where to serve /metrics (default {DEFAULT_LISTEN}, unless only "
                        "--tensorboard is given; *:PORT for every interface, which prints a "
                        "warning; port 0: any free one)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind the gauges (default 3)")
    p.add_argument("--per-worker", action="store_true",
                   help="serve the workers' series and findings per worker (a `worker` label) "
                        "instead of one per loader")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="write each source's figures as TensorBoard scalars, one run per source "
                        "(DIR/HOST-PID-LOADER); without --listen, nothing is served")
    p.add_argument("--tensorboard-every", type=float, default=TENSORBOARD_EVERY_S, metavar="S",
                   help=f"seconds between two TensorBoard points of a source, each flushed to "
                        f"disk (default {TENSORBOARD_EVERY_S:g})")
    add_key_options(p)
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        from loadertop.exporter import server
    except ImportError as exc:  # prometheus_client is a dependency; a --no-deps install lacks it
        print_error(f"loadertop export needs prometheus_client ({exc.name} is missing): "
                    "pip install prometheus_client")
        return 2
    from loadertop.exporter import DEFAULT_LISTEN

    if args.window <= 0:
        print_error("--window must be positive")
        return 2
    if args.tensorboard_every <= 0:
        print_error("--tensorboard-every must be positive")
        return 2
    if args.tensorboard == "":
        print_error("--tensorboard needs a directory")
        return 2
    listen = DEFAULT_LISTEN if args.listen is None else args.listen
    address = None
    if args.listen is not None or args.tensorboard is None:  # --tensorboard alone serves nothing
        try:
            address = server.parse_listen(listen)
        except server.ListenError as exc:
            print_error(str(exc))
            return 2
    try:
        sub = open_subscriber(args.endpoints, window_s=args.window, key=args.key,
                              server_key=args.server_key, drop_vanished=True)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    try:
        exporter = server.Exporter(sub)
        metrics = None
        if address is not None:
            try:
                metrics = server.MetricsServer(exporter.latest, address,
                                               per_worker=args.per_worker)
                exporter.after_advance = metrics.exposition.prepare
                exporter.next_scrape = metrics.exposition.next_scrape
            except OSError as exc:
                print_error(f"cannot listen on {listen}: {exc.strerror or exc}")
                return 2
        board = None
        if args.tensorboard is not None:
            from loadertop.exporter.tensorboard import TensorBoardWriter

            board = TensorBoardWriter(Path(args.tensorboard), exporter.latest,
                                      every_s=args.tensorboard_every)
        watching = (f"every instrumented process in {sub.directory}" if sub.discover
                    else ", ".join(sub.sockets))
        doing = []
        if metrics is not None:
            # Beyond loopback it says so (the warning the trainer's endpoint gives too): anyone
            # who reaches the port sees every job on this machine.
            beyond = ", reachable beyond this machine" if not metrics.address.loopback else ""
            doing.append(f"serving {metrics.url()}{beyond}")
        if board is not None:
            doing.append(f"writing TensorBoard runs to {args.tensorboard} every "
                         f"{args.tensorboard_every:g} s")
        print_error(f"{' and '.join(doing)} ({watching})")  # one line
        sys.stderr.flush()
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS}
        if metrics is not None:
            metrics.start()
        if board is not None:
            board.start()
        try:
            exporter.run(stop)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if board is not None:
                board.close()  # what was watched up to the end, on disk
            if metrics is not None:
                metrics.close()
    finally:
        sub.close()
    return 0
