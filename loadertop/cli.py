"""Command line: argument parsing and dispatch only; each subcommand lives in its own module.

Imports are lazy so `loadertop --help` and `--version` answer at once (no torch, no textual).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from loadertop._version import __version__

SUBCOMMANDS = ("snapshot", "run", "tune", "demo", "keys", "export")

DESCRIPTION = """\
top for PyTorch input pipelines: live DataLoader wait times, queue, workers, the machine,
and the bottleneck named.

commands:
  loadertop [ENDPOINT ...]              the live viewer (default: every instrumented process found)
  loadertop snapshot [--json] [--seconds S] [ENDPOINT ...]
                                        watch S seconds, print one report and exit
  loadertop run [--] COMMAND ...        run COMMAND with every DataLoader instrumented
  loadertop tune [--workers LIST | --max-workers N] [--trial-seconds S] [--json] [--] COMMAND ...
                                        find the best num_workers for COMMAND by running it
  loadertop export [--listen HOST:PORT] [ENDPOINT ...]
                                        serve every source as Prometheus metrics (/metrics)
  loadertop demo                        a synthetic training job with the viewer on it
  loadertop keys [DIR]                  create a CurveZMQ key pair for remote viewing

ENDPOINT: tcp://HOST:PORT, HOST:PORT, ipc://PATH, or the pid of an instrumented process.
Instrument a loader with:  train = loadertop.instrument(DataLoader(...), name="train")
"""


def _viewer_parser() -> argparse.ArgumentParser:
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
    _add_key_options(p)
    return p


def _snapshot_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadertop snapshot",
        description="Watch for S seconds, print one report (or the JSON document) and exit.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--json", action="store_true", help="print the loadertop.snapshot/1 document")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S", help="watch this long (default 3)")
    _add_key_options(p)
    return p


def _export_parser() -> argparse.ArgumentParser:
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
    _add_key_options(p)
    return p


def _add_key_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", metavar="FILE", default=None,
                   help="this viewer's secret key file (CurveZMQ), from `loadertop keys`")
    p.add_argument("--server-key", metavar="FILE", default=None,
                   help="the trainer's public key file (CurveZMQ)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _dispatch(argv)
        finally:  # argparse's --help and usage errors leave by SystemExit: flush for them too
            sys.stdout.flush()  # here, where a closed pipe can still be answered in order
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`loadertop snapshot | head`): what it wanted it has. Point stdout
        # at /dev/null so that the interpreter's own flush at exit does not raise again (the
        # recipe of Python's signal module documentation), and exit as a writer killed by
        # SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        command, rest = argv[0], argv[1:]
        if command == "snapshot":
            from loadertop.commands import snapshot

            return snapshot.main(_snapshot_parser().parse_args(rest))
        if command == "run":
            from loadertop.commands import run

            return run.main(rest)
        if command == "tune":
            from loadertop.commands import tune

            return tune.main(rest)
        if command == "demo":
            from loadertop.commands import demo

            return demo.main(rest)
        if command == "keys":
            from loadertop.commands import keys

            return keys.main(rest)
        if command == "export":
            from loadertop.commands import export

            return export.main(_export_parser().parse_args(rest))
    args = _viewer_parser().parse_args(argv)
    from loadertop.commands import view

    return view.main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
