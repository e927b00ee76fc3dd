"""Which num_workers to try next, and which one to recommend: pure functions of the trials so far.

    plan = Plan(start=start_count(cores, advised, max_workers), max_workers=max_workers)
    while isinstance(step := next_trial(trials, plan), Next):
        trials.append(run_the_program(step.num_workers))
    best = pick(points(trials))

The procedure is the tuning guide's (its §4.3), with the rules that make one number trustworthy:

* **climb** from `start` (a quarter of the cores the process may use, or the live advice's
  estimate) two workers a trial, until a trial gains less than `GAIN_MIN` (5 %) over the one
  before, or runs short of memory or fails (then the previous count is the answer: counts from
  there on are never recommended), or `max_workers` is reached;
* **refine** ±1 around the pick. The pick is the smallest count within `GAIN_MIN` of the best
  rate measured: more workers that give no more than 5 % cost memory and start-up time for
  nothing. Below the pick the search goes on one at a time while a count is still within 5 %; above
  it a count is tried only when nothing above the pick was (a count between two that gave no more
  does not plausibly beat both, and one below a count that ran short is not worth the risk);
* **repeat** a count once when the decision its result makes is within noise: the gain compared
  with the 5 % threshold is closer to it than `NOISE_SIGMAS` standard errors of that gain
  (`uncertain`). A gain of 0 ± 1 % against its neighbour is "within noise of its neighbour" but
  decides "stop" without doubt; a gain of 4 ± 3 % does not, and is measured again. In the climb
  only a stop is repeated (a climb that goes on by mistake costs one trial and shows it); around
  the pick, either side of the 5 % line is.

A count's runs are merged (`points`): the mean of the runs' rates, and as spread the larger of the
pooled standard error and half the difference between runs (two runs that disagree say more about
the noise than each run's own scatter).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadertop.diagnosis import IO_WORKERS_PER_CORE_MAX
from loadertop.tuning.document import TrialFigures, TrialReason, UnsafeFigures

GAIN_MIN = 0.05  # the guide's stop rule: a step that gains less than 5 % is not worth its workers
CLIMB_STEP = 2  # workers added per climbing trial (the guide's)
NOISE_SIGMAS = 2.0  # a decision closer to its threshold than this many standard errors: repeat
MAX_TRIALS = 16  # a safety net: the procedure ends long before on any real curve
# An IterableDataset that every worker yields whole: an epoch at k times the workers is k times as
# long. Flag it from half that growth on, and only beyond what per-worker partial batches explain.
DUPLICATE_GROWTH_SHARE = 0.5


@dataclass(frozen=True)
class Point:
    """One num_workers, its runs merged."""

    num_workers: int
    rate: float | None  # the mean of the usable runs' samples/s; None without one
    spread: float  # standard error of `rate` (0 when unknown)
    runs: int  # runs of this count, usable or not
    usable: bool
    memory_short: bool
    failed: bool  # a run exited with an error, or could not be measured


@dataclass(frozen=True)
class Plan:
    start: int
    max_workers: int
    listed: tuple[int, ...] | None = None  # --workers: exactly these, in this order
    max_trials: int = MAX_TRIALS


@dataclass(frozen=True)
class Next:
    num_workers: int
    reason: TrialReason


@dataclass(frozen=True)
class Stop:
    why: str


# ------------------------------------------------------------------------------- the start
def quarter_of_cores(cores: float) -> int:
    """The guide's first count: a quarter of the cores, at least 1 (2 cores: 1, 8: 2, 16: 4)."""
    return max(1, math.floor(cores / 4 + 0.5))


def default_max_workers(cores: float) -> int:
    """The climb's ceiling without --max-workers: the diagnosis's cap for workers that wait on
    I/O (4 per core); CPU-bound workers stop gaining long before."""
    return max(2, IO_WORKERS_PER_CORE_MAX * math.ceil(cores))


def start_count(cores: float, advised: int | None, max_workers: int) -> int:
    """The live advice's count where it has one (at least 1), else a quarter of the cores;
    never above `max_workers`."""
    start = advised if advised is not None and advised >= 1 else quarter_of_cores(cores)
    return max(0, min(start, max_workers))


