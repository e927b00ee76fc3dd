"""A recording's documents as series over time: what the HTML report plots and lists.

Pure (no plotting library): `timeline(playback)` samples the playback's documents at a step that
keeps every plotted line at most `MAX_POINTS` points long, and turns them into per-source,
machine and GPU series aligned on one time axis, plus every finding seen along the way. A figure
the document does not know (`null`) stays None here: the plot leaves a gap, never a made-up 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadertop.client.document import Document, Finding, Source, SystemFigures, WorkerFigures
from loadertop.recording.playback import STEP_S, Playback

#: The most points of one plotted line (an hour's recording is sampled every 2.4 s): enough for
#: a plot a page wide, small enough that an hour's report stays well under a few MB.
MAX_POINTS = 1500

Series = list[float | None]


def sample_step(duration_s: float, max_points: int = MAX_POINTS) -> float:
    """The sampling step: the playback's own step (the TUI's refresh) unless that would give more
    than `max_points` documents; then the step, rounded up to a tenth of a second, that does not."""
    if duration_s <= 0 or duration_s / STEP_S < max_points:
        return STEP_S
    return math.ceil(duration_s / (max_points - 1) * 10) / 10


@dataclass
class WorkerSeries:
    """One worker's fetch time per batch (getting the items), per sampled document; with
    `num_workers=0` the main process's own fetch (`id` None)."""

    id: int | None
    fetch_p50_ms: Series
    fetch_p95_ms: Series


@dataclass
class SourceSeries:
    id: str
    name: str
    host: str
    pid: int
    rank: int | None
    commands: list[str]  # as the source reported it (more than one: it changed, e.g. a restart)
    wait_fraction: Series
    samples_per_s: Series
    batches_per_s: Series
    categories: list[str | None]  # the source's verdict; None where it was not in the document
    num_workers: list[int | None]
    workers: list[WorkerSeries]
    final: Source  # the source as the last document that listed it shows it

    @property
    def has_samples(self) -> bool:
        """Whether samples/s is known anywhere (it needs the loader's batch size)."""
        return any(v is not None for v in self.samples_per_s)

    def category_shares(self) -> list[tuple[str, float]]:
        """Each verdict's share of the sampled time the source was listed, largest first."""
        shown = [c for c in self.categories if c is not None]
        counts: dict[str, int] = {}
        for category in shown:
            counts[category] = counts.get(category, 0) + 1
        return sorted(((c, n / len(shown)) for c, n in counts.items()), key=lambda cs: -cs[1])

    def setting_changes(self, times: Sequence[float]) -> list[tuple[float, int, int]]:
        """(time, num_workers before, after) where the loader was re-created with another count."""
        out: list[tuple[float, int, int]] = []
        previous: int | None = None
        for t, n in zip(times, self.num_workers):
            if n is None:
                continue
            if previous is not None and n != previous:
                out.append((t, previous, n))
            previous = n
        return out


@dataclass
class GpuSeries:
    index: int
    name: str
    util_percent: Series
    mem_used_percent: Series


@dataclass
class MachineSeries:
    hosts: list[str]  # every machine the documents' system figures came from, in order
    cpu_count: int | None
    cpu_percent: Series
    iowait_percent: Series
    mem_used_percent: Series
    swap_used_percent: Series  # None where the machine has no swap
    swap_in_bytes_per_s: Series
    swap_out_bytes_per_s: Series
    gpu_statuses: list[str]
    gpus: list[GpuSeries]

    @property
    def has_swap(self) -> bool:
        return any(v is not None for v in self.swap_used_percent)

    @property
    def has_swap_traffic(self) -> bool:
        return any(v for v in self.swap_in_bytes_per_s + self.swap_out_bytes_per_s)


@dataclass
class SeenFinding:
    """One finding as it stood the last time a sampled document listed it, and the span of
    sampled documents that listed it (`since` is when its condition began, which may be earlier)."""

    finding: Finding
    first_seen: float
    last_seen: float


@dataclass
class Timeline:
    times: list[float]  # Unix times of the sampled documents, the last one at the recording's end
    step_s: float
    window_s: float
    sources: list[SourceSeries]
    machine: MachineSeries
    findings: list[SeenFinding]  # most severe first, then by when they began
    final: Document  # the document at the recording's end
    documents: int = field(init=False)

    def __post_init__(self) -> None:
        self.documents = len(self.times)

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        return self.times[-1]


def timeline(playback: Playback, max_points: int = MAX_POINTS) -> Timeline:
    """Sample `playback` from its start to its end and build the series."""
    step = sample_step(playback.end - playback.start, max_points)
    return timeline_of(playback.documents(step), step, playback.window_s)


def timeline_of(documents: Sequence[Document], step_s: float, window_s: float) -> Timeline:
    if not documents:
        raise ValueError("a timeline needs at least one document")
    times = [d.taken_at for d in documents]
    return Timeline(times=times, step_s=step_s, window_s=window_s,
                    sources=_source_series(documents), machine=_machine_series(documents),
                    findings=_seen_findings(documents), final=documents[-1])


