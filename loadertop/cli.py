"""Command line: argument parsing and dispatch only; each subcommand lives in its own module.

Imports are lazy so `loadertop --help` and `--version` answer at once (no torch, no textual).
"""

from __future__ import annotations

import os
import signal
import sys

from loadertop._version import __version__

TYPE_CHECKING = False  # not typing's: importing typing costs `run` ~5 ms where nothing else does
if TYPE_CHECKING:
    import argparse  # imported by each parser below: `run` and `tune` parse their own arguments,
    # and `run` starts before the job, whose start-up it delays (argparse + gettext: ~1.8 ms)

SUBCOMMANDS = ("snapshot", "run", "attach", "tune", "record", "replay", "report", "export", "demo",
               "keys")

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
Instrument a loader with:  train = loadertop.instrument(DataLoader(...), name="train")
"""


def _viewer_parser() -> argparse.ArgumentParser:
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
    _add_key_options(p)
    return p


def _record_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop record",
        description="Record every message a viewer receives (with its receive time) to FILE, "
                    "until Ctrl-C, SIGTERM, --seconds or --max-size. Watch it later with "
                    "`loadertop replay FILE`, `loadertop snapshot --from FILE` or `loadertop report FILE`.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="where to write (default: loadertop-DATE-TIME.ltrec here); never overwritten")
    p.add_argument("--seconds", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--max-size", metavar="SIZE", default=None,
                   help="stop before the file passes SIZE (bytes, or 500K, 200M, 2G)")
    _add_key_options(p)
    return p


def _replay_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop replay",
        description="Play a recording in the live viewer: space pause, ←/→ seek 10 s (shift: 60 s), "
                    "home/end, </> speed. The verdicts are today's loadertop's, from the recorded messages.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="playback speed (default 1)")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help="seconds between screen refreshes (default 1)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind each figure (default 3)")
    p.add_argument("--no-color", action="store_true", help="no colours (also: NO_COLOR=1)")
    return p


def _report_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop report",
        description="Write one self-contained HTML file (opens offline) with plots of a recording "
                    "over time, its findings and its final summary: something to attach to a bug report.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-o", "--output", metavar="OUT.html", default=None,
                   help="where to write (default: FILE with .html)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind each plotted figure (default 3)")
    return p


def _snapshot_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop snapshot",
        description="Watch for S seconds, print one report (or the JSON document) and exit.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--json", action="store_true", help="print the loadertop.snapshot/1 document")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S",
                   help="watch this long (default 3); with --from: the window before the point")
    p.add_argument("--from", dest="from_file", metavar="FILE", default=None,
                   help="read a recording (`loadertop record`) instead of live endpoints")
    p.add_argument("--at", type=float, default=None, metavar="S",
                   help="with --from: S seconds into the recording (negative: before its end; "
                        "default: the end)")
    _add_key_options(p)
    return p


def _attach_parser() -> argparse.ArgumentParser:
    import argparse

    from loadertop.attach import EXIT_CODES

    codes = ", ".join(f"{code} {kind}" for kind, code in EXIT_CODES.items())
    p = argparse.ArgumentParser(
        prog="loadertop attach",
        description="Instrument the DataLoaders of a running training process that was started "
                    "without loadertop, from their next batch on (needs ptrace permission over "
                    "PID, and gdb below Python 3.14); --detach undoes it. Watch it with "
                    "`loadertop` or `loadertop snapshot`.",
        epilog=f"exit codes: 0 done, 2 usage, {codes}")
    p.add_argument("pid", type=int, metavar="PID")
    p.add_argument("--detach", action="store_true",
                   help="restore the original methods, say goodbye, stop the publisher thread")
    p.add_argument("--listen", metavar="ENDPOINT", default=None, type=_listen_endpoint,
                   help="publish on ENDPOINT (tcp://HOST:PORT, HOST:PORT or PORT) instead of a "
                        "private socket in the discovery directory")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="how long the job's main thread may take to reach Python code (default 10)")
    return p


def _listen_endpoint(text: str) -> str:
    import argparse

    from loadertop import endpoints

    try:
        return str(endpoints.parse_listen(text))
    except endpoints.EndpointError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _export_parser() -> argparse.ArgumentParser:
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
        if command == "attach":
            from loadertop.commands import attach

            return attach.main(_attach_parser().parse_args(rest))
        if command == "tune":
            from loadertop.commands import tune

            return tune.main(rest)
        if command == "record":
            from loadertop.commands import record

            return record.main(_record_parser().parse_args(rest))
        if command == "replay":
            from loadertop.commands import replay

            return replay.main(_replay_parser().parse_args(rest))
        if command == "report":
            from loadertop.commands import report

            return report.main(_report_parser().parse_args(rest))
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
