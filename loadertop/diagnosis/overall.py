"""The top-level verdict: the most urgent of the sources' verdicts, or the straggler's."""

from __future__ import annotations

from collections.abc import Sequence

from loadertop.client.document import OverallVerdict, Ranks, SystemFigures, Verdict
from loadertop.client.units import say_fraction, say_fraction_range
from loadertop.diagnosis.categories import idle, memory_pressure
from loadertop.diagnosis.facts import NO_SYSTEM
from loadertop.diagnosis.registry import INPUT_BOUND_CATEGORIES, OVERALL_RANK, URGENT_CATEGORIES


def overall(verdicts: Sequence[tuple[str, Verdict]], system: SystemFigures | None,
            ranks: Ranks | None = None) -> OverallVerdict:
    """The top-level diagnosis: the most urgent source verdict (see OVERALL_RANK) plus "source".

    Ties keep the order of ``verdicts``. With no sources it is about the machine: memory_pressure
    when memory is short, else idle, with "source": None.

    ``ranks`` (the document's `ranks`, `client/ranks.py`): when it names a straggler whose own
    verdict is that its loop waits for data, that rank sets the pace of the whole job (every step
    ends in a collective the other ranks wait in), so the top-level verdict is the straggler's —
    its category, evidence and advice — with a summary that says so (`_straggler_summary`). Only a
    stall or memory pressure, which stop or threaten every rank, still come first.
    """
    best: tuple[int, int, str, Verdict] | None = None
    for position, (source_id, verdict) in enumerate(verdicts):
        rank = OVERALL_RANK.index(verdict.category)
        if best is None or (rank, position) < best[:2]:
            best = (rank, position, source_id, verdict)
    if best is not None:
        shown = best[3]
        straggling = _straggler_verdict(verdicts, ranks)
        if straggling is not None and shown.category not in URGENT_CATEGORIES:
            return straggling
        return OverallVerdict(category=shown.category, source=best[2], summary=shown.summary,
                              evidence=shown.evidence, advice=shown.advice, pending=shown.pending)
    memory = memory_pressure.memory_findings(system or NO_SYSTEM, None)
    if memory is not None:
        return OverallVerdict(category=memory_pressure.CATEGORY, source=None, summary=memory.summary,
                              evidence=tuple(memory.evidence),
                              advice=("find the processes using the memory (top -o %MEM) and free "
                                      "it before starting training",))
    return OverallVerdict(category=idle.CATEGORY, source=None, summary="no instrumented DataLoader found",
                          evidence=("no sources",), advice=())


def _straggler_verdict(verdicts: Sequence[tuple[str, Verdict]],
                       ranks: Ranks | None) -> OverallVerdict | None:
    """The straggler's own verdict as the top-level one, or None when there is no straggler or its
    loop is not judged to wait for data (a verdict still held at compute_bound, too few batches)."""
    if ranks is None or ranks.straggler is None:
        return None
    verdict = next((v for sid, v in verdicts if sid == ranks.straggler), None)
    group = next((g for g in ranks.groups if any(r.id == ranks.straggler for r in g.ranks)), None)
    if verdict is None or group is None or verdict.category not in INPUT_BOUND_CATEGORIES:
        return None
    me = next(r for r in group.ranks if r.id == ranks.straggler)
    others = [r for r in group.ranks if r.id != ranks.straggler]
    if len(group.ranks) <= 8:
        by_rank = ", ".join(f"rank {r.rank}: {say_fraction(r.wait_fraction)}" for r in group.ranks)
    else:
        by_rank = (f"rank {me.rank}: {say_fraction(me.wait_fraction)}, the other {len(others)} ranks: "
                   f"{say_fraction_range([r.wait_fraction for r in others])}")
    evidence = (*verdict.evidence,
                f"wait fraction by rank of {group.name!r}: {by_rank} (median "
                f"{say_fraction(group.median_wait_fraction)}): every step waits for the slowest rank")
    return OverallVerdict(category=verdict.category, source=ranks.straggler,
                          summary=_straggler_summary(me.rank, verdict.summary,
                                                    [(r.rank, r.wait_fraction) for r in others]),
                          evidence=evidence, advice=verdict.advice, pending=verdict.pending)


def _straggler_summary(rank: int, summary: str, others: Sequence[tuple[int, float]]) -> str:
    """"rank 1 holds the job back: its loop waits 75 % of the time for data; …; rank 0 waits in
    its step (3 % for data)" — the straggler's own summary, said of it, and where the other ranks
    wait: in their step, inside the collective that waits for the straggler."""
    own = "its " + summary[len("the "):] if summary.startswith("the loop ") else summary
    text = f"rank {rank} holds the job back: {own}"
    if not others:
        return text
    ids = [str(r) for r, _ in sorted(others)]
    figure = say_fraction_range([w for _, w in others])
    if len(ids) == 1:
        return f"{text}; rank {ids[0]} waits in its step ({figure} for data)"
    if len(ids) <= 4:
        return (f"{text}; ranks {', '.join(ids[:-1])} and {ids[-1]} wait in their step ({figure} "
                "for data)")
    return f"{text}; the other {len(ids)} ranks wait in their step ({figure} for data)"

