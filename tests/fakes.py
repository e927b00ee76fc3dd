"""Test doubles, kept outside the package: documents made by the real pipeline, a feed that plays
them back, and a GPU reader for machines without NVML.

Every document here comes from real `wire` messages — the LoaderReports, SystemReports and
Goodbyes a probe sends — fed into the real `Model` and advanced at fixed times. So the figures are
computed the way a viewer computes them and the verdict text is what `diagnose` really says; a
change to either shows up in the snapshot tests. Nothing reads the wall clock or a random source:
the same call gives the same document.

    doc = io_bound_doc()                    # one Document
    feed = FakeFeed(io_bound_history(48))   # a Feed for the TUI: one document per refresh tick

The scenarios are built from `LoaderSim` (one instrumented DataLoader: its per-report figures)
and `MachineSim` (the machine's 1 Hz samples), run together by `Scenario`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from loadertop import wire
from loadertop.client.document import Document
from loadertop.client.model import Model
from loadertop.probe.histograms import BucketCounts
from loadertop.system.gpu import GPU_FIELDS

#: The fixed "now" of every scenario (2025-11-29 17:23:20 UTC).
T0 = 1764437000.0
REPORT_S = 0.25  # the probe reports every 0.25 s ...
MACHINE_S = 1.0  # ... and samples the machine once a second
QUEUE_SAMPLES_PER_REPORT = 12  # the probe samples queue depth at ~50 Hz

GIB = 1024**3
MIB = 1024**2


# --------------------------------------------------------------------------- the feed


class FakeFeed:
    """The app's Feed, playing documents: each `advance` returns the next, the last repeating.

    `now` is ignored: the documents carry the times they were made at. `poll()` and `close()`
    only count, so tests can check that the app drives the feed.
    """

    def __init__(self, documents: Document | Sequence[Document]) -> None:
        if isinstance(documents, Document):
            documents = [documents]
        if not documents:
            raise ValueError("FakeFeed needs at least one document")
        self._documents = list(documents)
        self._next = 0
        self.polls = 0
        self.advance_calls = 0
        self.closed = False

    def poll(self) -> None:
        self.polls += 1

    def advance(self, now: float) -> Document:
        self.advance_calls += 1
        doc = self._documents[min(self._next, len(self._documents) - 1)]
        self._next += 1
        return doc

    def push(self, document: Document) -> None:
        """Make `document` the next (and from then on repeating) document."""
        self._documents = self._documents[: self._next] + [document]

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------- samples


def spread(p50: float, p95: float, n: int, *, low: float | None = None,
           high: float | None = None) -> list[float]:
    """`n` values whose median is about `p50` and 95th percentile about `p95`: points of a
    piecewise-linear quantile function through (0, low), (0.5, p50), (0.95, p95), (1, high)."""
    if n <= 0:
        return []
    low = p50 * 0.8 if low is None else low
    high = p95 * 1.15 if high is None else high
    knots = ((0.0, low), (0.5, p50), (0.95, p95), (1.0, high))
    out = []
    for k in range(n):
        q = k / (n - 1) if n > 1 else 0.5
        for (q0, v0), (q1, v1) in zip(knots, knots[1:]):
            if q <= q1:
                out.append(v0 + (v1 - v0) * (q - q0) / (q1 - q0))
                break
    return out


def _us(values_ms: Iterable[float]) -> list[int]:
    return [max(0, round(v * 1000)) for v in values_ms]


#: A fixed, irregular wobble (-1..1) for figures that drift from one report to the next.
WOBBLE = (0.0, 0.35, -0.22, 0.55, 0.12, -0.3, 0.78, 0.08, -0.15, 0.45, 1.0, -0.08)


def wobble(i: int) -> float:
    return WOBBLE[i % len(WOBBLE)]


# --------------------------------------------------------------------------- one loader


@dataclass
class WorkerSim:
    """One DataLoader worker process."""

    fetch_p50_ms: float = 90.0  # getting the items (collate_fn excluded)
    fetch_p95_ms: float = 118.0
    collate_p50_ms: float = 4.0  # the collate_fn (default_collate stacking 64 images)
    collate_p95_ms: float = 6.0
    cpu_fraction: float = 0.93  # CPU time / wall time while producing a batch
    cpu_percent: float | None = 94.0  # of one core
    rss_bytes: int | None = 410 * MIB
    alive: bool | None = True
    exitcode: int | None = None


@dataclass
class LoaderSim:
    """One instrumented DataLoader as its probe reports it every `REPORT_S` seconds.

    The figures describe the loop's steady state: `batches_per_s`, the waits in next()
    (`wait_p50_ms`/`wait_p95_ms`, their share of wall time `wait_fraction`), the step, the queue,
    the workers. `blocked_ms` set: the loop is inside next() since that long (at `Scenario.end`)
    and delivers nothing; `idle`: the loop does not iterate this loader now.

    Stages (docs/contract.md §5): each batch's wait ends with its handoff (`handoff_p50_ms`/`_p95_ms`,
    receiving, unpickling, pin_memory; never more than the wait itself), the rest of the wait is
    the batch still being produced — so the split follows the waits, as it does in a real loop.
    `handoff_share` sets the split outright; `unpaired` (e.g. "in_order_false") makes it unknown:
    the probe pairs no batch and says why. With no workers the loop fetches itself and the probe
    times the stages of its batches (`loop_collate_p50_ms`/`_p95_ms` of each wait is collate_fn).
    """

    name: str = "train"
    pid: int = 41234
    host: str = "gpu-node-1"
    rank: int | None = None
    batch_size: int = 64
    prefetch_factor: int = 2
    pin_memory: bool = True
    persistent_workers: bool = False
    dataset: str = "ImageFolder"
    worker_context: str = "fork"
    command: str = "python train.py --config configs/resnet50.yaml"
    started_at: float = T0 - 3725.0
    batches_per_s: float = 41.6
    wait_fraction: float = 0.012
    wait_p50_ms: float = 0.08
    wait_p95_ms: float = 0.9
    step_p50_ms: float = 23.5
    step_p95_ms: float = 25.1
    ready: int | None = 7
    in_flight: int | None = 1
    ready_mean: float = 6.8
    in_flight_mean: float = 1.2
    ready_when_waiting: float = 0.1
    loop_cpu_when_waiting: float | None = None
    workers: list[WorkerSim] = field(default_factory=lambda: [
        WorkerSim(fetch_p50_ms=90.0 + 2 * i, fetch_p95_ms=118.0 + 3 * i, cpu_percent=94.0 + i,
                  rss_bytes=(400 + 12 * i) * MIB) for i in range(4)])
    loop_fetch_cpu_fraction: float = 0.96  # num_workers=0: the main process fetches
    loop_collate_p50_ms: float = 2.5  # ... and collates
    loop_collate_p95_ms: float = 3.5
    handoff_p50_ms: float = 0.06  # per batch: from produced-and-asked-for to the loop having it
    handoff_p95_ms: float = 0.5
    handoff_share: float | None = None  # of the wait, the share after the batch was produced
    unpaired: str | None = None  # no batch could be paired, for this reason (docs/contract.md §5)
    batch_tensors: int | None = 2  # a sampled batch: images and labels ...
    batch_bytes: int | None = 64 * 3 * 224 * 224 * 4 + 64 * 8  # ... float32, 36.8 MiB
    worker_pid_base: int | None = None  # default pid + 10 (a second loader's workers: say so)
    blocked_ms: float | None = None
    idle: bool = False
    batches_total: int = 5000  # delivered before the scenario starts
    epoch: int = 3
    probe_cpu_fraction: float = 0.004
    wobble: float = 0.0  # how much the figures drift between reports (a share of each figure)
    autotune: wire.AutotuneReport | None = None  # `run --autotune`'s state, sent as it is
    # --- state while a scenario runs
    seq: int = 0
    _carry: float = 0.0  # fractional batches owed to the next report
    _dealt: int = 0  # batches handed to workers so far
    # Every wait, step and worker fetch reported, counted by the probe's own BucketCounts (from
    # the scenario's start: the batches before it were not timed here).
    _wait_buckets: BucketCounts = field(default_factory=BucketCounts)
    _step_buckets: BucketCounts = field(default_factory=BucketCounts)
    _fetch_buckets: dict[int, BucketCounts] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return f"{self.host}:{self.pid}:{self.name}"

    @property
    def endpoint(self) -> str:
        return f"ipc:///run/user/1000/loadertop/{self.pid}.sock"

    def worker_pid(self, worker_id: int) -> int:
        base = self.pid + 10 if self.worker_pid_base is None else self.worker_pid_base
        return base + worker_id

    def config(self) -> wire.LoaderConfig:
        n = len(self.workers)
        return wire.LoaderConfig(
            num_workers=n, batch_size=self.batch_size,
            prefetch_factor=self.prefetch_factor if n else None, pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers, dataset=self.dataset,
            worker_context=self.worker_context if n else None)

    def report(self, sent_at: float, end: float) -> wire.LoaderReport:
        """The report the probe sends at `sent_at` for the `REPORT_S` before it."""
        drift = 1.0 + self.wobble * wobble(self.seq)
        n = len(self.workers)
        blocked = None
        if self.blocked_ms is not None:
            blocked = max(0.0, self.blocked_ms - (end - sent_at) * 1000.0)
        if self.idle or blocked is not None:
            batches = 0
        else:
            owed = self.batches_per_s * REPORT_S + self._carry
            batches = math.floor(owed)
            self._carry = owed - batches
        waits = _us(spread(self.wait_p50_ms * drift, self.wait_p95_ms * drift, batches))
        steps = _us(spread(self.step_p50_ms, self.step_p95_ms, batches))
        interval_ns = REPORT_S * 1e9
        wait_ns = 0 if batches == 0 else round(self.wait_fraction * drift * interval_ns)
        if blocked is not None:
            wait_ns = round(interval_ns)
        # The probe samples queue depth only while a loader with workers is being iterated.
        samples = QUEUE_SAMPLES_PER_REPORT if n and not self.idle else 0
        waiting = round(samples * min(1.0, wait_ns / interval_ns))
        wait_wall = waiting * 20_000_000 if self.loop_cpu_when_waiting is not None else 0
        queue = wire.QueueReport(
            capacity=n * self.prefetch_factor, ready=self.ready if n and not self.idle else 0,
            in_flight=self.in_flight if n and not self.idle else 0, samples=samples,
            ready_sum=round(self.ready_mean * samples), in_flight_sum=round(self.in_flight_mean * samples),
            waiting_samples=waiting, waiting_ready_samples=round(self.ready_when_waiting * waiting),
            waiting_cpu_ns=round(wait_wall * (self.loop_cpu_when_waiting or 0.0)),
            waiting_wall_ns=wait_wall)
        workers = []
        for wid, w in enumerate(self.workers):
            # torch hands out batches round-robin: batch j of the run goes to worker j % n.
            done = sum(1 for j in range(self._dealt, self._dealt + batches) if j % n == wid)
            fetch = _us(spread(w.fetch_p50_ms * drift, w.fetch_p95_ms * drift, done))
            collate = _us(spread(w.collate_p50_ms * drift, w.collate_p95_ms * drift, done))
            wall = (sum(fetch) + sum(collate)) * 1000  # a batch's whole time: items and collate
            fetch_buckets = self._fetch_buckets.setdefault(wid, BucketCounts())
            if w.alive:
                fetch_buckets.add([us * 1000 for us in fetch])
            workers.append(wire.WorkerReport(
                id=wid, pid=self.worker_pid(wid), alive=w.alive, exitcode=w.exitcode,
                cpu_percent=None if w.cpu_percent is None else w.cpu_percent * drift,
                rss_bytes=w.rss_bytes, batches=done if w.alive else 0,
                fetch_us=fetch if w.alive else [], fetch_wall_ns=wall if w.alive else 0,
                fetch_cpu_ns=round(wall * w.cpu_fraction) if w.alive else 0,
                collate_us=collate if w.alive else [], fetch_histogram=fetch_buckets.histogram()))
        loop_wall = sum(waits) * 1000 if not n else 0
        self._wait_buckets.add([us * 1000 for us in waits])
        self._step_buckets.add([us * 1000 for us in steps])
        self._dealt += batches
        self.batches_total += batches
        msg = wire.LoaderReport(
            source=self.source, seq=self.seq, host=self.host, pid=self.pid, name=self.name,
            rank=self.rank, command=self.command, process_started_at=self.started_at,
            sent_at=sent_at, interval_s=REPORT_S, config=self.config(), epoch=self.epoch,
            batches=batches, batches_total=self.batches_total, wait_ns=wait_ns,
            step_ns=sum(steps) * 1000, wait_us=waits, step_us=steps, blocked_ms=blocked,
            queue=queue, workers=workers, loop_fetch_us=waits if not n else [],
            loop_fetch_wall_ns=loop_wall, loop_fetch_cpu_ns=round(loop_wall * self.loop_fetch_cpu_fraction),
            probe_cpu_fraction=self.probe_cpu_fraction, stages=self._stages(waits, wait_ns, drift),
            wait_histogram=self._wait_buckets.histogram(),
            step_histogram=self._step_buckets.histogram(), autotune=self.autotune)
        self.seq += 1
        return msg

    def _stages(self, waits: list[int], wait_ns: int, drift: float) -> wire.StageReport | None:
        """The interval's StageReport: every batch received is paired (or none, `unpaired`)."""
        n = len(self.workers)
        if self.unpaired is not None or not waits:
            if not n:
                return None  # num_workers=0 with nothing timed: the probe sends no stages
            return wire.StageReport(unpaired=self.unpaired, batch_tensors=self.batch_tensors,
                                    batch_bytes=self.batch_bytes)
        if self.handoff_share is not None:
            handoff = [round(w * self.handoff_share) for w in waits]
        else:
            costs = _us(spread(self.handoff_p50_ms * drift, self.handoff_p95_ms * drift, len(waits)))
            handoff = [min(w, h) for w, h in zip(waits, costs)]
        share = self.handoff_share if self.handoff_share is not None else sum(handoff) / max(1, sum(waits))
        handoff_ns = round(wait_ns * share)
        split = dict(paired=len(waits), producing_ns=wait_ns - handoff_ns, handoff_ns=handoff_ns,
                     handoff_us=handoff)
        if n:
            return wire.StageReport(**split, batch_tensors=self.batch_tensors,
                                    batch_bytes=self.batch_bytes)
        # num_workers=0: the loop's wait is its own fetch, collate and handoff, timed per batch.
        collate = _us(spread(self.loop_collate_p50_ms * drift, self.loop_collate_p95_ms * drift,
                             len(waits)))
        collate = [min(c, w - h) for c, w, h in zip(collate, waits, handoff)]
        fetch = [w - h - c for w, h, c in zip(waits, handoff, collate)]
        return wire.StageReport(**split, fetch_us=fetch, collate_us=collate)


