"""The figures a rule reads (`Facts`, read once a verdict), and the verdict it returns.

`source` is a `SourceFigures` and `system` a `SystemFigures` (or None) of
`loadertop.client.document`. Every figure may be None (unknown) or, from a broken reading, not
finite: a rule treats both as "no evidence" and never invents a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from loadertop.client.document import (
    Category,
    GpuFigures,
    SourceFigures,
    SystemFigures,
    Verdict,
    WorkerFigures,
)
from loadertop.diagnosis.capacity import CpuBudget, cpu_budget
from loadertop.diagnosis.readings import finite, stat, weighted_mean
from loadertop.diagnosis.slow_worker import SlowWorker, slow_worker

# Stands in for an unknown machine: every figure None, no GPU, no cores known.
NO_SYSTEM = SystemFigures(
    host="", sent_at=0.0, cpu_count=0, cores_available=None, cpu_percent=None,
    per_cpu_percent=None, iowait_percent=None, load_avg_1m=None, mem_total_bytes=None,
    mem_available_bytes=None, mem_used_percent=None, swap_total_bytes=None, swap_used_bytes=None,
    swap_in_bytes_per_s=None, swap_out_bytes_per_s=None, disk_read_bytes_per_s=None,
    disk_write_bytes_per_s=None, cgroup=None, gpu_status="no_nvml", gpus=(), age_s=0.0)


@dataclass(frozen=True)
class Facts:
    """The figures the rules use, read once."""

    source: SourceFigures
    system: SystemFigures
    wait_fraction: float  # NaN when unknown (checked before any comparison)
    step_ms: float | None
    cores: float | None
    cpu_count: float | None
    # The category shown now (`VerdictStabilizer.shown_category`): it moves each threshold to its
    # "leave" value so that a figure hovering at a boundary keeps the verdict.
    previous: Category | None = None
    # ... and whether the loop waits for data in it (the margin on the wait fraction applies).
    previous_loop_waits: bool = False

    @classmethod
    def read(cls, source: SourceFigures, system: SystemFigures | None,
             previous: Category | None = None, previous_loop_waits: bool = False) -> Facts:
        sysd = system if system is not None else NO_SYSTEM
        wait_fraction = finite(source.wait_fraction)
        if wait_fraction is None:
            wait, step = stat(source.wait_ms, "mean"), stat(source.step_ms, "mean")
            if wait is not None and step is not None and wait + step > 0:
                wait_fraction = wait / (wait + step)
        cpu_count = float(sysd.cpu_count) if sysd.cpu_count > 0 else None
        cores = finite(sysd.cores_available)
        if cores is None or cores <= 0:
            cores = cpu_count
        return cls(source=source, system=sysd,
                   wait_fraction=wait_fraction if wait_fraction is not None else math.nan,
                   step_ms=stat(source.step_ms), cores=cores, cpu_count=cpu_count,
                   previous=previous, previous_loop_waits=previous_loop_waits)

    @property
    def workers(self) -> tuple[WorkerFigures, ...]:
        return self.source.workers

    @property
    def uses_workers(self) -> bool:
        return self.source.config.num_workers > 0

    @property
    def worker_count(self) -> int:
        return self.source.config.num_workers

    @property
    def window_judged(self) -> bool:
        """The window has batches and a known wait fraction: the figures a loop's verdict is
        said with (a verdict held by the hysteresis is restated only with them)."""
        return self.source.batches > 0 and not math.isnan(self.wait_fraction)

    @property
    def active(self) -> bool:
        """The loop is still iterating (so a worker exiting is not a normal shutdown)."""
        return self.source.state not in ("idle", "finished", "gone")

    def fetch_ms(self, key: str = "p50") -> float | None:
        """Time to produce one batch — the items and the collate_fn: the workers' (weighted by
        batches), or the main process'."""
        if not self.uses_workers:
            return stat(self.source.loop.fetch_ms, key)
        pairs = [(v + (stat(w.collate_ms, key) or 0.0), float(w.batches)) for w in self.workers
                 if (v := stat(w.fetch_ms, key)) is not None]
        return weighted_mean(pairs)

    def handoff_share(self) -> float | None:
        split = self.source.stages.wait_split
        return finite(split.handoff) if split is not None else None

    def cpu_fraction(self) -> tuple[float | None, str]:
        """(CPU time / wall time while producing batches, where the figure comes from)."""
        if not self.uses_workers:
            return finite(self.source.loop.cpu_fraction), "main process fetch cpu_fraction"
        pairs = [(v, float(w.batches)) for w in self.workers
                 if (v := finite(w.cpu_fraction)) is not None]
        if pairs:
            return weighted_mean(pairs), "worker cpu_fraction"
        # Fallback: the workers' process CPU (100 = one core). While the loop waits for data the
        # workers are producing all the time, so this approximates the same fraction.
        percents = self._worker_percents()
        if percents:
            return min(1.0, sum(percents) / len(percents) / 100.0), "worker process CPU"
        return None, ""

    @cached_property
    def cpu(self) -> CpuBudget | None:
        """The CPU figures both the category and the advice rest on (`CpuBudget`), read once;
        None when the cores available are unknown."""
        return cpu_budget(self) if self.cores is not None else None

    @cached_property
    def slow_worker(self) -> SlowWorker | None:
        """The one worker that holds the in-order queue back (`slow_worker`), read once."""
        return slow_worker(self.source) if self.uses_workers else None

    def worker_cores_busy(self) -> float | None:
        percents = self._worker_percents()
        return finite(sum(percents) / 100.0) if percents else None

    def _worker_percents(self) -> list[float]:
        return [v for w in self.workers if (v := finite(w.cpu_percent)) is not None]

    def worker_rss(self) -> list[float]:
        return [float(w.rss_bytes) for w in self.workers if w.rss_bytes is not None]


def make_verdict(category: Category, summary: str, evidence: Sequence[str],
             advice: Sequence[str]) -> Verdict:
    return Verdict(category=category, summary=summary, evidence=tuple(evidence),
                   advice=tuple(advice))


def source_gpus(facts: Facts) -> list[GpuFigures]:
    """The GPUs this source's process uses (by pid); the only GPU when there is exactly one."""
    if facts.system.gpu_status != "ok":
        return []
    gpus = list(facts.system.gpus)
    pid = facts.source.pid
    mine = [g for g in gpus if any(p.pid == pid for p in g.processes)]
    if mine:
        return mine
    return gpus if len(gpus) == 1 else []
