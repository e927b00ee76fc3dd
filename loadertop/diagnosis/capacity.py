"""The worker-count model (the capacity of the loop), which the live advice and `loadertop tune`
share: what the CPU allows (`CpuBudget`), how many workers the loop's figures call for
(`WorkerPlan`), and whether an earlier setting with fewer workers gave as much
(`more_did_not_help`).

Pure: figures in, a model out. Every rule reads `Facts.cpu`, the one budget computed a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadertop.client.document import SettingFigures
from loadertop.client.units import (
    say_core_share,
    say_cores,
    say_ms,
    say_number,
)
from loadertop.diagnosis.readings import FLOAT_MAX, finite, stat
from loadertop.diagnosis.thresholds import (
    CPU_NEAR_CAP,
    FETCH_ROSE_FACTOR,
    IO_WORKERS_PER_CORE_MAX,
    MORE_WORKERS_GAIN_MIN,
    NEAR_BEST,
    QUEUE_GAIN_SHARE,
    WORKER_GAIN_MIN,
)

if TYPE_CHECKING:
    from loadertop.diagnosis.facts import Facts


def ceil_count(ratio: float) -> int:
    """A worker count for ``ratio``: at least 1, and a number even when the ratio overflowed."""
    return math.ceil(min(max(ratio, 1.0), FLOAT_MAX) - 1e-9)


@dataclass(frozen=True)
class CpuBudget:
    """The CPU of the cores available to the job, from measurement (issue 15): the cores, what
    the training process uses (every thread of it: the loop, pin_memory's, the probe's), what our
    workers use, and what other processes use of the same cores. Other processes count only beyond
    the cores the job may not use anyway (a cgroup quota of 2 on a busy 64-core machine leaves the
    2 free).

    Computed once a verdict (`Facts.cpu`), it is the one figure both sides of a verdict rest on
    (issue 37): the category (`cpu_saturation`: is CPU left? `busy_share`) and the advice's
    capacity model (`for_workers`, `max_batches_per_s`: how many batches a second the CPU allows).
    Before, the category read the machine's percentage and the advice its own model, and a job
    whose batches filled both cores while the machine's reading lagged at 85 % was told "CPU is
    left" and "no CPU left for more workers" at once."""

    cores: float
    main_cores: float
    main_measured: bool  # False: the loop's step time counted as CPU (an older probe)
    others: float | None  # None: the machine's CPU is not known
    worker_cpu_ms: float | None  # CPU per batch in a worker (items and collate)
    main_cpu_ms: float | None  # the training process's CPU per batch (receiving, the step, ...)
    rate: float | None = None  # batches a second now (None: unknown)
    machine: float | None = None  # the machine's CPU reading, a share of its cores
    # Our workers' CPU now, in cores: the higher of their processes' sampled CPU and the batches a
    # second times the CPU a batch costs a worker (each reading misses some: a sample lags, a
    # batch's CPU leaves out putting it in the queue); None without workers or figures.
    workers_cores: float | None = None
    workers_from_rate: bool = False  # the batches a second decided `workers_cores`
    # The training process's CPU counted as in use: measured only (an older probe's step counted
    # as CPU is an upper bound: it caps the advice's count but does not make the CPU busy).
    main_in_use: float = 0.0

    @property
    def for_workers(self) -> float:
        return max(0.0, self.cores - self.main_cores - (self.others or 0.0))

    def max_batches_per_s(self) -> float | None:
        """The most batches a second the CPU can give: every batch costs its worker's CPU and the
        main process's, and together they have the cores less the other processes'."""
        per_batch = (self.worker_cpu_ms or 0.0) + (self.main_cpu_ms or 0.0)
        if per_batch <= 0:
            return None
        return max(0.0, self.cores - (self.others or 0.0)) * 1000.0 / per_batch

    def job_share(self) -> float | None:
        """The share of the cores available to the job that it (with other processes on those
        cores) uses now; None when nothing of it is known."""
        if self.workers_cores is None and self.main_in_use <= 0 and not self.others:
            return None
        used = (self.others or 0.0) + self.main_in_use + (self.workers_cores or 0.0)
        return used / self.cores

    def busy_share(self) -> float | None:
        """The share of the CPU available to the job in use — the figure: the machine's reading,
        or what the job uses of the cores available to it, whichever is higher."""
        readings = [r for r in (self.machine, self.job_share()) if r is not None]
        return max(readings) if readings else None

    def use_text(self, short: bool = False) -> str:
        """"workers use 3.8 of 4 cores available", or with the training process measured "the job
        uses 2 of 2 cores available: workers 1.9 (24 batches/s × 78 ms of CPU a batch), the
        training process 0.12"."""
        workers = self.workers_cores
        used = (self.others or 0.0) + self.main_in_use + (workers or 0.0)
        of = f"of {say_cores(self.cores)}" + ("" if short else " available")
        from_rate = (f"{say_number(self.rate)} batches/s × {say_ms(self.worker_cpu_ms)} of CPU a batch"
                     if self.workers_from_rate and self.rate is not None
                     and self.worker_cpu_ms is not None else "")
        if workers is None:
            return f"the training process uses {say_number(used)} {of}"
        if self.main_in_use <= 0 and not self.others:
            return f"workers use {say_number(used)} {of}" + ("" if short or not from_rate else
                                                        f": {from_rate}")
        if short:
            return f"the job uses {say_number(used)} {of}"
        parts = [f"workers {say_number(workers)}" + (f" ({from_rate})" if from_rate else "")]
        if self.main_in_use > 0:
            parts.append(f"the training process {say_core_share(self.main_in_use)}")
        if self.others:
            parts.append(f"other processes {say_core_share(self.others)}")
        return f"the job uses {say_number(used)} {of}: {', '.join(parts)}"

    def text(self) -> str:
        main = "the training process" if self.main_measured else \
            "the training process (not measured: its step counted as CPU)"
        parts = [say_cores(self.cores), f"{say_core_share(self.main_cores)} {main}"]
        if self.others is None:
            parts.append("other processes unknown")
        elif self.others > 0:
            parts.append(f"{say_core_share(self.others)} other processes")
        return f"CPU for workers: {' − '.join(parts)} = {say_cores(self.for_workers)}"

    def cap_text(self, rate_now: float | None) -> str:
        """The capacity model in words: "CPU for workers: …; a batch costs 48 ms in a worker + 2.6
        ms in the training process of CPU, so at most ~40 batches/s (now 38)"."""
        per_batch = [f"{say_ms(self.worker_cpu_ms)} in a worker"] if self.worker_cpu_ms else []
        if self.main_cpu_ms:
            per_batch.append(f"{say_ms(self.main_cpu_ms)} in the training process")
        return (f"{self.text()}; a batch costs {' + '.join(per_batch) or 'its CPU'} of CPU, so at "
                f"most ~{say_number(self.max_batches_per_s() or 0.0)} batches/s"
                + (f" (now {say_number(rate_now)})" if rate_now else ""))


