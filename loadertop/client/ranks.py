"""Comparing the ranks of a distributed run: which one is the straggler.

In data-parallel training every step ends in a collective (all-reduce), so the slowest rank sets
the pace. A rank that is slow *at loading* shows it as a high wait fraction — time blocked in its
loader's next() — while the ranks it holds back spend that time inside the collective, which
counts as their step, not their wait. So among the ranks of one loader name, the one whose wait
fraction stands out above the others' median is the straggler.

Pure functions over the snapshot document's sources (no I/O): the model adds
`overview(sources)` to the document as `doc.ranks`, and `diagnosis.overall` makes the straggler's
verdict the top-level one, said of it ("rank 1 holds the job back: …").
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

from loadertop.client.document import RankFigures, RankGroup, Ranks, SourceFigures

# A rank is the straggler when its wait fraction is at least this much above its group's median
# (absolute) ...
STRAGGLER_MIN_GAP = 0.10
# ... and at least this many times the median: 0.9 against 0.8 is everyone starving, not one
# rank holding the others back.
STRAGGLER_MIN_RATIO = 1.5
LIVE_STATES = ("running", "waiting", "stalled", "idle")


def _wait(src: SourceFigures) -> float:
    assert src.wait_fraction is not None  # _groups keeps only sources that have one
    return src.wait_fraction


def _groups(sources: Sequence[SourceFigures]) -> dict[str, list[SourceFigures]]:
    """Live ranked sources with a known wait fraction, by loader name (one entry per rank)."""
    groups: dict[str, dict[int, SourceFigures]] = {}
    for src in sources:
        if src.rank is None or src.state not in LIVE_STATES or src.wait_fraction is None:
            continue
        by_rank = groups.setdefault(src.name, {})
        # Two live sources claiming one rank (a restart): keep the fresher report.
        prev = by_rank.get(src.rank)
        if prev is None or src.age_s < prev.age_s:
            by_rank[src.rank] = src
    return {name: sorted(r.values(), key=lambda s: s.rank or 0)
            for name, r in groups.items() if len(r) >= 2}


def straggler(sources: Sequence[SourceFigures]) -> str | None:
    """The id of the source whose wait holds the other ranks back, or None."""
    best: tuple[float, str] | None = None
    for members in _groups(sources).values():
        mid = median(_wait(s) for s in members)
        top = max(members, key=_wait)
        gap = _wait(top) - mid
        if gap >= STRAGGLER_MIN_GAP and _wait(top) >= STRAGGLER_MIN_RATIO * mid:
            if best is None or gap > best[0]:
                best = (gap, top.id)
    return best[1] if best else None


def overview(sources: Sequence[SourceFigures]) -> Ranks:
    """`doc.ranks`: the straggler and, per loader name with two or more ranks, each rank's
    wait fraction and rate next to the group's median."""
    groups = []
    for name, members in sorted(_groups(sources).items()):
        groups.append(RankGroup(
            name=name,
            median_wait_fraction=round(median(_wait(s) for s in members), 3),
            ranks=tuple(RankFigures(rank=s.rank or 0, id=s.id, wait_fraction=_wait(s),
                                    batches_per_s=s.batches_per_s) for s in members)))
    found = straggler(sources)
    rank = next((s.rank for s in sources if s.id == found), None) if found else None
    return Ranks(straggler=found, straggler_rank=rank, groups=tuple(groups))