# --------------------------------------------------------------------------- the machine


@dataclass
class GpuSim:
    util: float = 96.0
    mem_used_bytes: int = round(61.2 * GIB)
    mem_total_bytes: int = 80 * GIB
    temperature_c: float = 71.0
    power_w: float = 388.0
    power_limit_w: float = 400.0
    name: str = "NVIDIA A100-SXM4-80GB"
    pids: tuple[int, ...] = (41234,)  # the processes using it (how a source finds its GPU)


@dataclass
class MachineSim:
    """A machine as the probe samples it once a second (cgroup-aware figures)."""

    host: str = "gpu-node-1"
    cpu_count: int = 16
    cpu_percent: float = 38.0
    per_cpu: Sequence[float] | None = None  # default: a busy-idle pattern around cpu_percent
    iowait_percent: float | None = 0.4
    load_avg_1m: float | None = 6.1
    mem_total_bytes: int = round(125.7 * GIB)
    mem_available_bytes: int = round(88.4 * GIB)
    swap_total_bytes: int = 8 * GIB
    swap_used_bytes: int = 0
    swap_in_bytes_per_s: float | None = 0.0
    swap_out_bytes_per_s: float | None = 0.0
    disk_read_bytes_per_s: float | None = 2.1 * MIB
    disk_write_bytes_per_s: float | None = 0.3 * MIB
    gpu_status: str = "ok"
    gpus: list[GpuSim] = field(default_factory=lambda: [GpuSim()])
    wobble: float = 0.0
    seq: int = 0

    def report(self, sent_at: float) -> wire.SystemReport:
        drift = 1.0 + self.wobble * wobble(self.seq)
        per_cpu = self.per_cpu
        if per_cpu is None:
            pattern = (97.0, 95.0, 93.0, 96.0, 12.0, 8.0, 31.0, 5.0)
            per_cpu = [pattern[i % len(pattern)] for i in range(self.cpu_count)]

        def pct(value: float | None) -> float | None:
            return None if value is None else round(min(100.0, value * drift), 2)

        msg = wire.SystemReport(
            host=self.host, seq=self.seq, sent_at=sent_at, cpu_count=self.cpu_count,
            cores_available=float(self.cpu_count), cpu_percent=pct(self.cpu_percent),
            per_cpu_percent=[min(100.0, v) for v in per_cpu], iowait_percent=pct(self.iowait_percent),
            load_avg_1m=self.load_avg_1m, mem_total_bytes=self.mem_total_bytes,
            mem_available_bytes=self.mem_available_bytes,
            mem_used_percent=round(100.0 * (1 - self.mem_available_bytes / self.mem_total_bytes), 1),
            swap_total_bytes=self.swap_total_bytes, swap_used_bytes=self.swap_used_bytes,
            swap_in_bytes_per_s=self.swap_in_bytes_per_s, swap_out_bytes_per_s=self.swap_out_bytes_per_s,
            disk_read_bytes_per_s=None if self.disk_read_bytes_per_s is None
            else self.disk_read_bytes_per_s * drift,
            disk_write_bytes_per_s=self.disk_write_bytes_per_s,
            cgroup=wire.CgroupReport(version=2),
            gpu_status=self.gpu_status,
            gpus=[wire.GpuReport(
                index=i, name=g.name, uuid=f"GPU-0000000{i}-fake", util_percent=pct(g.util),
                mem_util_percent=41.0, mem_used_bytes=g.mem_used_bytes,
                mem_total_bytes=g.mem_total_bytes, temperature_c=g.temperature_c,
                power_w=g.power_w, power_limit_w=g.power_limit_w,
                processes=[wire.GpuProcess(pid=p, used_mem_bytes=g.mem_used_bytes) for p in g.pids])
                for i, g in enumerate(self.gpus)] if self.gpu_status == "ok" else [])
        self.seq += 1
        return msg