def cpu_budget(facts: Facts) -> CpuBudget:
    """The measured budget (cores must be known): the one place the CPU figures are read."""
    assert facts.cores is not None
    sysd, source = facts.system, facts.source
    rate = finite(source.batches_per_s)
    fetch_mean = facts.fetch_ms("mean")
    fraction, _ = facts.cpu_fraction()
    worker_cpu_ms = finite(max(0.0, fetch_mean * fraction)) \
        if fetch_mean is not None and fraction is not None else None
    rate = rate if rate is not None and rate > 0 else None
    process_cores = finite(source.process.cpu_cores)
    measured = process_cores is not None
    main_in_use = max(0.0, process_cores) if process_cores is not None else 0.0
    if process_cores is None:
        step = stat(source.step_ms, "mean")
        process_cores = min(1.0, step * rate / 1000.0) if step is not None and rate else 0.0
    process_cores = max(0.0, process_cores)
    main_cores = process_cores
    fetch_cores = finite(worker_cpu_ms * rate / 1000.0) \
        if worker_cpu_ms is not None and rate else None
    if not facts.uses_workers and fetch_cores is not None:
        # With num_workers=0 the training process does the fetching itself: that CPU would move
        # to the workers, so it is not the main process's own.
        main_cores = max(0.0, main_cores - fetch_cores)
        if not measured:
            main_in_use = fetch_cores  # the fetch's CPU is measured, the step's is not
    main_cpu_ms = main_cores * 1000.0 / rate if rate else None
    workers: float | None = None
    from_rate = False
    if facts.uses_workers:
        sampled = facts.worker_cores_busy()
        workers = sampled
        if fetch_cores is not None and fraction is not None:
            # n workers busy all the time use at most n x cpu_fraction cores: a rate the workers
            # could not have produced (figures from different moments) claims no more.
            fetch_cores = min(fetch_cores, facts.worker_count * fraction)
            if sampled is None or fetch_cores > sampled:
                workers, from_rate = fetch_cores, True
    others = None
    busy, count = finite(sysd.cpu_percent), facts.cpu_count
    if busy is not None and count and (workers is not None or not facts.uses_workers):
        others = max(0.0, busy / 100.0 * count - process_cores - (workers or 0.0))
        others = max(0.0, others - (count - facts.cores))  # the cores we may not use go first
        others = others if others >= 0.05 else 0.0  # readings a second apart: below is noise
    return CpuBudget(cores=facts.cores, main_cores=main_cores, main_measured=measured,
                      others=others, worker_cpu_ms=worker_cpu_ms, main_cpu_ms=main_cpu_ms,
                      rate=rate, machine=busy / 100.0 if busy is not None else None,
                      workers_cores=workers, workers_from_rate=from_rate, main_in_use=main_in_use)


