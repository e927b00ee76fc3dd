"""What the viewer commands share: the key options, turning ENDPOINT arguments into a live
Subscriber, reading a recording, and the one-line error."""

from __future__ import annotations

import os
import sys
import time

from loadertop.commands import UsageError

TYPE_CHECKING = False  # not typing's: `loadertop --help` builds its parser with this module
if TYPE_CHECKING:
    import argparse

    from loadertop.client.ending import Ending
    from loadertop.client.subscriber import Subscriber
    from loadertop.recording.file import Recording
    from loadertop.recording.playback import Playback


def add_key_options(p: argparse.ArgumentParser) -> None:
    """--key and --server-key: the viewer, snapshot, record and export watch over CurveZMQ alike."""
    p.add_argument("--key", metavar="FILE", default=None,
                   help="this viewer's secret key file (CurveZMQ), from `loadertop keys`")
    p.add_argument("--server-key", metavar="FILE", default=None,
                   help="the trainer's public key file (CurveZMQ)")


def open_subscriber(endpoint_args: list[str], *, window_s: float = 3.0, key: str | None = None,
                    server_key: str | None = None, drop_vanished: bool = False) -> Subscriber:
    from loadertop import discovery
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber
    from loadertop.endpoints import EndpointError, resolve

    directory = discovery.discovery_dir()
    try:
        endpoints = [resolve(e, directory) for e in endpoint_args]
    except EndpointError as exc:
        raise UsageError(str(exc)) from None
    curve = None
    if key or server_key:
        from loadertop.remote import curve_client_options

        try:
            curve = curve_client_options(key, server_key)
        except (OSError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    from loadertop.recording.blackbox import BlackBoxHistory

    model = Model(window_s=window_s)
    # A source starts from its job's black box, and one that dies is said to (docs/contract.md §9).
    return Subscriber(model, endpoints, directory=directory, curve=curve,
                      drop_vanished=drop_vanished, history=BlackBoxHistory())


def no_sources_message(sub: Subscriber) -> str:
    if sub.discover:
        last = last_ended_line()
        if last is not None:  # docs/contract.md §9: say which job ended last and how
            return f"no instrumented process running; {last}"
        return (f"no instrumented process found in {sub.directory}\n"
                "  wrap a loader with loadertop.instrument(loader), run `loadertop run -- python train.py`,\n"
                "  or give an endpoint: loadertop tcp://HOST:PORT")
    return ("no data received from " + ", ".join(sub.sockets) +
            " (is the trainer running, and publishing there?)")


def last_ended_line() -> str | None:
    """The black box's line on the job that ended last (None without one); a state directory
    that cannot be read never stands in the way of the message it adds to."""
    from loadertop.recording.blackbox import last_ended_line as line

    try:
        return line()
    except (OSError, ValueError):
        return None


def watch(sub: Subscriber, seconds: float) -> None:
    """Receive for `seconds`, waking on data (no fixed sleeps)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sub.poll(timeout_ms=min(left, 0.1) * 1000)


def print_error(message: str) -> None:
    print(f"loadertop: {message}", file=sys.stderr)


def load_recording(path: str) -> tuple[Recording, None] | tuple[None, str]:
    """(Recording, None) with at least one frame, or (None, the one-line error). The notes on what
    could not be read (a torn tail) go to stderr: the rest is still shown.

    `path` may also be `last` or a pid (docs/contract.md §9): that job's black box, its segments
    merged, where no file of that name exists."""
    from loadertop import statedir
    from loadertop.recording.file import RecordingError, read

    if statedir.is_job_spec(path) and not os.path.exists(path):  # a file of that name is the file
        from loadertop.recording import blackbox

        try:
            job = blackbox.resolve(path)
            recording = blackbox.read_job(job)
        except blackbox.JobError as exc:
            return None, str(exc)
        for note in recording.notes:
            print_error(f"pid {job.pid}: {note}")
        if not recording.frames:  # how it ended is still worth saying
            return None, (f"pid {job.pid} ({blackbox.command_of(job)}) ended: "
                          f"{blackbox.ending_of(job, recording).text}; its black box holds no "
                          "messages (it ended before its first report)")
        return recording, None
    try:
        from_file = read(path)
    except RecordingError as exc:
        return None, str(exc)
    for note in from_file.notes:
        print_error(f"{path}: {note}")
    if not from_file.frames:
        return None, f"{path}: the recording holds no messages (nothing was received while it ran)"
    return from_file, None


def playback_of(recording: Recording, window_s: float) -> Playback | None:
    """A Playback of `recording`, or None (with the line printed) when no source is in it."""
    from loadertop import wire
    from loadertop.recording.playback import Playback

    readable = 0
    for frame in recording.frames:
        try:
            msg = wire.decode(frame.frame)
        except wire.WireError:
            continue
        readable += 1
        if isinstance(msg, wire.LoaderReport):
            return Playback(recording, window_s=window_s, ending=job_ending(recording))
    if not readable:
        print_error(f"{recording.path}: none of its {len(recording.frames)} messages is readable by "
                    f"this loadertop (wire schema {wire.SCHEMA_VERSION}; recorded by loadertop "
                    f"{recording.header.loadertop_version or '?'})")
    else:
        print_error(f"{recording.path}: the recording holds no loader (only machine figures): "
                    "no instrumented loader was iterating while it ran")
    return None


def job_ending(recording: Recording) -> tuple[int, Ending] | None:
    """(pid, how it ended) when `recording` is an ended job's black box (docs/contract.md §9),
    for a Playback to end its sources with."""
    from loadertop.recording.blackbox import JobRecording, ending_of

    if not isinstance(recording, JobRecording) or recording.job is None:
        return None
    ending = ending_of(recording.job, recording)
    return None if ending.kind == "running" else (recording.job.pid, ending)


def open_playback(path: str, window_s: float) -> Playback | None:
    """The Playback of the recording at `path`, or None once the reason is printed (one line;
    notes on a torn tail first)."""
    loaded = load_recording(path)
    if loaded[0] is None:
        print_error(loaded[1])
        return None
    return playback_of(loaded[0], window_s)