# --------------------------------------------------------------------------- running them


@dataclass
class Scenario:
    """Loaders and machines reporting into one real Model, as a viewer would receive them."""

    loaders: list[LoaderSim]
    machines: list[MachineSim]
    window_s: float = 3.0
    model: Model = field(init=False)

    def __post_init__(self) -> None:
        self.model = Model(window_s=self.window_s)

    def run(self, start: float, end: float, *, silent: Sequence[LoaderSim] = (),
            silent_since: float | None = None) -> None:
        """Deliver every report sent in (start, end]. Loaders in `silent` (and their machine)
        send nothing after `silent_since`: their process froze or was killed."""
        ticks = round((end - start) / REPORT_S)
        for k in range(1, ticks + 1):
            t = start + k * REPORT_S
            for loader in self.loaders:
                if loader in silent and silent_since is not None and t > silent_since:
                    continue
                self.model.ingest(loader.report(t, end), t, loader.endpoint)
            if k % round(MACHINE_S / REPORT_S) == 0:
                for machine in self.machines:
                    # Every instrumented process samples its machine; one that still reports is
                    # enough (a machine with no live process on it reports nothing).
                    gone = [s for s in silent if silent_since is not None and t > silent_since]
                    senders = [s for s in self.loaders if s.host == machine.host and s not in gone]
                    if senders or not any(s.host == machine.host for s in self.loaders):
                        endpoint = senders[0].endpoint if senders else None
                        self.model.ingest(machine.report(t), t, endpoint)

    def document(self, now: float) -> Document:
        return self.model.advance(now)


def _documents(scenario: Scenario, times: Sequence[float], *, warmup_s: float = 4.0,
               **run: Any) -> list[Document]:
    """Run the scenario from `warmup_s` before the first time, advancing the model at each."""
    docs = []
    previous = times[0] - warmup_s
    for t in times:
        scenario.run(previous, t, **run)
        docs.append(scenario.document(t))
        previous = t
    return docs


def _one(loaders: list[LoaderSim], machines: list[MachineSim], **run: Any) -> Document:
    return _documents(Scenario(loaders, machines), [T0], **run)[0]


# --------------------------------------------------------------------------- the scenarios


def healthy_doc() -> Document:
    """One loader keeping up with a busy GPU: compute-bound (healthy)."""
    return _one([LoaderSim()], [MachineSim()])


def gpu_doc() -> Document:
    """Like `healthy_doc`, on a machine with two GPUs (the job uses GPU 0)."""
    gpus = [GpuSim(), GpuSim(util=93.0, temperature_c=68.0, power_w=371.0,
                           mem_used_bytes=round(60.8 * GIB), pids=())]
    return _one([LoaderSim()], [MachineSim(gpus=gpus)])


def no_gpu_doc(gpu_status: str = "no_nvml") -> Document:
    """A CPU-only machine (NVML missing), or one whose NVML answers `gpu_status`."""
    return _one([LoaderSim()], [MachineSim(cpu_count=8, gpu_status=gpu_status, gpus=[])])


