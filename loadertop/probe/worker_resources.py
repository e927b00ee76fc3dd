"""The workers: each one's fetch figures (from the samples it sends), the random states it started
with, and its liveness, CPU and RSS (~1 Hz), read on the publisher thread."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from loadertop import wire
from loadertop.probe import resources, stacks, torch_internals
from loadertop.probe.histograms import BucketCounts
from loadertop.probe.stage_pairing import PAIR_MAX_PENDING

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from loadertop.probe.record_state import RecordState, WorkerProc, WorkerStatus
else:
    RecordState = object


class _WorkerAccum:
    __slots__ = ("pid", "batches", "fetch_us", "collate_us", "wall_ns", "cpu_ns", "dropped",
                 "last_done_ns", "fetch_buckets")

    def __init__(self) -> None:
        self.pid: int | None = None
        self.reset()
        self.dropped = 0
        self.last_done_ns = 0  # when its latest batch was produced (perf_counter_ns)
        # Every fetch of this worker id (its processes of every epoch), never reset: the
        # Prometheus counter of `loadertop export`.
        self.fetch_buckets = BucketCounts()

    def reset(self) -> None:
        self.batches = 0
        self.fetch_us: list[int] = []
        self.collate_us: list[int] = []
        self.wall_ns = 0
        self.cpu_ns = 0


class WorkerResources(RecordState):
    """LoaderRecord's workers (a mixin: see record.py). A worker's sample also brings its batch's
    "produced" stamp for stage pairing (`_done`) and, once an iterable dataset's worker runs
    out, the task from which the epoch's batches can no longer be named."""

    def _init_worker_resources(self) -> None:
        self._workers: dict[int, _WorkerAccum] = {}
        # worker id -> (pid, alive, exitcode, cpu %, rss), refreshed by sample_workers()
        self._worker_status: dict[int, WorkerStatus] = {}
        self._psutil: dict[int, Any] = {}  # pid -> psutil.Process
        self._alive_pids: set[int] = set()  # the workers alive at the last sample_workers()
        self._worker_procs: list[WorkerProc] = []
        self._rng: dict[int, tuple[int, dict[str, str]]] = {}  # pid -> (worker id, digests)

    def add_worker_sample(self, sample: wire.WorkerSample) -> None:
        key = (sample.pid, sample.generation, sample.seq)
        if sample.ended:
            self._resolve_epochs()  # the notice's epoch, attached since the last report
            pairing = self._recent_pairings.get((sample.pid, sample.generation))
            if pairing is not None:
                pids = pairing.pids  # read by _resolve_epochs above: a list, not None
                task = sample.seq * len(pids) + pids.index(sample.pid)  # type: ignore[arg-type, union-attr]
                pairing.limit = task if pairing.limit is None else min(pairing.limit, task)
            return
        acc = self._workers.get(sample.worker_id)
        if acc is None:
            if len(self._workers) >= wire.MAX_WORKERS:
                return
            acc = self._workers[sample.worker_id] = _WorkerAccum()
        acc.pid = sample.pid
        acc.batches += 1
        collate_ns = min(sample.collate_ns, sample.fetch_ns)
        if len(acc.fetch_us) < wire.MAX_SAMPLES:
            acc.fetch_us.append((sample.fetch_ns - collate_ns) // 1000)
            acc.collate_us.append(collate_ns // 1000)
        acc.fetch_buckets.add_one(sample.fetch_ns - collate_ns)  # every batch, sampled or not
        if sample.done_ns and len(self._done) < PAIR_MAX_PENDING:
            self._done[key] = sample.done_ns
        acc.last_done_ns = max(acc.last_done_ns, sample.done_ns)
        if sample.tensors is not None and sample.tensor_bytes is not None:
            self._tensors = (sample.tensors, sample.tensor_bytes)
        acc.wall_ns += sample.fetch_ns
        acc.cpu_ns += sample.cpu_ns
        acc.dropped = sample.dropped

    def add_worker_start(self, start: wire.WorkerStart) -> None:
        """A worker process's first message: the random states it starts with."""
        self._resolve_epochs()
        if len(self._rng) >= wire.MAX_WORKERS:
            current = {pid for _, pid, _ in self._worker_procs}
            self._rng = {pid: v for pid, v in self._rng.items() if pid in current}
        if len(self._rng) < wire.MAX_WORKERS:
            self._rng[start.pid] = (start.worker_id, dict(start.digests))
        # Only a path of the two shapes the worker makes, for that very pid: nothing read from
        # the socket names a file we would otherwise open.
        if start.stack_file is not None and stacks.is_worker_stack_file(
                start.stack_file, start.pid, self.stack_dir):
            self._remember_stack_file(start.pid, start.stack_file)

    def _rng_report(self) -> tuple[int, list[wire.RngShare]]:
        """Of this epoch's workers, how many were read, and the states two or more share."""
        current = [(wid, pid) for wid, pid, _ in self._worker_procs if pid in self._rng]
        by_state: dict[str, dict[str, list[int]]] = {}
        for wid, pid in current:
            for state, digest in self._rng[pid][1].items():
                by_state.setdefault(state, {}).setdefault(digest, []).append(wid)
        shared: list[wire.RngShare] = []
        for state, groups in by_state.items():
            for wids in groups.values():
                if len(wids) >= 2 and len(shared) < 64:
                    # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
                    shared.append(wire.RngShare(state=state, workers=sorted(wids)))  # type: ignore[arg-type]
        return len(current), shared

    def sample_workers(self) -> None:
        """Liveness, CPU % and RSS of the current iterator's workers (~1 Hz); CPU and RSS only
        once a viewer has subscribed (psutil: see publisher._loading)."""
        self._resolve_epochs()
        psutil = resources.psutil
        it = self.iterator
        if it is not None:
            self._worker_procs = torch_internals.worker_pids(it)
        it = None  # not held through the psutil reads below (see sample_queue)
        # Once the iterator is gone (a break, an epoch end, a worker death raising in the loop),
        # the remembered Process objects still tell how each worker ended.
        status = {}
        seen = set()
        for wid, pid, proc in self._worker_procs:
            alive, exitcode = torch_internals.worker_state(pid, proc)
            cpu = rss = None
            if pid is not None and alive:
                seen.add(pid)
            if pid is not None and alive and psutil is not None:
                ps = self._psutil.get(pid)
                try:
                    if ps is None:
                        ps = self._psutil[pid] = psutil.Process(pid)
                        ps.cpu_percent(None)  # primes the delta; the first figure is unknown
                    else:
                        cpu = ps.cpu_percent(None)
                    # 0 while the worker exits (its memory already unmapped, not yet reaped):
                    # not a figure (docs/contract.md §3: unknown is null, never a made-up 0)
                    rss = ps.memory_info().rss or None
                except psutil.Error:
                    pass
            status[wid] = (pid, alive, exitcode, cpu, rss)
        for pid in self._alive_pids - seen:
            self._psutil.pop(pid, None)
            self._stack_files.pop(pid, None)
            if self.stack_dir:  # a worker gone: its stack files too
                stacks.remove_worker_files(self.stack_dir, pid)
        self._alive_pids = seen
        self._worker_status = status
        self._update_busy(self.iterator, time.perf_counter_ns())  # read anew: see above

    def had_worker(self, pids: set[int]) -> bool:
        """Whether one of `pids` was a worker of this loader's latest epoch."""
        return any(pid in pids for _, pid, _ in self._worker_procs)

    def worker_pid_pairs(self) -> list[tuple[int, int]]:
        """(worker id, pid) of the current epoch's workers that were alive at the last sample."""
        return [(wid, st[0]) for wid, st in sorted(self._worker_status.items())
                if st[0] is not None and st[1]]
