"""What the detectors share: building a `Finding`, which sources and workers are judged, and the
wording of where a stack stands and who is concerned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from loadertop import diagnosis
from loadertop.client.document import (
    Finding,
    FindingKind,
    Severity,
    SourceFigures,
    StackFigures,
    WorkerFigures,
)

MAX_STACK_FRAMES = 64  # frames a finding quotes (the innermost ones)


def finding(kind: FindingKind, severity: Severity, source: str | None, worker: int | None,
            summary: str, evidence: Sequence[str], advice: Sequence[str],
            stack: StackFigures | None = None) -> Finding:
    """A finding as a detector sees it now; `FindingTracker` sets `since`. A stack is quoted
    by its innermost MAX_STACK_FRAMES frames."""
    frames = user = None
    if stack is not None:
        frames = stack.frames[-MAX_STACK_FRAMES:]
        cut = len(stack.frames) - len(frames)
        if stack.user_frame is not None and stack.user_frame >= cut:
            user = stack.user_frame - cut
    return Finding(kind=kind, severity=severity, source=source, worker=worker, since=0.0,
                   summary=summary, evidence=tuple(evidence), advice=tuple(advice),
                   stack=frames, user_frame=user)


#: The states in which a hang is judged (the loop's and a worker's timing).
LIVE_STATES: Final = ("running", "waiting", "stalled")
#: The states in which the probe's slow readings are judged (memory trends, fds, threads).
_READINGS_STATES: Final = ("running", "waiting", "stalled", "idle")
#: Readings older than this are not judged (the probe stopped sending them: no viewer, or ended).
READINGS_STALE_S: Final = 30.0


def resource_workers(source: SourceFigures) -> list[WorkerFigures] | None:
    """The workers whose slow readings are judged (alive, pid known), or None when the source's
    readings are not judged at all: the loop finished or gone, or the readings stale."""
    if source.state not in _READINGS_STATES:
        return None
    age = source.process.age_s
    if age is None or age > READINGS_STALE_S:
        return None
    return [w for w in source.workers if w.alive is not False and w.pid is not None]


def where_in(stack: StackFigures | None) -> str | None:
    """"data.py:42 in load": the innermost frame of the user's own code in ``stack``."""
    frame = diagnosis.user_frame(stack) if stack is not None else None
    return diagnosis.short_frame(frame) if frame is not None else None


def names(ids: list[int]) -> str:
    """"worker 3", "workers 1, 2"."""
    return ("worker " if len(ids) == 1 else "workers ") + ", ".join(str(i) for i in ids)


def one(ids: list[int]) -> int | None:
    """The worker a finding is about when exactly one is concerned."""
    return ids[0] if len(ids) == 1 else None