def workers_doc(cpu_percent: Sequence[float | None], rss_bytes: Sequence[int | None]) -> Document:
    """Healthy, with one worker per entry of the two sequences; fetch p95 grows with the id."""
    workers = [WorkerSim(fetch_p50_ms=90.0 + 2 * i, fetch_p95_ms=118.0 + 3 * i, cpu_percent=cpu,
                         rss_bytes=rss) for i, (cpu, rss) in enumerate(zip(cpu_percent, rss_bytes))]
    return _one([LoaderSim(workers=workers)], [MachineSim()])


def _io_loader() -> LoaderSim:
    # 4 workers each waiting ~480 ms on storage per batch deliver ~8.3 batches/s; with a 45 ms
    # step the loop waits the other ~62 % of the time.
    return LoaderSim(
        batches_per_s=8.3, wait_fraction=0.62, wait_p50_ms=70.0, wait_p95_ms=212.0,
        step_p50_ms=45.0, step_p95_ms=48.0, ready=0, in_flight=8, ready_mean=0.3,
        in_flight_mean=7.6, ready_when_waiting=0.0, wobble=0.08, batches_total=2000,
        workers=[WorkerSim(fetch_p50_ms=480.0 + 10 * i, fetch_p95_ms=730.0 + 15 * i,
                           cpu_fraction=0.07, cpu_percent=6.0 + i, rss_bytes=(380 + 5 * i) * MIB)
                 for i in range(4)])


def _io_machine() -> MachineSim:
    return MachineSim(cpu_percent=9.5, per_cpu=[14.0, 9.0, 11.0, 6.0, 8.0, 12.0, 5.0, 7.0] * 2,
                      iowait_percent=31.0, load_avg_1m=4.4, disk_read_bytes_per_s=184.0 * MIB,
                      disk_write_bytes_per_s=1.2 * MIB, gpus=[GpuSim(util=31.0, power_w=160.0,
                                                                   temperature_c=52.0)],
                      wobble=0.1)


def io_bound_history(n: int = 40) -> list[Document]:
    """`n` documents one second apart (ending at T0 + n - 1) of a loop waiting on storage."""
    scenario = Scenario([_io_loader()], [_io_machine()])
    return _documents(scenario, [T0 + i for i in range(n)])


def io_bound_doc(step: int = 0) -> Document:
    """The loop waits for data on I/O-bound workers; `step` seconds into `io_bound_history`."""
    return io_bound_history(step + 1)[-1]


def dead_worker_doc() -> Document:
    """Worker 2 was killed by SIGKILL (the OOM killer: memory is nearly gone) and the loop has
    been blocked in next() for 38 s: stalled."""
    workers = [WorkerSim(cpu_percent=0.0, rss_bytes=rss * MIB) for rss in (2140, 2210)]
    workers.append(WorkerSim(cpu_percent=None, rss_bytes=None, alive=False, exitcode=-9))
    workers.append(WorkerSim(cpu_percent=0.0, rss_bytes=2080 * MIB))
    loader = LoaderSim(workers=workers, blocked_ms=38200.0, ready=0, in_flight=2, ready_mean=0.0,
                       in_flight_mean=2.0, ready_when_waiting=0.0, batches_total=5120)
    machine = MachineSim(cpu_percent=3.0, per_cpu=[3.0] * 16, mem_available_bytes=round(2.1 * GIB),
                         swap_used_bytes=round(6.9 * GIB), swap_in_bytes_per_s=12.0 * MIB,
                         swap_out_bytes_per_s=31.0 * MIB, gpus=[GpuSim(util=0.0, power_w=62.0)])
    return _one([loader], [machine])


def waiting_doc(endpoint: str = "ipc:///tmp/loadertop-demo/demo.sock") -> Document:
    """Subscribed to `endpoint`, nothing received yet (the job is still starting)."""
    model = Model()
    model.add_endpoint(endpoint)
    return model.advance(T0)


def empty_doc() -> Document:
    """No source found, no endpoint given."""
    return Model().advance(T0)


def waiting_for_system_doc() -> Document:
    """A source delivers, but no machine report has arrived yet."""
    return _one([LoaderSim()], [])


def disconnected_doc(age_s: float = 47.0) -> Document:
    """The only trainer went silent `age_s` seconds ago: gone, and the viewer disconnected."""
    loader = LoaderSim()
    scenario = Scenario([loader], [MachineSim()])
    return _documents(scenario, [T0], warmup_s=age_s + 4.0, silent=[loader],
                      silent_since=T0 - age_s)[0]


def stale_doc(age_s: float = 7.4) -> Document:
    """Two trainers; the first (the one a viewer selects first) went silent `age_s` seconds ago
    while the other still delivers, so the viewer is connected."""
    silent = LoaderSim(pid=41234)
    live = LoaderSim(pid=52345, command="python train.py --config configs/vit.yaml")
    scenario = Scenario([silent, live], [MachineSim()])
    return _documents(scenario, [T0], warmup_s=age_s + 4.0, silent=[silent],
                      silent_since=T0 - age_s)[0]


def same_name_doc() -> Document:
    """Two processes on one machine, each calling its loader "train"."""
    return _one([LoaderSim(pid=1111, host="node-a"), LoaderSim(pid=2222, host="node-a")],
                [MachineSim(host="node-a")])


def bad_frames_doc(malformed: int = 3, wrong_version: int = 1) -> Document:
    """Healthy, after the viewer dropped frames it could not use: `malformed` that failed to decode
    (counted by `wire.decode`'s reason, as the subscriber does) and `wrong_version` ones."""
    scenario = Scenario([LoaderSim()], [MachineSim()])
    scenario.run(T0 - 4.0, T0)
    for reason, count in (("malformed", malformed), ("wrong_version", wrong_version)):
        for _ in range(count):
            scenario.model.reject(reason)
    return scenario.document(T0)


def margin_history() -> list[Document]:
    """A loop input-bound at a 15 % wait for 8 s, then waiting 8.5 %: below the 10 % that makes a
    loop input-bound, above the 7 % that makes it healthy again — the margin keeps it input-bound.
    One document a second."""
    loader = LoaderSim(wait_fraction=0.15, wait_p50_ms=3.0, wait_p95_ms=6.0, ready=0, in_flight=8,
                       ready_mean=0.5, ready_when_waiting=0.05,
                       workers=[WorkerSim(fetch_p50_ms=115.0, fetch_p95_ms=140.0, cpu_fraction=0.95)
                                for _ in range(4)])
    scenario = Scenario([loader], [MachineSim()])
    docs = _documents(scenario, [T0 + i for i in range(8)])
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.085, 2.0, 4.0
    return docs + _documents(scenario, [T0 + 8 + i for i in range(6)], warmup_s=1.0)


def held_verdict_history(refreshes: int = 1) -> list[Document]:
    """`loadertop demo` switching from its healthy phase to its I/O-bound one (issue 50): a
    compute-bound loop, then, from T0 - 4, workers waiting on storage and the loop waiting 21 % of
    the time. One document a second from T0: the window holds only the new phase from the
    first, and the hysteresis holds compute_bound for STABLE_UPDATES - 1 of them."""
    loader = LoaderSim()
    scenario = Scenario([loader], [MachineSim()])
    _documents(scenario, [T0 - 4.0])
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.21, 4.0, 9.0
    for i, w in enumerate(loader.workers):
        w.fetch_p50_ms, w.fetch_p95_ms, w.cpu_fraction, w.cpu_percent = 150.0 + i, 190.0, 0.08, 8.0
    return _documents(scenario, [T0 + i for i in range(refreshes)])


