"""`loadertop ls [--json]`: this user's live and ended jobs from their black boxes
(docs/contract.md §9), newest first."""

from __future__ import annotations

import sys
import time

from loadertop.commands.common import print_error

TYPE_CHECKING = False  # not typing's, as in the other commands
if TYPE_CHECKING:
    import argparse

    from loadertop import statedir
    from loadertop.client.document import JobSummary, WorstFinding
    from loadertop.client.ending import Ending
    from loadertop.recording.file import Recording

#: The worst finding is judged on the last this-many seconds of a job's recording (what the
#: model keeps: `client.model.HISTORY_S`), as `snapshot --from` does at the recording's end.
WORST_FINDING_WINDOW_S = 3.0


def parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(
        prog="loadertop ls",
        description="List this user's live and ended instrumented jobs (their black boxes), newest "
                    "first: pid, start, duration, how each ended, its worst finding. Open one with "
                    "`loadertop snapshot --from PID` (or `last`), `replay`, `report`.")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects")
    return p


def main(argv: list[str]) -> int:
    return run(parser().parse_args(argv))


def worst_finding(recording: Recording | None, ending: tuple[int, Ending] | None = None
                  ) -> WorstFinding | None:
    """The most severe finding the model names at the recording's end (its sources ended as
    `ending` says their job did: an OOM kill is a finding), or None."""
    if recording is None or not recording.frames:
        return None
    from loadertop.client.document import WorstFinding
    from loadertop.recording.playback import Playback

    playback = Playback(recording, window_s=WORST_FINDING_WINDOW_S, ending=ending)
    doc = playback.document_at(recording.frames[-1].received_at)
    if not doc.findings:
        return None
    finding = doc.findings[0]  # `findings.ordered`: most severe first
    return WorstFinding(kind=finding.kind, severity=finding.severity, summary=finding.summary)


def describe(job: statedir.Job, now: float) -> JobSummary:
    """One job as `ls --json` lists it (docs/contract.md §9)."""
    from loadertop.client.document import JobSummary
    from loadertop.recording import blackbox

    alive = job.alive()
    try:
        # The end of the run is what is judged here: its last minutes, kept in full.
        recording: Recording | None = blackbox.read_job(job, recent_only=True)
    except blackbox.JobError:
        recording = None
    ending = blackbox.ending_of(job, recording, alive=alive)
    if alive:
        end = now
    elif ending.at is not None:
        end = ending.at
    elif recording is not None and recording.frames:
        end = recording.frames[-1].received_at
    else:
        end = None
    return JobSummary(
        pid=job.pid, host=job.meta.host, command=" ".join(job.meta.argv),
        started_at=round(job.meta.started_at, 3),
        duration_s=round(max(0.0, end - job.meta.started_at), 1) if end is not None else None,
        ended=ending.text,
        worst_finding=worst_finding(recording, None if alive else (job.pid, ending)),
        recording=blackbox.recording_label(job) if job.recordings else None)


def last_ended(now: float | None = None) -> JobSummary | None:
    """The job that ended last, as `ls --json` lists it; None when none did (or the state
    directory cannot be read)."""
    from loadertop import statedir

    try:
        jobs = statedir.list_jobs().jobs
    except OSError:
        return None
    job = next((j for j in jobs if not j.alive()), None)
    return describe(job, time.time() if now is None else now) if job is not None else None


def run(args: argparse.Namespace) -> int:
    from loadertop import statedir

    directory = statedir.state_dir()
    listing = statedir.list_jobs(directory)
    now = time.time()
    rows = [describe(job, now) for job in listing.jobs]
    if listing.unreadable:
        print_error(f"{listing.unreadable} job file{'s' if listing.unreadable != 1 else ''} in "
                    f"{directory} could not be read (skipped)")
    if args.json:
        import json

        import msgspec

        sys.stdout.write(json.dumps(msgspec.to_builtins(rows), indent=2, ensure_ascii=False) + "\n")
        return 0
    if not rows:
        off = "" if statedir.blackbox_enabled() else " (the black box is off here: LOADERTOP_BLACKBOX=0)"
        print(f"no jobs recorded in {directory}{off}")
        return 0
    sys.stdout.write(render(rows, str(directory)))
    return 0


def render(rows: list[JobSummary], directory: str) -> str:
    from loadertop.client.units import fmt_duration
    from loadertop.recording.blackbox import printable

    table: list[tuple[str, ...]] = [("PID", "STARTED", "DURATION", "ENDED", "WORST FINDING", "COMMAND")]
    for row in rows:
        table.append((
            str(row.pid),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row.started_at)),
            fmt_duration(row.duration_s) if row.duration_s is not None else "–",
            _clip(printable(row.ended), 60),
            row.worst_finding.kind if row.worst_finding is not None else "–",
            _clip(printable(row.command), 50),
        ))
    return (column_text(table)
            + f"\nrecordings in {directory}; open one: loadertop snapshot --from PID (or last), "
              "loadertop replay PID, loadertop report PID\n")


def column_text(table: list[tuple[str, ...]]) -> str:
    """Rows in left-aligned columns two spaces apart, the last column unpadded."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] + "\n"
                   for row in table)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
