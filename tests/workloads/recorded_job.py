"""Whether a job's black box holds a report yet: what a test (or a test's job) waits for before it
ends the job, so the job's view has something to show — polled, never a fixed wait."""

from __future__ import annotations

from pathlib import Path

from loadertop import statedir, wire
from loadertop.recording import blackbox


def holds_a_report(pid: int, directory: Path | None = None) -> bool:
    """The black box of the job of `pid` (in `directory`, default the state directory) holds a
    report of a loader (its thread flushes every 2 s)."""
    job = statedir.find_job(str(pid), directory)
    if job is None or not job.recordings:
        return False
    try:
        frames = blackbox.read_job(job).frames
    except blackbox.JobError:
        return False
    return any(isinstance(wire.decode(f.frame), wire.LoaderReport) for f in frames)