def held_verdict_doc() -> Document:
    """The first refresh after the switch: compute_bound held, said with today's 21 %, and
    input_bound_io pending."""
    return held_verdict_history(1)[0]


def multi_source_doc() -> Document:
    """A 2-rank DDP run on two machines, each rank with a train and a val loader: rank 1's
    workers cannot keep up (input-bound, CPU) and hold rank 0 back; the val loaders are idle."""
    loaders: list[LoaderSim] = []
    machines: list[MachineSim] = []
    for rank in (0, 1):
        pid, host = 50100 + 100 * rank, f"gpu-node-{rank + 1}"
        command = "torchrun --nproc-per-node 1 train.py"
        if rank == 1:
            # 4 CPU-bound workers at ~140 ms a batch deliver ~28 batches/s; a 23.5 ms step leaves
            # the loop waiting a third of the time.
            train = LoaderSim(pid=pid, host=host, rank=rank, command=command,
                              started_at=T0 - 612.0, batches_per_s=28.1, wait_fraction=0.34,
                              wait_p50_ms=9.5, wait_p95_ms=31.0, ready=0, in_flight=8,
                              ready_mean=0.9, ready_when_waiting=0.05,
                              workers=[WorkerSim(fetch_p50_ms=140.0 + 2 * i, fetch_p95_ms=171.0 + 3 * i,
                                                 cpu_fraction=0.97, cpu_percent=97.0)
                                       for i in range(4)])
        else:
            train = LoaderSim(pid=pid, host=host, rank=rank, command=command,
                              started_at=T0 - 613.0, batches_per_s=41.2)
        val = LoaderSim(name="val", pid=pid, host=host, rank=rank, command=command,
                        started_at=T0 - 613.0, idle=True, batches_total=390,
                        persistent_workers=True, worker_pid_base=pid + 20,
                        workers=[WorkerSim(cpu_percent=0.0, rss_bytes=350 * MIB) for _ in range(2)])
        loaders += [train, val]
        machines.append(MachineSim(host=host, cpu_percent=31.0 if rank == 0 else 44.0,
                                   gpus=[GpuSim(util=96.0 if rank == 0 else 71.0, pids=(pid,))]))
    return _one(loaders, machines)


def straggler_doc() -> Document:
    """`straggler_scenario`'s document at T0."""
    return _documents(straggler_scenario(), [T0])[0]


def straggler_scenario() -> Scenario:
    """Issue 37: a 2-rank torchrun job on one CPU machine (gloo, DistributedSampler, an all-reduce
    each step) whose rank 1 reads 4x slower. Both ranks run at the pace of rank 1, 10 batches/s:
    rank 1's 2 workers take 200 ms a batch on storage, so its loop waits 75 % of the time; rank 0's
    take 50 ms and keep up, its loop waits 3 % and spends the rest in its step, most of it in the
    all-reduce waiting for rank 1."""
    command = "torchrun --nproc-per-node 2 train.py --backend gloo"
    host = "cpu-node-1"
    fast = LoaderSim(
        pid=61000, host=host, rank=0, command=command, started_at=T0 - 300.0, batches_per_s=10.0,
        wait_fraction=0.03, wait_p50_ms=2.0, wait_p95_ms=6.0, step_p50_ms=97.0, step_p95_ms=99.0,
        ready=2, in_flight=2, ready_mean=2.4, ready_when_waiting=0.05, pin_memory=False,
        batch_size=32, dataset="ShardDataset",
        workers=[WorkerSim(fetch_p50_ms=50.0 + i, fetch_p95_ms=62.0 + i, cpu_fraction=0.08,
                           cpu_percent=4.0, rss_bytes=(300 + 4 * i) * MIB) for i in range(2)])
    slow = LoaderSim(
        pid=61001, host=host, rank=1, command=command, started_at=T0 - 300.0, batches_per_s=10.0,
        wait_fraction=0.75, wait_p50_ms=75.0, wait_p95_ms=110.0, step_p50_ms=25.0, step_p95_ms=27.0,
        ready=0, in_flight=4, ready_mean=0.1, in_flight_mean=3.9, ready_when_waiting=0.0,
        pin_memory=False, batch_size=32, dataset="ShardDataset",
        workers=[WorkerSim(fetch_p50_ms=200.0 + 2 * i, fetch_p95_ms=260.0 + 3 * i, cpu_fraction=0.06,
                           cpu_percent=3.0, rss_bytes=(300 + 4 * i) * MIB) for i in range(2)])
    machine = MachineSim(host=host, cpu_count=8, cpu_percent=14.0, per_cpu=[14.0] * 8,
                         iowait_percent=12.0, load_avg_1m=2.6, disk_read_bytes_per_s=96.0 * MIB,
                         gpu_status="no_gpu", gpus=[])
    return Scenario([fast, slow], [machine])


def main_process_bound_doc() -> Document:
    """4 workers keep up easily (12 ms a batch each) but every batch is a list of 1024 small
    tensors: receiving them costs the main process ~11 ms a batch, so the loop waits 40 % of the
    time with batches ready — 85 % of that wait after the batch was produced (main-process-bound)."""
    workers = [WorkerSim(fetch_p50_ms=11.0 + 0.5 * i, fetch_p95_ms=14.0 + 0.5 * i, collate_p50_ms=0.6,
                         collate_p95_ms=0.9, cpu_fraction=0.91, cpu_percent=31.0 + i,
                         rss_bytes=(610 + 9 * i) * MIB) for i in range(4)]
    loader = LoaderSim(workers=workers, batches_per_s=30.2, wait_fraction=0.4, wait_p50_ms=12.6,
                       wait_p95_ms=19.5, step_p50_ms=20.1, step_p95_ms=21.4, ready=6, in_flight=2,
                       ready_mean=5.2, in_flight_mean=2.4, ready_when_waiting=0.81,
                       handoff_p50_ms=10.8, handoff_p95_ms=16.0, batch_tensors=1024,
                       batch_bytes=1024 * 24 * 1024, dataset="PointCloudShards", pin_memory=False)
    machine = MachineSim(cpu_percent=34.0, gpus=[GpuSim(util=52.0, power_w=231.0)])
    return _one([loader], [machine])


def unpaired_doc(reason: str = "in_order_false") -> Document:
    """The I/O-bound loop of `io_bound_doc`, with a DataLoader the probe cannot pair batches of
    (in_order=False): the split of the wait is unknown and says why."""
    loader = _io_loader()
    loader.unpaired = reason
    return _one([loader], [_io_machine()])


def autotuned_doc() -> Document:
    """One long epoch under `run --autotune`: started at 2 workers, it climbed inside the epoch
    to 4 (+93 %) and 6 (no gain), and went back to 4, where it settled (three switches)."""
    loader = _io_loader()

    def tried(n: int, rate: float) -> wire.AutotuneSetting:
        return wire.AutotuneSetting(num_workers=n, samples_per_s=rate, noise=0.01, epochs=3,
                                    windows=3)

    def switch(batch: int, before: int, after: int, gain: float, reason: str) -> wire.AutotuneSwitch:
        return wire.AutotuneSwitch(epoch=0, batch=batch, from_workers=before, to_workers=after,
                                   reason=reason, gain=gain)

    loader.autotune = wire.AutotuneReport(
        state="settled", num_workers=4, program_num_workers=2, epoch=0, best_num_workers=4,
        best_samples_per_s=190.0, reason="settled on 4 workers, +93% over the program's 2 "
        "(6 gained +2% over 4)", tried=(tried(2, 98.3), tried(4, 190.0), tried(6, 193.1)),
        switches=(switch(57, 2, 4, 0.93, "climbing: 2 gave 98 samples/s; trying 4"),
                  switch(172, 4, 6, 0.02, "climbing: 4 gave 190 samples/s; trying 6"),
                  switch(1234, 6, 4, -0.02, "6 gained +2% over 4; refining around 4: trying 3")),
        switch_count=3, prefetch_factor=2, program_prefetch_factor=2)
    return _one([loader], [_io_machine()])


