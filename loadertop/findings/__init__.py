"""Findings (docs/contract.md §5): the pitfalls of the seed guide and the field, found live.

Pure functions from the document's figures to `Finding`s, like `loadertop.diagnosis` (which names
what limits throughput now; a finding names a pitfall, whatever the category):

    found = detect(source, system)                 # this refresh's findings of one source
    found += machine(system)                       # the machine's own (source None)
    shown = tracker.update(key, found, now)        # `since`, and listed a while after

One module per kind (its detector, words and thresholds), collected below from one line each:
`SOURCE_KINDS` (a source's, in the order they are listed: ties in severity and age keep it) and
`MACHINE_KINDS` (the machine's). Every threshold is a named constant in its kind's module,
documented in docs/findings.md.

How to add a finding kind:

1. a new module here with `KIND` and `detect(source, system) -> list[Finding]` (a machine's
   kind: `detect(system)`), its thresholds as `Final` constants beside it; `_common.finding`
   builds a `Finding`, `client/units.py` words the figures;
2. its line in `SOURCE_KINDS` or `MACHINE_KINDS` (and its name in the import above);
3. its name in `client/document.py`'s `FindingKind`: the contract's schema (docs/contract.md
   §5), which a test checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol

import msgspec

from loadertop.client.document import (
    SEVERITIES,
    Finding,
    FindingKind,
    SourceFigures,
    SystemFigures,
)
from loadertop.findings import (
    copy_on_read,
    duplicate_rng,
    epoch_start_slow,
    fd_low,
    loop_hung,
    memory_growth,
    oom_killed,
    shm_low,
    slow_worker,
    threads_oversubscribed,
    worker_died,
    worker_hung,
)

#: A finding whose condition no longer holds stays listed this long (docs/contract.md §5: "and for a
#: while after"), so a hang that resolved or a death before the crash can still be read.
LINGER_S: Final = 30.0


class SourceKind(Protocol):
    """A kind judged per source."""

    @property
    def KIND(self) -> FindingKind: ...

    def detect(self, source: SourceFigures, system: SystemFigures | None, /) -> list[Finding]: ...


class MachineKind(Protocol):
    """A kind judged per machine (its findings' `source` is None)."""

    @property
    def KIND(self) -> FindingKind: ...

    def detect(self, system: SystemFigures, /) -> list[Finding]: ...


#: A source's kinds: one line each.
SOURCE_KINDS: tuple[SourceKind, ...] = (
    worker_hung,
    loop_hung,
    worker_died,
    oom_killed,
    slow_worker,
    duplicate_rng,
    epoch_start_slow,
    copy_on_read,
    memory_growth,
    fd_low,
    threads_oversubscribed,
)
#: The machine's kinds: one line each.
MACHINE_KINDS: tuple[MachineKind, ...] = (
    shm_low,
)


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    """This refresh's findings of one source (`since` not yet set: see `FindingTracker`)."""
    return [found for kind in SOURCE_KINDS for found in kind.detect(source, system)]


def machine(system: SystemFigures | None) -> list[Finding]:
    """The machine's own findings (`source` None)."""
    if system is None:
        return []
    return [found for kind in MACHINE_KINDS for found in kind.detect(system)]


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
