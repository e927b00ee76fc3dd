"""`loadertop report FILE [-o OUT.html]`: a recording as one self-contained HTML page
(`loadertop.recording.report`)."""

from __future__ import annotations

import os
import sys
import time

from loadertop.commands.common import open_playback, print_error

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop report",
        description="Write one self-contained HTML file (opens offline) with plots of a recording "
                    "over time, its findings and its final summary: something to attach to a bug report.")
    p.add_argument("file", metavar="FILE", help="a recording, or `last` / a pid: that job's black box")
    p.add_argument("-o", "--output", metavar="OUT.html", default=None,
                   help="where to write (default: FILE with .html)")
    p.add_argument("--window", type=float, default=3.0, metavar="S",
                   help="seconds of history behind each plotted figure (default 3)")
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def output_path(recording_path: str, output: str | None) -> str:
    """-o as given, or the recording's name with .html for its extension."""
    if output:
        return output
    root, ext = os.path.splitext(recording_path)
    return (root if ext != ".html" else recording_path) + ".html"


def run(args: argparse.Namespace) -> int:
    from loadertop.recording.plots import PlottingUnavailable, require_matplotlib

    if args.window <= 0:
        print_error("--window must be positive")
        return 2
    try:
        require_matplotlib()  # before reading what may be a large file
    except PlottingUnavailable as exc:
        print_error(str(exc))
        return 1
    out = output_path(args.file, args.output)
    if os.path.exists(out) and os.path.exists(args.file) and os.path.samefile(out, args.file):
        print_error(f"{out}: that is the recording itself; give another -o OUT.html")
        return 2
    playback = open_playback(args.file, args.window)
    if playback is None:
        return 1
    recording = playback.recording
    from loadertop.recording.blackbox import JobRecording, postmortem_lines
    from loadertop.recording.report import build

    started = time.monotonic()
    # An ended job's black box (`report last`): the page leads with its end (docs/contract.md §9).
    lead = postmortem_lines(recording, playback) if isinstance(recording, JobRecording) else []
    page = build(recording, playback, lead).encode("utf-8")
    existed = os.path.exists(out)
    # Written beside and renamed: a reader (a browser reloading it) never sees half a page.
    partial = f"{out}.{os.getpid()}.tmp"
    try:
        with open(partial, "wb") as f:
            f.write(page)
        os.replace(partial, out)
    except OSError as exc:
        try:
            os.unlink(partial)
        except OSError:
            pass
        print_error(f"{out}: cannot write the report ({exc.strerror or exc})")
        return 1
    from loadertop.commands.record import size_text

    print(f"loadertop: wrote {out} ({size_text(len(page))}, {recording.duration_s:.0f} s of "
          f"recording in {time.monotonic() - started:.1f} s)"
          + ("; it replaced the file that was there" if existed else ""), file=sys.stderr)
    return 0