def main_process_doc() -> Document:
    """num_workers=0: the main process fetches every batch itself, computing ~29 ms each."""
    loader = LoaderSim(workers=[], batches_per_s=18.0, wait_fraction=0.55, wait_p50_ms=29.0,
                       wait_p95_ms=41.0, step_p50_ms=24.0, step_p95_ms=26.0,
                       loop_fetch_cpu_fraction=0.96)
    return _one([loader], [MachineSim()])


# --------------------------------------------------------------------------- single wire messages
def loader_report(**overrides: Any) -> wire.LoaderReport:
    """A valid report of `host:123:train` (2 workers); any field can be overridden."""
    fields = dict(
        source="host:123:train", seq=0, host="host", pid=123, name="train", rank=None,
        command="python train.py", process_started_at=1_700_000_000.0, sent_at=1_700_000_001.0,
        interval_s=0.25,
        config=wire.LoaderConfig(num_workers=2, batch_size=64, prefetch_factor=2, pin_memory=False,
                                 persistent_workers=False, dataset="MyDataset",
                                 worker_context="fork"),
        epoch=1, batches=10, batches_total=100, wait_ns=1_000_000, step_ns=20_000_000,
        wait_us=[100] * 10, step_us=[2000] * 9, blocked_ms=None,
        queue=wire.QueueReport(capacity=4, ready=3, in_flight=1, samples=12, ready_sum=30,
                               in_flight_sum=10, waiting_samples=2, waiting_ready_samples=1),
        workers=[wire.WorkerReport(id=i, pid=200 + i, alive=True, exitcode=None, cpu_percent=97.0,
                                   rss_bytes=10**8, batches=5, fetch_us=[40_000] * 5,
                                   fetch_wall_ns=200_000_000, fetch_cpu_ns=190_000_000)
                 for i in range(2)],
        loop_fetch_us=[], dropped=0, probe_cpu_fraction=0.01,
    )
    fields.update(overrides)
    return wire.LoaderReport(**fields)


def system_report(**overrides: Any) -> wire.SystemReport:
    fields = dict(
        host="host", seq=3, sent_at=1_700_000_001.0, cpu_count=2, cores_available=2.0,
        cpu_percent=50.0, per_cpu_percent=[40.0, 60.0], iowait_percent=0.5, load_avg_1m=1.0,
        mem_total_bytes=2**34, mem_available_bytes=2**33, mem_used_percent=50.0,
        swap_total_bytes=0, swap_used_bytes=0, swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=0.0,
        disk_read_bytes_per_s=0.0, disk_write_bytes_per_s=0.0,
        cgroup=wire.CgroupReport(version=2, cpu_quota_cores=None, mem_limit_bytes=None,
                                 mem_used_bytes=None),
        gpu_status="ok",
        gpus=[wire.GpuReport(index=0, name="H200", util_percent=90.0, mem_used_bytes=10,
                             mem_total_bytes=100, temperature_c=50.0, power_w=300.0,
                             processes=[wire.GpuProcess(pid=123, used_mem_bytes=10)])],
    )
    fields.update(overrides)
    return wire.SystemReport(**fields)


def goodbye(**overrides: Any) -> wire.Goodbye:
    fields = dict(source="host:123:train", seq=5, sent_at=1_700_000_002.0, batches_total=100)
    fields.update(overrides)
    return wire.Goodbye(**fields)


def raw_frame(obj: Any, version: bytes = str(wire.SCHEMA_VERSION).encode()) -> bytes:
    """A frame with an arbitrary (possibly invalid) body, bypassing the typed encoder."""
    return wire.TOPIC + version + b"\0" + msgspec.msgpack.encode(obj)


def mutated_frame(path: list, value: Any, base: wire.Message | None = None) -> bytes:
    """A frame of `base` (default `loader_report()`) with the field at `path` set to `value`
    (or removed: `DELETE`), bypassing the typed encoder: what a broken or hostile peer sends."""
    doc = msgspec.to_builtins(base if base is not None else loader_report())
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw_frame(doc)


DELETE = object()


# --------------------------------------------------------------------------- GPUs without NVML

def make_gpu(index: int = 0, name: str = "GPU", **fields: Any) -> dict[str, Any]:
    """A GPU dict with every field of `GPU_FIELDS`; unknown keys are an error (catches typos)."""
    unknown = set(fields) - set(GPU_FIELDS)
    if unknown:
        raise TypeError(f"unknown GPU fields: {sorted(unknown)}")
    gpu: dict[str, Any] = {key: None for key in GPU_FIELDS}
    gpu.update(index=index, name=name, processes=[])
    gpu.update(fields)
    return gpu


class FakeGpuReader:
    """A `loadertop.system.GpuReader` returning the GPUs it was given (this machine has none).

    `FakeGpuReader()` is a machine without a driver ("no_nvml"); `FakeGpuReader([{...}])` fills each
    given dict up with every GPU field (missing ones None), so tests only spell what they need.
    """

    def __init__(self, gpus: Iterable[dict[str, Any]] | None = None, status: str | None = None):
        self.gpus = [make_gpu(index=i, **g) if "index" not in g else make_gpu(**g)
                     for i, g in enumerate(gpus or [])]
        self.status = status if status is not None else ("ok" if self.gpus else "no_nvml")
        self.reads = 0
        self.closed = False

    @classmethod
    def single(cls, util: float | None = 50.0, **fields: Any) -> FakeGpuReader:
        """One healthy-looking 16 GiB GPU at `util` percent; any GPU field can be overridden."""
        defaults: dict[str, Any] = {
            "name": "Fake GPU", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "util_percent": util, "mem_util_percent": util, "mem_used_bytes": 4 * GIB,
            "mem_total_bytes": 16 * GIB, "temperature_c": 50.0, "power_w": 100.0,
            "power_limit_w": 300.0,
        }
        defaults.update(fields)
        return cls([defaults])

    def read(self) -> tuple[str, list[dict[str, Any]]]:
        self.reads += 1
        # Copies, so a caller that edits the result doesn't change the next read.
        return self.status, [dict(g, processes=[dict(p) for p in g["processes"]]) for g in self.gpus]

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------- findings (docs/contract.md §5)
#
# Loaders whose reports carry what the findings are decided from — a stack while the loop or a
# worker is stuck, a worker's time inside its current batch, the workers' shared random states,
# the epochs' first-batch latency — and the goodbye of a loop that crashed. The findings on these
# documents are the ones `loadertop.findings` really emits from those messages.

VENV = "/opt/venv/lib/python3.12/site-packages"
STDLIB = "/usr/lib/python3.12"
PROJECT = "/home/ana/proj"