def climb_sequence(plan: Plan) -> list[int]:
    """start, start + 2, ... up to max_workers (which is tried itself when the steps skip it)."""
    counts = [min(plan.start, plan.max_workers)]
    while counts[-1] < plan.max_workers:
        counts.append(min(counts[-1] + CLIMB_STEP, plan.max_workers))
    return counts


# ------------------------------------------------------------------------------- merging runs
def usable(trial: TrialFigures) -> bool:
    """A run that measured the loader: figures, no error exit, no problem."""
    return (trial.samples_per_s is not None and trial.problem is None
            and trial.exit_code in (None, 0) and trial.num_workers is not None)


def points(trials: Iterable[TrialFigures]) -> dict[int, Point]:
    """Every num_workers tried, its runs merged, by count."""
    runs: dict[int, list[TrialFigures]] = {}
    for trial in trials:
        if trial.num_workers is not None:
            runs.setdefault(trial.num_workers, []).append(trial)
    out = {}
    for count, group in sorted(runs.items()):
        good = [t for t in group if usable(t)]
        rates = [t.samples_per_s for t in good if t.samples_per_s is not None]
        rate = sum(rates) / len(rates) if rates else None
        spread = 0.0
        if rates:
            errors = [t.spread_samples_per_s or 0.0 for t in good]
            pooled = math.sqrt(sum(e * e for e in errors)) / len(errors)
            spread = max(pooled, (max(rates) - min(rates)) / 2) if len(rates) > 1 else errors[0]
        out[count] = Point(num_workers=count, rate=rate, spread=spread, runs=len(group),
                           usable=bool(rates), memory_short=any(t.memory_short for t in group),
                           failed=any(not usable(t) for t in group) and not rates)
    return out


def relative_gain(before: Point, after: Point) -> float:
    """How much more `after` gives than `before` (0.05: 5 % more)."""
    if before.rate is None or after.rate is None:
        return 0.0
    if before.rate <= 0:
        return math.inf if after.rate > 0 else 0.0
    return after.rate / before.rate - 1.0


def relative_spread(before: Point, after: Point) -> float:
    """The standard error of `relative_gain(before, after)` (first order)."""
    if not before.rate or not after.rate:
        return 0.0
    return math.hypot(before.spread / before.rate, after.spread / after.rate)


def uncertain(before: Point, after: Point, threshold: float = GAIN_MIN) -> bool:
    """Whether "after gains at least `threshold` over before" is within noise."""
    gain = relative_gain(before, after)
    return math.isfinite(gain) and abs(gain - threshold) < NOISE_SIGMAS * relative_spread(before, after)


def candidates(pts: dict[int, Point]) -> list[Point]:
    """The counts that may be recommended: measured, and below the first that ran short of memory
    (the guide: the previous count is the answer)."""
    short = [c for c, p in pts.items() if p.memory_short]
    ceiling = min(short) if short else math.inf
    return [p for c, p in sorted(pts.items()) if p.usable and c < ceiling]


def top(pts: dict[int, Point]) -> Point | None:
    """The candidate with the highest rate."""
    usable_points = candidates(pts)
    return max(usable_points, key=lambda p: p.rate or 0.0) if usable_points else None


def pick(pts: dict[int, Point]) -> Point | None:
    """The smallest count within GAIN_MIN of the best rate: the knee of the curve."""
    best = top(pts)
    if best is None or best.rate is None:
        return None
    return next(p for p in candidates(pts) if (p.rate or 0.0) * (1 + GAIN_MIN) >= best.rate)


# ------------------------------------------------------------------------------- the next trial
def next_trial(trials: Sequence[TrialFigures], plan: Plan) -> Next | Stop:
    """The count to run next, or why the search is over."""
    pts = points(trials)
    if plan.listed is not None:
        done = {t.num_workers for t in trials}
        for count in plan.listed:
            if count not in done:
                return Next(count, "listed")
        return Stop("every listed count was run")
    if len(trials) >= plan.max_trials:
        return Stop(f"{plan.max_trials} trials, the most one search runs")
    unsafe = duplicated_iterable(trials)
    if unsafe is not None:
        return Stop("the main loader's IterableDataset yields duplicates with more workers")
    step, climb_ended = _climb(pts, plan)
    if step is not None:
        return step
    best = pick(pts)
    if best is None:
        return Stop(f"{climb_ended}; no count could be measured")
    step = _refine(pts, plan, best)
    if step is not None:
        return step
    return Stop(f"{climb_ended}; refined around num_workers={best.num_workers}")


