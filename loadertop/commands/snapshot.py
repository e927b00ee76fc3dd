"""`loadertop snapshot`: watch S seconds, print one report or the JSON document, exit."""

from __future__ import annotations

import sys
import time

from loadertop.client.document import Document
from loadertop.commands import UsageError
from loadertop.commands.common import add_key_options, no_sources_message, open_subscriber, print_error, watch

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse



def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop snapshot",
        description="Watch for S seconds, print one report (or the JSON document) and exit.")
    p.add_argument("endpoints", nargs="*", metavar="ENDPOINT")
    p.add_argument("--json", action="store_true", help="print the loadertop.snapshot/1 document")
    p.add_argument("--seconds", type=float, default=3.0, metavar="S",
                   help="watch this long (default 3); with --from: the window before the point")
    p.add_argument("--from", dest="from_file", metavar="FILE", default=None,
                   help="read a recording (`loadertop record`) instead of live endpoints; `last` "
                        "or a pid: that job's black box (`loadertop ls`)")
    p.add_argument("--at", type=float, default=None, metavar="S",
                   help="with --from: S seconds into the recording (negative: before its end; "
                        "default: the end)")
    add_key_options(p)
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def take(endpoint_args: list[str], seconds: float, *, key: str | None = None,
         server_key: str | None = None, last_job: bool = False) -> tuple[Document, str | None]:
    """(the document, None), or (a document with no source, the error message) when no source
    delivered: with `last_job`, and with discovery, that document names the job that ended last
    as `ls --json` does (docs/contract.md §3).

    The whole window is watched even when no process has registered yet: a job registers at its
    first instrumented iter(), seconds after it starts (import torch, the dataset), so a snapshot
    started beside it (a script, CI) would otherwise find nothing. Discovery keeps looking during
    the window, and each source is reported from the moment it appeared; only a window in which
    no process appeared at all says that none was found."""
    sub = open_subscriber(endpoint_args, window_s=seconds, key=key, server_key=server_key)
    try:
        watch(sub, seconds)
        doc = sub.model.advance(time.time())
        if doc.sources:
            return doc, None
        if not sub.found_any():
            error = no_sources_message(sub)
        else:
            deaths = sub.silent_deaths()  # its process died (SIGKILL leaves the entry behind)
            error = "; ".join(deaths) if deaths else (
                "no data received from " + ", ".join(sub.sockets) +
                f" within {seconds:g} s (is the trainer running and iterating an instrumented loader?)")
        if last_job and sub.discover:
            import msgspec

            from loadertop.commands.ls import last_ended

            doc = msgspec.structs.replace(doc, last_job=last_ended())
        return doc, error
    finally:
        sub.close()


def from_recording(path: str, at: float | None, window_s: float, *,
                   heading: list[str] | None = None) -> tuple[Document | None, str | None]:
    """(the document at `at` seconds into the recording (negative: before its end; None: the
    end), None) or (None, error message). `heading`, when given, receives what the view of a
    job's black box leads with (how it ended, the findings of its last minutes)."""
    from loadertop.commands.common import open_playback

    playback = open_playback(path, window_s)
    if playback is None:
        return None, None  # already said
    if heading is not None:
        from loadertop.recording.blackbox import JobRecording, postmortem_lines

        if isinstance(playback.recording, JobRecording):
            heading.extend(postmortem_lines(playback.recording, playback))
    length = playback.end - playback.start
    if at is None:
        t = playback.end
    else:
        offset = at if at >= 0 else length + at
        if not 0 <= offset <= length + 1e-6:
            return None, (f"--at {at:g}: the recording is {length:.1f} s long "
                          f"(give 0..{length:.1f}, or a negative offset from its end)")
        t = playback.start + offset
    return playback.document_at(t), None


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        print_error("--seconds must be positive")
        return 2
    if args.at is not None and args.from_file is None:
        print_error("--at needs --from FILE")
        return 2
    if args.from_file is not None:
        if args.endpoints:
            print_error("--from FILE reads a recording: give no ENDPOINT with it")
            return 2
        heading: list[str] = []
        doc, error = from_recording(args.from_file, args.at, args.seconds,
                                    heading=None if args.json else heading)
        if doc is None:
            if error:
                print_error(error)
            return 1
        if heading:  # an ended job's black box: its end leads (docs/contract.md §9)
            sys.stdout.write("\n".join(heading) + "\n\n")
        return _print(doc, args.json)
    return report_live(args.endpoints, args.seconds, as_json=args.json, key=args.key,
                       server_key=args.server_key)


def report_live(endpoint_args: list[str], seconds: float, *, as_json: bool, key: str | None = None,
                server_key: str | None = None) -> int:
    """Watch the endpoints for `seconds` and print the report (or the JSON document): `snapshot`,
    and the viewer's `--once` (or its output not a terminal), which has none of snapshot's
    recording options."""
    try:
        doc, error = take(endpoint_args, seconds, key=key, server_key=server_key, last_job=as_json)
    except UsageError as exc:
        print_error(str(exc))
        return 2
    if error is not None:
        print_error(error)
        if as_json:  # a script still gets a document: no source, and the last job's end
            _print(doc, as_json)
        return 1
    return _print(doc, as_json)


def _print(doc: Document, as_json: bool) -> int:
    from loadertop.views.text import render_json, render_text

    sys.stdout.write(render_json(doc) + "\n" if as_json else render_text(doc))
    return 0