#: A worker stuck reading a record over the network, innermost frame last (`wire.Stack`); the
#: user's innermost frame is `_read_record`.
WORKER_STACK = (
    f"{STDLIB}/multiprocessing/process.py:314 in _bootstrap",
    f"{STDLIB}/multiprocessing/process.py:108 in run",
    f"{VENV}/torch/utils/data/_utils/worker.py:349 in _worker_loop",
    f"{VENV}/torch/utils/data/_utils/fetch.py:52 in fetch",
    f"{PROJECT}/data/shards.py:88 in __getitem__",
    f"{PROJECT}/data/shards.py:61 in _read_record",
    f"{VENV}/fsspec/spec.py:1941 in read",
    f"{STDLIB}/socket.py:720 in readinto",
)
WORKER_USER_FRAME = 5

#: The training loop waiting in next() for a batch that a worker does not deliver.
LOOP_WAIT_STACK = (
    f"{PROJECT}/train.py:112 in <module>",
    f"{PROJECT}/train.py:74 in train_one_epoch",
    f"{VENV}/loadertop/probe/loader.py:48 in __next__",
    f"{VENV}/torch/utils/data/dataloader.py:733 in __next__",
    f"{VENV}/torch/utils/data/dataloader.py:1480 in _next_data",
    f"{VENV}/torch/utils/data/dataloader.py:1432 in _get_data",
    f"{VENV}/torch/utils/data/dataloader.py:1284 in _try_get_data",
    f"{STDLIB}/multiprocessing/queues.py:113 in get",
    f"{STDLIB}/multiprocessing/connection.py:257 in poll",
    f"{STDLIB}/multiprocessing/connection.py:1136 in wait",
    f"{STDLIB}/selectors.py:415 in select",
)
LOOP_WAIT_USER_FRAME = 1

#: num_workers=0: the loop itself stuck inside the dataset's read.
LOOP_FETCH_STACK = (
    f"{PROJECT}/train.py:112 in <module>",
    f"{PROJECT}/train.py:74 in train_one_epoch",
    f"{VENV}/loadertop/probe/loader.py:86 in __next__",
    f"{VENV}/torch/utils/data/dataloader.py:733 in __next__",
    f"{VENV}/torch/utils/data/dataloader.py:789 in _next_data",
    f"{VENV}/torch/utils/data/_utils/fetch.py:52 in fetch",
    f"{PROJECT}/data/shards.py:88 in __getitem__",
    f"{PROJECT}/data/shards.py:61 in _read_record",
    f"{STDLIB}/socket.py:720 in readinto",
)
LOOP_FETCH_USER_FRAME = 7

#: What torch raises in the loop when the OOM killer took a worker (its pid 4321).
KILLED_WORKER_PID = 4321
KILLED_MESSAGE = f"DataLoader worker (pid {KILLED_WORKER_PID}) is killed by signal: Killed."


def stack(frames: Sequence[str], user_frame: int | None, taken_at: float = T0 - 0.5) -> wire.Stack:
    return wire.Stack(frames=list(frames), user_frame=user_frame, taken_at=taken_at)


@dataclass
class PitfallSim(LoaderSim):
    """A `LoaderSim` whose reports carry the figures findings are decided from (the fields below;
    unset, its reports are the plain `LoaderSim`'s):

    - `loop_stack`: the loop's stack, sent while it is blocked in next() (`blocked_ms`) past the
      probe's 2 s;
    - `busy_ms`: worker id → time inside its current batch at `Scenario.end` (no batch from it
      meanwhile), with its stack from `worker_stacks` past 2 s;
    - `rng_checked`/`rng_shared`: the random states this epoch's workers started with;
    - `epoch_starts`: report number (`seq`) → first-batch latency of the epoch that started in
      that report's interval (the epoch count goes up by one); every report carries the latest
      eight, oldest first, as the probe sends them.
    """

    loop_stack: wire.Stack | None = None
    busy_ms: dict[int, float] = field(default_factory=dict)
    worker_stacks: dict[int, wire.Stack] = field(default_factory=dict)
    rng_checked: int = 0
    rng_shared: list[wire.RngShare] = field(default_factory=list)
    epoch_starts: dict[int, float] = field(default_factory=dict)

    STACK_AFTER_MS = 2000.0  # the probe's STACK_AFTER_NS

    def report(self, sent_at: float, end: float) -> wire.LoaderReport:
        seq = self.seq
        if seq in self.epoch_starts:
            self.epoch += 1
        starts = [ms for k, ms in sorted(self.epoch_starts.items()) if k <= seq][-8:]
        msg = super().report(sent_at, end)
        workers = []
        for w in msg.workers:
            busy = self.busy_ms.get(w.id)
            if busy is not None:
                busy -= (end - sent_at) * 1000.0
            if busy is None or busy <= 0:
                workers.append(w)
                continue
            worker_stack = self.worker_stacks.get(w.id) if busy >= self.STACK_AFTER_MS else None
            # Inside one batch: nothing delivered by this worker in the meantime.
            workers.append(msgspec.structs.replace(
                w, busy_ms=round(busy, 1), stack=worker_stack, batches=0, fetch_us=[],
                collate_us=[], fetch_wall_ns=0, fetch_cpu_ns=0))
        loop_stack = None
        if self.loop_stack is not None and msg.blocked_ms is not None \
                and msg.blocked_ms >= self.STACK_AFTER_MS:
            loop_stack = self.loop_stack
        return msgspec.structs.replace(
            msg, workers=workers, loop_stack=loop_stack, rng_checked=self.rng_checked,
            rng_shared=list(self.rng_shared), epoch_starts_ms=list(starts))


def killed_worker_history() -> list[Document]:
    """A worker SIGKILLed mid-epoch (the OOM killer) and training crashing at once, as torch does:
    two documents — while it trains healthily (at T0 - 1), and at T0 after worker 2 (pid 4321)
    died (exit code -9) and the process said goodbye with torch's RuntimeError."""
    loader = PitfallSim(worker_pid_base=KILLED_WORKER_PID - 2, batches_total=4870)
    scenario = Scenario([loader], [MachineSim(mem_available_bytes=round(3.2 * GIB))])
    scenario.run(T0 - 5.0, T0 - 1.0)
    before = scenario.document(T0 - 1.0)
    loader.workers[2].alive, loader.workers[2].exitcode = False, -9
    loader.workers[2].cpu_percent, loader.workers[2].rss_bytes = None, None
    scenario.run(T0 - 1.0, T0 - 0.5)
    error = wire.LoopError(type="RuntimeError", message=KILLED_MESSAGE, at=T0 - 0.42)
    scenario.model.ingest(wire.Goodbye(source=loader.source, seq=loader.seq, sent_at=T0 - 0.4,
                                       batches_total=loader.batches_total, error=error),
                          T0 - 0.4, loader.endpoint)
    return [before, scenario.document(T0)]


def killed_worker_doc() -> Document:
    """`killed_worker_history`'s end: the source crashed, worker 2 died of SIGKILL."""
    return killed_worker_history()[-1]


def finished_doc() -> Document:
    """A healthy loop whose process said goodbye without an error: finished normally."""
    loader = LoaderSim()
    scenario = Scenario([loader], [MachineSim()])
    scenario.run(T0 - 4.0, T0 - 0.5)
    scenario.model.ingest(wire.Goodbye(source=loader.source, seq=loader.seq, sent_at=T0 - 0.4,
                                       batches_total=loader.batches_total), T0 - 0.4, loader.endpoint)
    return scenario.document(T0)