def _climb(pts: dict[int, Point], plan: Plan) -> tuple[Next | None, str]:
    sequence = climb_sequence(plan)
    for i, count in enumerate(sequence):
        point = pts.get(count)
        if point is None:
            return Next(count, "start" if i == 0 else "climb"), ""
        if point.memory_short:
            return None, f"memory ran short at num_workers={count}"
        if not point.usable:
            return None, f"num_workers={count} failed"
        if i == 0:
            continue
        before = pts[sequence[i - 1]]
        gain = relative_gain(before, point)
        # Only a stop is worth a repeat: a climb that goes on by mistake costs the one trial that
        # shows it (and the pick rule does not take a count that gains under 5 %), while a stop by
        # mistake leaves the gain unmeasured for good.
        if gain < GAIN_MIN and uncertain(before, point) and point.runs < 2:
            return Next(count, "repeat"), ""
        if gain < GAIN_MIN:
            return None, (f"num_workers={count} gained {gain * 100:+.1f} % over {before.num_workers}"
                          f" (less than {GAIN_MIN * 100:g} %)")
    return None, f"--max-workers {plan.max_workers} reached"


def _refine(pts: dict[int, Point], plan: Plan, best: Point) -> Next | None:
    highest = top(pts)
    if highest is not None and best is not highest and best.runs < 2 and uncertain(best, highest):
        return Next(best.num_workers, "repeat")  # is the pick itself within 5 % of the best?
    for count in (best.num_workers - 1, best.num_workers + 1):
        if count < 0 or count > plan.max_workers:
            continue
        if count > best.num_workers and any(c > best.num_workers for c in pts):
            continue  # above the pick: a count between it and one that gave no more (or failed)
        point = pts.get(count)
        if point is None:
            return Next(count, "refine")
        if (point.usable and point.runs < 2 and highest is not None and point is not highest
                and uncertain(point, highest)):
            return Next(count, "repeat")
    return None


def trials_left(trials: Sequence[TrialFigures], plan: Plan) -> int:
    """About how many trials remain, the next one included (for the progress line's estimate):
    exact for --workers; for the search, the next step and what usually follows it (the climb's
    next step and one refinement)."""
    if plan.listed is not None:
        done = {t.num_workers for t in trials}
        return sum(1 for c in dict.fromkeys(plan.listed) if c not in done)
    step = next_trial(trials, plan)
    if isinstance(step, Stop):
        return 0
    return {"start": 4, "climb": 3, "repeat": 2, "refine": 1}.get(step.reason, 1)


# ------------------------------------------------------------------------------- unsafe loaders
def duplicated_iterable(trials: Iterable[TrialFigures]) -> UnsafeFigures | None:
    """Evidence that the main loader's IterableDataset is not split across workers: with k times
    the workers (0 counts as 1: the main process yields it once), its epochs are about k times as
    long, because every worker yields the whole dataset."""
    seen = [(max(t.num_workers, 1), t.num_workers, t.batches_per_epoch) for t in trials
            if t.iterable and t.num_workers is not None and t.batches_per_epoch]
    for fewer_eff, fewer, fewer_len in seen:
        for more_eff, more, more_len in seen:
            if more_eff <= fewer_eff or fewer_len is None or more_len is None:
                continue
            growth = more_eff / fewer_eff
            if (more_len / fewer_len >= 1 + DUPLICATE_GROWTH_SHARE * (growth - 1)
                    and more_len - fewer_len >= more_eff):
                return UnsafeFigures(reason="duplicated_iterable", num_workers=(fewer, more),
                                     batches_per_epoch=(round(fewer_len, 1), round(more_len, 1)))
    return None