@dataclass(frozen=True)
class WorkerPlan:
    """A worker count from a model of the loop, and what it rests on.

    With n workers, each taking `fetch_ms` a batch, the loop gets at most n / fetch batches a
    second; it cannot go faster than its own step; and the CPU caps it at `max_batches_per_s` of
    the budget. The count advised is the smallest within NEAR_BEST of the best the model predicts
    up to the limit (IO_WORKERS_PER_CORE_MAX per core), and only when it predicts WORKER_GAIN_MIN
    over the current count. For I/O the model assumes the storage serves n reads at once, which
    only an experiment (`loadertop tune`) can show.
    """

    count: int | None  # the count to try; None: more workers are not predicted to help
    now: int
    predicted: float  # batches/s with `count` (or with `now` when count is None)
    predicted_now: float
    bound: str  # what limits the prediction: "workers", "step", "cpu"
    fetch_ms: float
    step_ms: float
    limit: int | None
    budget: CpuBudget | None
    cpu_max: float | None = None  # the most batches/s the CPU budget allows (None: not known)

    def cpu_near(self) -> bool:
        """The CPU limits the prediction, or its cap is within CPU_NEAR_CAP of it."""
        if self.bound == "cpu":
            return True
        return self.cpu_max is not None and self.cpu_max <= (1.0 + CPU_NEAR_CAP) * self.predicted

    def rate_text(self, rate_now: float | None) -> str:
        now = f", now {say_number(rate_now)}" if rate_now is not None else ""
        return f"up to ~{say_number(self.predicted)} batches/s{now}"

    def basis(self) -> str:
        where = "per worker" if self.now else "in the main process"
        return f"fetch {say_ms(self.fetch_ms)} a batch {where}, step {say_ms(self.step_ms)}"


def worker_limit(facts: Facts) -> int | None:
    """The most workers ever advised: IO_WORKERS_PER_CORE_MAX per core (None: cores unknown)."""
    if facts.cores is None:
        return None
    return max(1, math.floor(min(IO_WORKERS_PER_CORE_MAX * facts.cores, FLOAT_MAX)))


