"""Findings (CONTRACT §5): the pitfalls of the seed guide and the field, found live.

Pure functions from the document's figures to `Finding`s, like `loadertop.diagnosis` (which names
what limits throughput now; a finding names a pitfall, whatever the category):

    found = detect(source, system)                 # this refresh's findings of one source
    found += machine(system)                       # the machine's own (source None)
    shown = tracker.update(key, found, now)        # `since`, and listed a while after

The detectors live by the kind of evidence they read: `lifecycle` (hangs, deaths, slow workers,
random states, epoch starts: from the loop's and workers' timing) and `resources` (memory trends,
file descriptors, threads, /dev/shm: from the probe's slow readings). Every threshold is a named
constant there, documented in the README ("Findings").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from loadertop.client.document import SEVERITIES, Finding, FindingKind, SourceFigures, SystemFigures
from loadertop.findings import lifecycle, resources

#: A finding whose condition no longer holds stays listed this long (CONTRACT §5: "and for a
#: while after"), so a hang that resolved or a death before the crash can still be read.
LINGER_S: Final = 30.0


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    """This refresh's findings of one source (`since` not yet set: see `FindingTracker`)."""
    return [*lifecycle.detect(source, system), *resources.detect(source, system)]


def machine(system: SystemFigures | None) -> list[Finding]:
    """The machine's own findings (`source` None)."""
    return resources.machine(system) if system is not None else []


def ordered(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most severe first; then the oldest; ties keep their order."""
    return tuple(sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.since)))


_Key = tuple[FindingKind, str | None, int | None]  # a finding's identity: (kind, source, worker)


class FindingTracker:
    """Gives each finding its `since` and keeps it listed `LINGER_S` after its condition ended.

    A finding is the same one while its (kind, source, worker) is: its figures (evidence) are
    the latest, its `since` the first refresh that saw it.
    """

    def __init__(self, linger_s: float = LINGER_S) -> None:
        self.linger_s = linger_s
        # group key -> (kind, source, worker) -> (since, last seen, latest finding)
        self._groups: dict[str, dict[_Key, tuple[float, float, Finding]]] = {}

    def update(self, group: str, found: Sequence[Finding], now: float) -> tuple[Finding, ...]:
        entries = self._groups.setdefault(group, {})
        for finding in found:
            key = (finding.kind, finding.source, finding.worker)
            previous = entries.get(key)
            since = previous[0] if previous is not None else now
            entries[key] = (since, now, finding)
        shown = []
        for key, (since, seen, finding) in list(entries.items()):
            if now - seen > self.linger_s:
                del entries[key]
                continue
            shown.append(msgspec.structs.replace(finding, since=round(since, 3)))
        return ordered(shown)

    def forget(self, group: str) -> None:
        self._groups.pop(group, None)
