"""`loadertop tune [--workers LIST | --max-workers N] [--trial-seconds S] [--json] [--] COMMAND ...`

Thin: parses the options, runs `loadertop.tuning.session.tune`, prints the report or the
document. The trials, the strategy and the output live in `loadertop.tuning`.

SIGINT (Ctrl-C, `kill -INT`) always stops tune with 130 and what was measured, also when tune
was started with SIGINT ignored (a non-interactive shell's `loadertop tune ... &`: Python keeps an
inherited SIG_IGN, and the interrupt would be lost); `loadertop run` forwards it in the same case.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadertop.tuning.session import TuneResult

USAGE_EPILOG = """\
examples:
  loadertop tune -- python train.py --epochs 100
  loadertop tune --workers 0,2,4,8 --trial-seconds 20 -- python train.py
  loadertop tune --json -- torchrun --nproc-per-node 2 train.py > tune.json

Each trial runs COMMAND with every DataLoader's num_workers set (nothing in your files changes),
measures the main loader's samples/s after a warm-up, then ends the program (SIGTERM to its
process group, SIGKILL after 3 s). Default search: from a quarter of the cores, two more workers
a trial, until a trial gains less than 5 % or memory runs short; then ±1 around the best.
Exit: 0 with a recommendation, 1 when nothing could be measured (no DataLoader), 2 when COMMAND
cannot start, 130 after Ctrl-C (what was measured is printed).
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="loadertop tune", usage="loadertop tune [OPTIONS] [--] COMMAND [ARG ...]",
        description="Find the num_workers that gives COMMAND's main DataLoader the most samples/s "
                    "for the fewest workers, by running it.",
        epilog=USAGE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--workers", metavar="LIST", type=worker_list, default=None,
                       help="run exactly these counts, e.g. 0,2,4 (no search)")
    which.add_argument("--max-workers", metavar="N", type=non_negative_int, default=None,
                       help="the search never goes above N (default: 4 per core available)")
    p.add_argument("--trial-seconds", metavar="S", type=positive_float, default=10.0,
                   help="the measurement of each trial, after its warm-up (default 10)")
    p.add_argument("--start-seconds", metavar="S", type=positive_float, default=60.0,
                   help="how long a trial may take to its first batch (default 60)")
    p.add_argument("--json", action="store_true", help="print the loadertop.tune/1 document")
    p.add_argument("--no-color", action="store_true", help="no colours in the plot (also: NO_COLOR=1)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND",
                   help="the training program and its arguments")
    return p


def worker_list(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {text!r} (e.g. 0,2,4)") from None
    if not counts or any(c < 0 for c in counts):
        raise argparse.ArgumentTypeError(f"not a list of counts >= 0: {text!r} (e.g. 0,2,4)")
    return tuple(dict.fromkeys(counts))  # in the given order, each once


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("loadertop tune: no command given (e.g. loadertop tune -- python train.py)",
              file=sys.stderr)
        return 2

    from loadertop.tuning.output import StderrProgress
    from loadertop.tuning.session import TuneOptions, tune
    from loadertop.tuning.trial import CannotStart, TrialSettings

    options = TuneOptions(listed=args.workers, max_workers=args.max_workers,
                          settings=TrialSettings(trial_s=args.trial_seconds,
                                                 start_s=args.start_seconds))
    interrupts = threading.current_thread() is threading.main_thread()
    # SIGINT raises KeyboardInterrupt during the trials whatever tune inherited, SIG_IGN included
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if interrupts else None
    try:
        result = tune(command, options, StderrProgress(command))
    except CannotStart as exc:
        print(f"loadertop tune: {exc}", file=sys.stderr)
        return 2
    finally:
        if interrupts and previous is not None:
            signal.signal(signal.SIGINT, previous)
    _print(result, args)
    return result.exit_code


def _print(result: TuneResult, args: argparse.Namespace) -> None:
    from loadertop import environment

    if args.json:
        from loadertop.tuning.document import encode_json

        sys.stdout.write(encode_json(result.document).decode() + "\n")
    else:
        from loadertop.tuning.output import render_report

        color = sys.stdout.isatty() and not environment.no_color(args.no_color)
        sys.stdout.write(render_report(result.document, color=color))
    if result.error:
        print(f"loadertop tune: {result.error}", file=sys.stderr)
