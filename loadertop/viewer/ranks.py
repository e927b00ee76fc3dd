"""Comparing the ranks of a distributed run: which one is the straggler.

In data-parallel training every step ends in a collective (all-reduce), so the slowest rank sets
the pace. A rank that is slow *at loading* shows it as a high wait fraction — time blocked in its
loader's next() — while the ranks it holds back spend that time inside the collective, which
counts as their step, not their wait. So among the ranks of one loader name, the one whose wait
fraction stands out above the others' median is the straggler.

Pure functions over the snapshot document's sources (no I/O): the model adds
`overview(sources)` to the document as `doc["ranks"]`.
"""

from __future__ import annotations

from statistics import median

# A rank is the straggler when its wait fraction is at least this much above its group's median
# (absolute) ...
STRAGGLER_MIN_GAP = 0.10
# ... and at least this many times the median: 0.9 against 0.8 is everyone starving, not one
# rank holding the others back.
STRAGGLER_MIN_RATIO = 1.5
LIVE_STATES = ("running", "waiting", "stalled", "idle")


def _groups(sources: list[dict]) -> dict[str, list[dict]]:
    """Live ranked sources with a known wait fraction, by loader name (one entry per rank)."""
    groups: dict[str, dict[int, dict]] = {}
    for src in sources:
        if src.get("rank") is None or src.get("state") not in LIVE_STATES:
            continue
        if src.get("wait_fraction") is None:
            continue
        by_rank = groups.setdefault(src["name"], {})
        # Two live sources claiming one rank (a restart): keep the fresher report.
        prev = by_rank.get(src["rank"])
        if prev is None or (src.get("age_s") or 0) < (prev.get("age_s") or 0):
            by_rank[src["rank"]] = src
    return {name: sorted(r.values(), key=lambda s: s["rank"])
            for name, r in groups.items() if len(r) >= 2}


def straggler(sources: list[dict]) -> str | None:
    """The id of the source whose wait holds the other ranks back, or None."""
    best = None  # (gap, id)
    for members in _groups(sources).values():
        fractions = [s["wait_fraction"] for s in members]
        mid = median(fractions)
        top = max(members, key=lambda s: s["wait_fraction"])
        gap = top["wait_fraction"] - mid
        if gap >= STRAGGLER_MIN_GAP and top["wait_fraction"] >= STRAGGLER_MIN_RATIO * mid:
            if best is None or gap > best[0]:
                best = (gap, top["id"])
    return best[1] if best else None


def overview(sources: list[dict]) -> dict:
    """`doc["ranks"]`: the straggler and, per loader name with two or more ranks, each rank's
    wait fraction and rate next to the group's median."""
    groups = []
    for name, members in sorted(_groups(sources).items()):
        groups.append({
            "name": name,
            "median_wait_fraction": round(median(s["wait_fraction"] for s in members), 3),
            "ranks": [{"rank": s["rank"], "id": s["id"], "wait_fraction": s["wait_fraction"],
                       "batches_per_s": s.get("batches_per_s")} for s in members],
        })
    found = straggler(sources)
    rank = next((s["rank"] for s in sources if s["id"] == found), None) if found else None
    return {"straggler": found, "straggler_rank": rank, "groups": groups}
