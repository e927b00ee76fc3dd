"""`loadertop record [-o FILE] [--seconds S] [--max-size SIZE] [ENDPOINT ...]`: what a viewer
would receive, to a file (`loadertop.recording.file`), until Ctrl-C, SIGTERM, S seconds or SIZE."""

from __future__ import annotations

import os
import signal
import sys
import time

from loadertop.commands import UsageError
from loadertop.commands.common import add_key_options, open_subscriber, print_error

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse
    from types import FrameType

    from loadertop.recording.file import RecordingWriter

POLL_S = 0.1  # the receive loop's longest wait: the writer flushes within FLUSH_S of it
PROGRESS_S = 1.0
# SIGINT too, explicitly: a recorder started in the background by a shell (`loadertop record &`)
# inherits SIGINT ignored, and `kill -INT` should still stop it cleanly, with its end mark.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def parser() -> argparse.ArgumentParser:
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
    add_key_options(p)
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def parse_size(text: str) -> int:
    """`--max-size`: bytes, or with K, M, G (powers of 1024; an optional B or iB)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = 1
    if t and t[-1] in "KMG":
        factor = 1024 ** ("KMG".index(t[-1]) + 1)
        t = t[:-1]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"--max-size: {text!r} is not a size (e.g. 500M, 2G, 100000)") from None
    if value <= 0:
        raise UsageError("--max-size must be positive")
    return int(value * factor)


def open_writer(path: str, max_size: str | None, argv: list[str]) -> RecordingWriter:
    """A RecordingWriter at `path`, or UsageError with one line (exists, no such directory ...)."""
    from loadertop.recording.file import RecordingWriter

    max_bytes = parse_size(max_size) if max_size is not None else None
    try:
        return RecordingWriter(path, argv=argv, max_bytes=max_bytes)
    except FileExistsError:
        raise UsageError(f"{path} exists: not overwriting it (give another -o FILE)") from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def size_text(n: int) -> str:
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("kB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def run(args: argparse.Namespace) -> int:
    from loadertop.recording.file import default_name

    if args.seconds is not None and args.seconds <= 0:
        print_error("--seconds must be positive")
        return 2
    path = args.output or default_name()
    try:
        writer = open_writer(path, args.max_size, ["loadertop", "record", *sys.argv[2:]])
    except UsageError as exc:
        print_error(str(exc))
        return 2
    try:
        sub = open_subscriber(args.endpoints, window_s=3.0, key=args.key, server_key=args.server_key)
    except UsageError as exc:
        writer.close()
        os.unlink(path)  # nothing was recorded: leave no empty file behind
        print_error(str(exc))
        return 2
    sub.recorder = writer
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    where = ", ".join(sub.sockets) if not sub.discover else f"every instrumented process in {sub.directory}"
    print(f"loadertop: recording {where} to {path} (Ctrl-C stops)", file=sys.stderr)
    started = time.monotonic()
    deadline = started + args.seconds if args.seconds is not None else None
    reason = "stopped"
    progress = sys.stderr.isatty()
    next_progress = started + PROGRESS_S
    try:
        while not stopping:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                reason = "seconds"
                break
            sub.poll(timeout_ms=POLL_S * 1000)
            if writer.full:
                reason = "max_size"
                break
            if progress and now >= next_progress:
                next_progress = now + PROGRESS_S
                print(f"\r  {writer.frames} messages, {len(sub.model.sources)} sources, "
                      f"{size_text(writer.written)}, {now - started:.0f} s ", end="", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sub.close()
        writer.close(reason)
    if progress:
        print(file=sys.stderr)
    sources = len(sub.model.sources)
    if reason == "max_size":
        print_error(f"stopped at --max-size {args.max_size}")
    print(f"loadertop: recorded {writer.frames} messages from {sources} "
          f"source{'s' if sources != 1 else ''} in {time.monotonic() - started:.1f} s to {path} "
          f"({size_text(writer.written)})", file=sys.stderr)
    if writer.frames == 0:
        print_error(f"nothing was received: {path} holds no messages")
        return 1
    return 0
