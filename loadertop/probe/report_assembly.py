"""Report assembly: the figures the next report covers (reset after each), and the report, its
workers' part and the goodbye built from every seam's state (publisher thread only)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from loadertop import wire
from loadertop.probe import torch_internals
from loadertop.probe.histograms import decimated_micros
from loadertop.probe.worker_resources import _WorkerAccum

if TYPE_CHECKING:  # the state of every seam (record_state.py); object at run time
    from loadertop.probe.record_state import RecordState
else:
    RecordState = object


class ReportAssembly(RecordState):
    """LoaderRecord's reports (a mixin: see record.py)."""

    def _init_report_assembly(self) -> None:
        self.seq = 0
        self._interval_start_ns = time.perf_counter_ns()
        self._reset_interval()
        # (process CPU ns, loop clock id, loop CPU ns) at the last report: the next report's
        # process_cpu_ns and loop_cpu_ns are the differences.
        self._cpu_mark: tuple[int, int | None, int | None] = (time.process_time_ns(), None, None)
        # --- slow readings: set by the publisher every RESOURCE_S, sent with the next report ---
        self.pending_resources: wire.ResourceReport | None = None

    def _reset_interval(self) -> None:
        self._batches = 0
        self._wait_ns = 0
        self._step_ns = 0
        self._wait_samples: list[int] = []  # ns, converted to µs once decimated, at report time
        self._step_samples: list[int] = []
        self._q_samples = 0
        self._q_ready_sum = 0
        self._q_flight_sum = 0
        self._q_waiting = 0
        self._q_waiting_ready = 0
        self._q_waiting_cpu = 0
        self._q_waiting_wall = 0
        self._q_last: torch_internals.QueueDepth | None = None
        self._loop_us: list[int] = []
        self._loop_wall = 0
        self._loop_cpu = 0
        self._paired = 0
        self._producing_ns = 0
        self._handoff_ns = 0
        self._handoff_samples: list[int] = []
        self._stage_fetch: list[int] = []  # num_workers=0, ns
        self._stage_collate: list[int] = []

    def report(self, now_ns: int, sent_at: float, probe_cpu_fraction: float | None,
               watched: bool = False) -> wire.LoaderReport:
        """The next report. `watched`: a viewer is subscribed, so a worker stuck in one batch is
        asked for its stack (a signal: see `_worker_stack`)."""
        self.drain()
        if self.autotune is not None:  # `run --autotune`: measures inside the epoch, may switch
            self.autotune.tick(self.batches_total, self._prev_t1, self._wait_ns,
                               now_ns - self._interval_start_ns,
                               sum(acc.wall_ns for acc in self._workers.values()))
        if self.config.num_workers:
            self.match_stages(now_ns)
        if self._error_new:
            # The loop just raised: a dead worker is the likely cause; read how they are now.
            self._error_new = False
            self.sample_workers()
        if self._worker_procs and not self._worker_status:
            # A new epoch's workers (attach cleared the last epoch's status): their liveness goes
            # out in this report, not after the next 1 Hz sample, else each epoch's first second
            # reads "alive: unknown" for every worker.
            self.sample_workers()
        start = self._interval_start_ns
        blocked_since = self.in_next_since
        blocked_ms = None
        wait_ns = self._wait_ns
        if blocked_since:
            blocked_ms = max(0, now_ns - blocked_since) / 1e6
            wait_ns += max(0, now_ns - max(blocked_since, start))
        workers = self._worker_reports(now_ns, watched)
        q = self._q_last
        queue = wire.QueueReport(
            capacity=(self.config.num_workers * (self.config.prefetch_factor or 0)),
            ready=q.ready if q else (0 if self.config.num_workers == 0 else None),
            in_flight=q.in_flight if q else (0 if self.config.num_workers == 0 else None),
            samples=self._q_samples,
            ready_sum=self._q_ready_sum,
            in_flight_sum=self._q_flight_sum,
            waiting_samples=self._q_waiting,
            waiting_ready_samples=self._q_waiting_ready,
            waiting_cpu_ns=self._q_waiting_cpu,
            waiting_wall_ns=self._q_waiting_wall,
        )
        dropped = self.dropped + sum(w.dropped for w in self._workers.values())
        rng_checked, rng_shared = self._rng_report()
        # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
        msg = wire.LoaderReport(
            source=self.source, seq=self.seq, host=self.host, pid=os.getpid(), name=self.name,
            rank=self.rank, command=self.command, process_started_at=self.process_started_at,
            sent_at=sent_at, interval_s=min(3600.0, max(0, now_ns - start) / 1e9),
            config=self.config, epoch=self.epoch, batches=self._batches,
            batches_total=self.batches_total, wait_ns=wait_ns, step_ns=self._step_ns,
            wait_us=decimated_micros(self._wait_samples),  # type: ignore[arg-type]
            step_us=decimated_micros(self._step_samples),  # type: ignore[arg-type]
            blocked_ms=blocked_ms, queue=queue, workers=workers,  # type: ignore[arg-type]
            # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
            loop_fetch_us=wire.decimate(self._loop_us), loop_fetch_wall_ns=self._loop_wall,  # type: ignore[arg-type]
            loop_fetch_cpu_ns=self._loop_cpu, dropped=dropped,
            probe_cpu_fraction=probe_cpu_fraction, stages=self.stage_report(),
            resources=self.pending_resources, loop_stack=self._loop_stack_now(now_ns),
            error=self.error, epoch_starts_ms=list(self._epoch_starts_ms),  # type: ignore[arg-type]
            epochs=tuple(self._epochs),
            rng_checked=rng_checked, rng_shared=rng_shared, **self._cpu_used(),  # type: ignore[arg-type]
            wait_histogram=self._wait_buckets.histogram(),
            step_histogram=self._step_buckets.histogram(),
            autotune=self.autotune.report() if self.autotune is not None else None,
        )
        self.pending_resources = None
        self.seq += 1
        self._interval_start_ns = now_ns
        self._reset_interval()
        for acc in self._workers.values():
            acc.reset()
        return msg

    def _cpu_used(self) -> dict[str, int | None]:
        """CPU used since the last report by the training process (CLOCK_PROCESS_CPUTIME_ID:
        every thread — the loop, pin_memory's thread, this probe thread — and no child) and by
        the loop's thread (its own CPU clock, read from here): what the advice subtracts from the
        cores before it counts workers."""
        process = time.process_time_ns()
        clock = self._loop_cpu_clock
        loop = None
        if clock is not None:
            try:
                loop = time.clock_gettime_ns(clock)
            except OSError:  # the thread is gone
                clock = None
        last_process, last_clock, last_loop = self._cpu_mark
        self._cpu_mark = (process, clock, loop)
        loop_used = None
        if loop is not None and last_loop is not None and clock == last_clock:
            loop_used = max(0, loop - last_loop)
        return {"process_cpu_ns": max(0, process - last_process), "loop_cpu_ns": loop_used}

    def _worker_reports(self, now_ns: int, watched: bool) -> list[wire.WorkerReport]:
        out = []
        ids = set(self._worker_status) | set(self._workers)
        for wid in sorted(i for i in ids if i < self.config.num_workers):
            acc = self._workers.get(wid) or _WorkerAccum()
            pid, alive, exitcode, cpu, rss = self._worker_status.get(
                wid, (acc.pid, None, None, None, None))
            # arg-type: lists go out as tuples do (msgpack arrays), wire's types are as decoded
            out.append(wire.WorkerReport(
                id=wid, pid=pid, alive=alive, exitcode=exitcode, cpu_percent=cpu, rss_bytes=rss,
                batches=acc.batches, fetch_us=list(acc.fetch_us), fetch_wall_ns=acc.wall_ns,  # type: ignore[arg-type]
                fetch_cpu_ns=acc.cpu_ns, collate_us=list(acc.collate_us),  # type: ignore[arg-type]
                busy_ms=self._busy_ms(wid, now_ns) if alive is not False else None,
                stack=self._worker_stack(wid, pid, now_ns, watched) if alive is not False
                else None,
                fetch_histogram=acc.fetch_buckets.histogram(),
            ))
        return out

    def goodbye(self, sent_at: float) -> wire.Goodbye:
        self.drain()
        msg = wire.Goodbye(source=self.source, seq=self.seq, sent_at=sent_at,
                           batches_total=self.batches_total, error=self.error)
        self.seq += 1
        return msg