def _source_series(documents: Sequence[Document]) -> list[SourceSeries]:
    order: list[str] = []
    for doc in documents:
        for src in doc.sources:
            if src.id not in order:
                order.append(src.id)
    return [_one_source(source_id, documents) for source_id in order]


def _one_source(source_id: str, documents: Sequence[Document]) -> SourceSeries:
    listed = [next((s for s in d.sources if s.id == source_id), None) for d in documents]
    final = next(s for s in reversed(listed) if s is not None)
    commands: list[str] = []
    for src in listed:
        if src is not None and src.command not in commands:
            commands.append(src.command)
    worker_ids = sorted({w.id for src in listed if src is not None for w in src.workers})
    workers = [WorkerSeries(wid, [], []) for wid in worker_ids]
    main_process = WorkerSeries(None, [], [])  # num_workers=0: the loop fetches
    for src in listed:
        by_id = {w.id: w for w in src.workers} if src is not None else {}
        for series in workers:
            stats = _worker_batch_stats(by_id.get(series.id) if series.id is not None else None)
            series.fetch_p50_ms.append(stats[0])
            series.fetch_p95_ms.append(stats[1])
        loop = src.loop.fetch_ms if src is not None else None
        main_process.fetch_p50_ms.append(loop.p50 if loop is not None else None)
        main_process.fetch_p95_ms.append(loop.p95 if loop is not None else None)
    if any(v is not None for v in main_process.fetch_p50_ms):
        workers.append(main_process)
    return SourceSeries(
        id=final.id, name=final.name, host=final.host, pid=final.pid, rank=final.rank,
        commands=commands,
        wait_fraction=[s.wait_fraction if s is not None else None for s in listed],
        samples_per_s=[s.samples_per_s if s is not None else None for s in listed],
        batches_per_s=[s.batches_per_s if s is not None else None for s in listed],
        categories=[s.diagnosis.category if s is not None else None for s in listed],
        num_workers=[s.config.num_workers if s is not None else None for s in listed],
        workers=workers, final=final)


def _worker_batch_stats(worker: WorkerFigures | None) -> tuple[float | None, float | None]:
    """A worker's p50 and p95 fetch time per batch (getting the items): the figure the TUI's
    workers table shows; collate_fn is its own stage (docs/contract.md §5)."""
    if worker is None or worker.fetch_ms is None:
        return None, None
    return worker.fetch_ms.p50, worker.fetch_ms.p95


def _percent_of(used: int | None, total: int | None) -> float | None:
    if used is None or not total:
        return None
    return 100.0 * used / total


def _machine_series(documents: Sequence[Document]) -> MachineSeries:
    systems: list[SystemFigures | None] = [d.system for d in documents]
    hosts: list[str] = []
    statuses: list[str] = []
    cpu_count: int | None = None
    for system in systems:
        if system is None:
            continue
        cpu_count = system.cpu_count
        if system.host not in hosts:
            hosts.append(system.host)
        if system.gpu_status not in statuses:
            statuses.append(system.gpu_status)
    gpu_indices = sorted({g.index for s in systems if s is not None for g in s.gpus})
    gpus = []
    for index in gpu_indices:
        readings = [next((g for g in s.gpus if g.index == index), None) if s is not None else None
                    for s in systems]
        name = next(g.name for g in reversed(readings) if g is not None)
        gpus.append(GpuSeries(
            index=index, name=name,
            util_percent=[g.util_percent if g is not None else None for g in readings],
            mem_used_percent=[_percent_of(g.mem_used_bytes, g.mem_total_bytes) if g is not None
                              else None for g in readings]))
    return MachineSeries(
        hosts=hosts, cpu_count=cpu_count,
        cpu_percent=[s.cpu_percent if s is not None else None for s in systems],
        iowait_percent=[s.iowait_percent if s is not None else None for s in systems],
        mem_used_percent=[s.mem_used_percent if s is not None else None for s in systems],
        swap_used_percent=[_percent_of(s.swap_used_bytes, s.swap_total_bytes) if s is not None
                           else None for s in systems],
        swap_in_bytes_per_s=[s.swap_in_bytes_per_s if s is not None else None for s in systems],
        swap_out_bytes_per_s=[s.swap_out_bytes_per_s if s is not None else None for s in systems],
        gpu_statuses=statuses, gpus=gpus)


_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def _seen_findings(documents: Sequence[Document]) -> list[SeenFinding]:
    """Every finding any sampled document listed, once per occurrence: a finding is the same one
    while its kind, source, worker and `since` stay the same (a new `since`: it began again)."""
    seen: dict[tuple[str, str | None, int | None, float], SeenFinding] = {}
    for doc in documents:
        for finding in doc.findings:
            key = (finding.kind, finding.source, finding.worker, round(finding.since, 3))
            entry = seen.get(key)
            if entry is None:
                seen[key] = SeenFinding(finding, doc.taken_at, doc.taken_at)
            else:  # the latest text: its evidence says how far it went
                entry.finding, entry.last_seen = finding, doc.taken_at
    return sorted(seen.values(),
                  key=lambda s: (_SEVERITY_RANK.get(s.finding.severity, 3), s.finding.since))
