"""What the detectors share: building a `Finding`, and the figures' wording."""

from __future__ import annotations

from collections.abc import Sequence

from loadertop.client.document import Finding, FindingKind, Severity, StackFigures

__all__ = ["MAX_STACK_FRAMES", "finding"]

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
