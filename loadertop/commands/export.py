"""`loadertop export [--listen HOST:PORT] [--per-worker] [ENDPOINT ...]`: the sources as Prometheus
metrics.

A headless viewer, one per machine like node_exporter: the same discovery and endpoints as the
TUI, serving `/metrics` until SIGINT or SIGTERM (exit 0). A --listen that cannot be served on (in
use, not an address of this machine) is one line on stderr and exit 2.
"""

from __future__ import annotations

import signal
import sys
import threading

from loadertop.commands import UsageError
from loadertop.commands.common import add_key_options, open_subscriber, print_error

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse
    from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parser() -> argparse.ArgumentParser:
    import argparse

    from loadertop.exporter import DEFAULT_LISTEN  # the package alone: no prometheus_client

    p = argparse.ArgumentParser(
        prog="loadertop export",
        description="Serve every instrumented process found (or the ENDPOINTs given) as "
                    "Prometheus metrics on http://HOST:PORT/metrics, until interrupted.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where to serve /metrics (default {DEFAULT_LISTEN}; *:PORT for every "
                        "interface, which prints a warning; port 0: any free one)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind the gauges (default 3)")
    p.add_argument("--per-worker", action="store_true",
                   help="serve the workers' series and findings per worker (a `worker` label) "
                        "instead of one per loader")
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
    if args.window <= 0:
        print_error("--window must be positive")
        return 2
    try:
        address = server.parse_listen(args.listen)
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
        try:
            metrics = server.MetricsServer(exporter.latest, address, per_worker=args.per_worker)
            exporter.after_advance = metrics.exposition.prepare
            exporter.next_scrape = metrics.exposition.next_scrape
        except OSError as exc:
            print_error(f"cannot listen on {args.listen}: {exc.strerror or exc}")
            return 2
        watching = (f"every instrumented process in {sub.directory}" if sub.discover
                    else ", ".join(sub.sockets))
        # One line either way; beyond loopback it says so (the warning the trainer's endpoint
        # gives too): anyone who reaches the port sees every job on this machine.
        beyond = ", reachable beyond this machine" if not address.loopback else ""
        print_error(f"serving {metrics.url()}{beyond} ({watching})")
        sys.stderr.flush()
        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS}
        metrics.start()
        try:
            exporter.run(stop)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            metrics.close()
    finally:
        sub.close()
    return 0