def _hung_loader(busy_ms: float = 41_000.0, blocked_ms: float = 40_600.0) -> PitfallSim:
    """Worker 1 inside one batch for `busy_ms` (reading a record over the network) and the
    in-order loop blocked in next() for `blocked_ms`, waiting for that batch."""
    return PitfallSim(
        blocked_ms=blocked_ms, ready=0, in_flight=7, ready_mean=0.0, in_flight_mean=7.0,
        ready_when_waiting=0.0, batches_total=5120, dataset="ShardDataset",
        loop_stack=stack(LOOP_WAIT_STACK, LOOP_WAIT_USER_FRAME),
        busy_ms={1: busy_ms}, worker_stacks={1: stack(WORKER_STACK, WORKER_USER_FRAME)},
        workers=[WorkerSim(cpu_percent=0.0 if i != 1 else 0.4, rss_bytes=(402 + 9 * i) * MIB)
                 for i in range(4)])


def _idle_machine() -> MachineSim:
    return MachineSim(cpu_percent=2.5, per_cpu=[3.0, 2.0] * 8, iowait_percent=0.1,
                      gpus=[GpuSim(util=0.0, power_w=61.0, temperature_c=41.0)])


def worker_hung_doc() -> Document:
    """Worker 1 stuck 41 s inside one batch (its stack in `socket.readinto` under the dataset's
    `_read_record`), the loop blocked 40.6 s in next() behind it: worker_hung and loop_hung."""
    return _one([_hung_loader()], [_idle_machine()], warmup_s=8.0)


def loop_hung_doc() -> Document:
    """num_workers=0: the loop itself has been inside the dataset's read for 12.4 s (loop_hung,
    its stack under `_read_record`)."""
    loader = PitfallSim(
        workers=[], blocked_ms=12_400.0, batches_per_s=18.0, wait_fraction=0.55, wait_p50_ms=29.0,
        wait_p95_ms=41.0, step_p50_ms=24.0, step_p95_ms=26.0, batches_total=880,
        dataset="ShardDataset", loop_stack=stack(LOOP_FETCH_STACK, LOOP_FETCH_USER_FRAME))
    return _one([loader], [_idle_machine()], warmup_s=8.0)


def _rng_share(workers: Sequence[int] = (0, 1, 2, 3),
               state: str = "dataset.rng (numpy Generator)") -> wire.RngShare:
    return wire.RngShare(state=state, workers=list(workers))


def duplicate_rng_doc() -> Document:
    """Healthy, but the dataset's `np.random.default_rng` was made in `__init__`: all four
    workers start with the same state (duplicate_rng)."""
    loader = PitfallSim(rng_checked=4, rng_shared=[_rng_share()])
    return _one([loader], [MachineSim()])


def _slow_worker_loader() -> PitfallSim:
    # Workers 0-2 fetch a batch in ~40 ms, worker 3 (a bad shard) in ~800 ms: in order, the loop
    # gets ~4 batches per 0.8 s and waits for worker 3 most of the time.
    workers = [WorkerSim(fetch_p50_ms=38.0 + 2 * i, fetch_p95_ms=47.0 + 2 * i, cpu_fraction=0.9,
                         cpu_percent=11.0 + i, rss_bytes=(402 + 9 * i) * MIB) for i in range(3)]
    workers.append(WorkerSim(fetch_p50_ms=790.0, fetch_p95_ms=910.0, cpu_fraction=0.05,
                             cpu_percent=4.0, rss_bytes=405 * MIB))
    return PitfallSim(
        workers=workers, batches_per_s=5.0, wait_fraction=0.86, wait_p50_ms=150.0,
        wait_p95_ms=760.0, step_p50_ms=24.0, step_p95_ms=26.0, ready=0, in_flight=8,
        ready_mean=2.1, in_flight_mean=7.5, ready_when_waiting=0.0, dataset="ShardDataset")


def slow_worker_doc() -> Document:
    """Worker 3 takes ~20× longer per batch than the other three and holds the in-order queue
    back (slow_worker names it)."""
    return _one([_slow_worker_loader()], [_io_machine()])


def epoch_start_slow_doc() -> Document:
    """spawn workers without persistent_workers: each of the last two epochs spent ~2.4 s before
    its first batch (epoch_start_slow)."""
    loader = PitfallSim(worker_context="spawn", epoch_starts={4: 2400.0, 100: 2380.0})
    scenario = Scenario([loader], [MachineSim()])
    return _documents(scenario, [T0], warmup_s=30.0)[0]


def pitfalls_doc() -> Document:
    """Several pitfalls at once: a slow worker (3), workers sharing a random state, slow epoch
    starts (spawn, not persistent) — the findings list's warnings and info."""
    loader = _slow_worker_loader()
    loader.worker_context = "spawn"
    loader.rng_checked, loader.rng_shared = 4, [_rng_share()]
    loader.epoch_starts = {4: 2400.0, 100: 2380.0}
    scenario = Scenario([loader], [_io_machine()])
    return _documents(scenario, [T0], warmup_s=30.0)[0]


def findings_multi_source_doc() -> Document:
    """Two loaders of one process: "train" healthy, "val" with worker 1 hung and its loop blocked
    behind it (the overview marks val)."""
    train = PitfallSim()
    val = _hung_loader(busy_ms=21_000.0, blocked_ms=20_500.0)
    val.name, val.worker_pid_base, val.batches_total = "val", train.pid + 20, 390
    return _one([train, val], [MachineSim()], warmup_s=8.0)


@dataclass
class ShmMachineSim(MachineSim):
    """A `MachineSim` that reports its /dev/shm (the probe's `statvfs`)."""

    shm_path: str = "/dev/shm"
    shm_total_bytes: int = 64 * MIB  # Docker's default --shm-size
    shm_free_bytes: int = 3 * MIB

    def report(self, sent_at: float) -> wire.SystemReport:
        return msgspec.structs.replace(super().report(sent_at), shm_path=self.shm_path,
                                       shm_total_bytes=self.shm_total_bytes,
                                       shm_free_bytes=self.shm_free_bytes)


def shm_low_doc() -> Document:
    """A healthy loop in a container whose /dev/shm (64 MiB) is nearly full: shm_low, the
    machine's own finding (`source` None)."""
    return _one([LoaderSim()], [ShmMachineSim()])


# --------------------------------------------------------------------------- recordings


class _RecordingSink:
    """Stands in for a Scenario's Model: what it would ingest is written to a recording instead,
    encoded as the probe encodes it (`wire.encode`), with the time the viewer received it."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def ingest(self, msg: wire.Message, now: float, endpoint: str | None = None) -> None:
        self.writer.add(wire.encode(msg), now, endpoint)


def write_recording(path: Any, scenario: Scenario, start: float, end: float, *,
                    close: bool = True, **run: Any) -> Any:
    """Record what `scenario` sends in (start, end] to `path` (a real RecordingWriter); returns
    the writer (closed unless `close=False`)."""
    from loadertop.recording.file import RecordingWriter

    writer = RecordingWriter(str(path), argv=["loadertop", "record", "-o", str(path)])
    scenario.model = _RecordingSink(writer)  # type: ignore[assignment]
    scenario.run(start, end, **run)
    if close:
        writer.close()
    return writer


def io_bound_scenario() -> Scenario:
    """The loop of `io_bound_history` waiting on storage, as a Scenario to record."""
    return Scenario([_io_loader()], [_io_machine()])
