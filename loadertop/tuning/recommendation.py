"""The one recommendation `loadertop tune` ends with, and its reason: a pure function of the trials.

    best, text = recommend(trials, max_workers=8, unsafe=None, unit="samples/s")
    # "num_workers=5: 246 samples/s (±2); 7 and 9 workers gave no more (+0.4 %, +0.8 %) and cost
    #  2 × 180 MiB; 4 workers gave 19 % less"

The count is `strategy.pick` (the smallest within 5 % of the best rate measured); the reason names
what was measured above it (the gains it would leave, what more workers cost in memory, a count
that ran short of memory or failed) and below it (what fewer would lose), and the program's own
setting where a trial ran it.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadertop.client.units import fmt_bytes
from loadertop.client.units import say_workers as workers
from loadertop.tuning.document import BestFigures, TrialFigures, UnsafeFigures
from loadertop.tuning.strategy import (
    GAIN_MIN,
    Point,
    candidates,
    pick,
    points,
    relative_gain,
    usable,
)


def counts_of_workers(counts: Sequence[int]) -> str:
    """"7 workers", "1 and 3 workers", "3, 5 and 7 workers" ("1 worker" alone)."""
    if len(counts) == 1:
        return workers(counts[0])
    names = [str(c) for c in counts]
    return f"{', '.join(names[:-1])} and {names[-1]} workers"


def fmt_rate(rate: float) -> str:
    if rate >= 100:
        return f"{rate:.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    return f"{rate:.2f}"


def fmt_spread(spread: float) -> str:
    return f"{spread:.0f}" if spread >= 100 else f"{spread:.1f}"


def fmt_gain(gain: float) -> str:
    return f"{gain * 100:+.1f} %"


def recommend(trials: Sequence[TrialFigures], *, max_workers: int | None,
              unsafe: UnsafeFigures | None, unit: str = "samples/s",
              own_setting: int | None = None) -> tuple[BestFigures | None, str]:
    """(the recommended count, or None; the sentence that says it and why)."""
    if unsafe is not None:
        return None, unsafe_text(unsafe)
    pts = points(trials)
    best = pick(pts)
    if best is None or best.rate is None:
        return None, nothing_text(trials)
    figures = BestFigures(num_workers=best.num_workers, samples_per_s=round(best.rate, 2),
                          spread_samples_per_s=round(best.spread, 2) if best.spread else None)
    parts = [_head(best, unit)]
    allowed = candidates(pts)
    above = [p for p in allowed if p.num_workers > best.num_workers]
    if above:
        parts.append(_above_text(best, above, trials))
    short = sorted(c for c, p in pts.items() if p.memory_short)
    if short:
        parts.append(f"{workers(short[0])} ran short of memory ({_memory_detail(trials, short[0])})")
    failed = sorted(c for c, p in pts.items() if p.failed and c > best.num_workers)
    if failed:
        parts.append(f"{workers(failed[0])} failed ({_failure_detail(trials, failed[0])})")
    if (max_workers is not None and best.num_workers >= max_workers and not above
            and not short and not failed):
        parts.append(f"more were not tried (--max-workers {max_workers})")
    below = [p for p in allowed if p.num_workers < best.num_workers]
    if below:
        loss = 1.0 - (below[-1].rate or 0.0) / best.rate
        parts.append(f"{workers(below[-1].num_workers)} gave {loss * 100:.0f} % less")
    own = pts.get(own_setting) if own_setting is not None else None
    if own is not None and own.usable and own is not best and own.rate:
        change = best.rate / own.rate - 1.0
        parts.append(f"{fmt_gain(change)} over the program's own num_workers={own_setting}")
    return figures, "; ".join(parts)


def _head(best: Point, unit: str) -> str:
    spread = f" (±{fmt_spread(best.spread)})" if best.spread and best.rate else ""
    return f"num_workers={best.num_workers}: {fmt_rate(best.rate or 0.0)} {unit}{spread}"


def _above_text(best: Point, above: Sequence[Point], trials: Sequence[TrialFigures]) -> str:
    gains = [relative_gain(best, p) for p in above]
    said = "gave no more" if max(gains) < GAIN_MIN / 2 else f"gained less than {GAIN_MIN * 100:g} %"
    text = (f"{counts_of_workers([p.num_workers for p in above])} {said} "
            f"({', '.join(fmt_gain(g) for g in gains)})")
    cost = worker_cost(trials, above_count=best.num_workers)
    if cost:
        extra = above[0].num_workers - best.num_workers
        text += f" and cost {extra} × {fmt_bytes(cost)}"
    return text


def worker_cost(trials: Sequence[TrialFigures], above_count: int) -> int | None:
    """What one more worker costs in memory: its private memory (USS) where it was read, else its
    RSS; from the trials with more workers than `above_count` (else from any with workers)."""
    def mean(sample: list[int]) -> int | None:
        return round(sum(sample) / len(sample)) if sample else None

    def cost(t: TrialFigures) -> int | None:
        return t.worker_uss_bytes or t.worker_rss_bytes

    above = [c for t in trials if usable(t) and (t.num_workers or 0) > above_count
             and (c := cost(t))]
    return mean(above) or mean([c for t in trials if (c := cost(t))])


def _memory_detail(trials: Sequence[TrialFigures], count: int) -> str:
    runs = [t for t in trials if t.num_workers == count and t.memory_short]
    if any(t.swap_active for t in runs):
        return "swap active"
    available = [t.mem_available_bytes for t in runs if t.mem_available_bytes is not None]
    if available:
        return f"{fmt_bytes(min(available))} available"
    return "memory pressure"


def _failure_detail(trials: Sequence[TrialFigures], count: int) -> str:
    for t in trials:
        if t.num_workers == count and not usable(t):
            if t.exit:
                return t.exit.split(":", 1)[0]
            if t.problem:
                return t.problem
    return "no figure"


def unsafe_text(unsafe: UnsafeFigures) -> str:
    fewer, more = unsafe.num_workers
    fewer_len, more_len = unsafe.batches_per_epoch
    return (f"keep num_workers at 0 or 1: the main loader's IterableDataset is not split across "
            f"workers — an epoch had {fewer_len:.0f} batches with {workers(fewer)} and "
            f"{more_len:.0f} with {workers(more)}, so every worker yields the whole dataset and "
            f"more workers only repeat it; split it by torch.utils.data.get_worker_info() in "
            f"__iter__, then tune again")


def nothing_text(trials: Sequence[TrialFigures]) -> str:
    reasons = [t.exit or t.problem for t in trials if not usable(t) and (t.exit or t.problem)]
    why = f": {reasons[0]}" if reasons else ""
    return f"no recommendation: no trial measured the main loader{why}"