def worker_plan(facts: Facts) -> WorkerPlan | None:
    """None when fetch or step time is unknown."""
    fetch, step = facts.fetch_ms("mean"), stat(facts.source.step_ms, "mean")
    if fetch is None or step is None or fetch <= 0:
        return None
    budget = facts.cpu
    limit = worker_limit(facts)
    cpu_max = budget.max_batches_per_s() if budget is not None else None
    step_max = 1000.0 / max(step, 1e-3)

    def predicted(n: int) -> tuple[float, str]:
        options = [(n * 1000.0 / fetch, "workers"), (step_max, "step")]
        if cpu_max is not None:
            options.append((cpu_max, "cpu"))
        return min(options)

    now = facts.worker_count
    if now == 0:
        rate = finite(facts.source.batches_per_s)
        predicted_now, bound_now = (rate, "workers") if rate is not None else (0.0, "workers")
    else:
        predicted_now, bound_now = predicted(now)
    top = limit if limit is not None else max(now + 1, ceil_count(fetch / max(step, 1e-3)))
    best, _ = predicted(top)
    # predicted(n) = min(n * 1000 / fetch, a ceiling) grows with n: the smallest n near the best
    # in closed form (no loop over counts a hostile figure could make astronomical).
    count = min(top, ceil_count((1.0 - NEAR_BEST) * best * fetch / 1000.0))
    rate, bound = predicted(count)
    if count <= now or rate < (1.0 + WORKER_GAIN_MIN) * predicted_now:
        return WorkerPlan(count=None, now=now, predicted=predicted_now, predicted_now=predicted_now,
                           bound=predicted(now + 1)[1] if now else bound_now, fetch_ms=fetch,
                           step_ms=step, limit=limit, budget=budget, cpu_max=cpu_max)
    return WorkerPlan(count=count, now=now, predicted=rate, predicted_now=predicted_now,
                       bound=bound, fetch_ms=fetch, step_ms=step, limit=limit, budget=budget,
                       cpu_max=cpu_max)


@dataclass(frozen=True)
class MoreDidNotHelp:
    earlier: SettingFigures
    gain: float  # the current throughput over the earlier one's, less 1
    fetch_rose: float | None  # the current fetch per batch over the earlier one's


def more_did_not_help(facts: Facts) -> MoreDidNotHelp | None:
    """An earlier setting of this loader, with fewer workers, that gave (about) as much: the
    measured proof that the extra workers do not help (issue 15)."""
    now_rate = finite(facts.source.batches_per_s)
    workers = facts.worker_count
    if now_rate is None or workers == 0:
        return None
    batch_size = facts.source.config.batch_size
    fewer = [s for s in facts.source.earlier_settings
             if s.num_workers < workers and s.batch_size == batch_size and s.batches_per_s > 0]
    if not fewer:
        return None
    best = max(fewer, key=lambda s: (s.batches_per_s, -s.num_workers))
    gain = now_rate / best.batches_per_s - 1.0
    fetch = facts.fetch_ms("mean")
    rose = fetch / best.fetch_ms if fetch is not None and best.fetch_ms else None
    if gain < MORE_WORKERS_GAIN_MIN:
        return MoreDidNotHelp(earlier=best, gain=gain, fetch_rose=rose)
    proportional = workers / best.num_workers - 1.0 if best.num_workers else math.inf
    if rose is not None and rose >= FETCH_ROSE_FACTOR and gain < QUEUE_GAIN_SHARE * proportional:
        return MoreDidNotHelp(earlier=best, gain=gain, fetch_rose=rose)
    return None


def fewer_workers_target(facts: Facts) -> tuple[int, CpuBudget] | None:
    """Fewer workers, as many as the measured CPU for workers holds (each using its measured
    share of a core while it produces), when `num_workers` exceeds the cores; else None."""
    workers = facts.worker_count
    budget = facts.cpu
    if facts.cores is None or budget is None or workers <= facts.cores:
        return None
    fraction, _ = facts.cpu_fraction()
    each = max(fraction if fraction is not None else 1.0, 0.01)  # of a core, while producing
    target = max(1, math.floor(min(budget.for_workers / each, FLOAT_MAX) + 0.5))
    return (target, budget) if target < workers else None
