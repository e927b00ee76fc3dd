"""The rolling state of everything a viewer has received, and the one computation of each figure.

    model = Model(window_s=3.0)
    model.ingest(message, received_at, endpoint)   # as messages arrive (cheap: a deque append)
    model.advance(now)                             # once per refresh: forget, diagnose, stabilize
    doc = model.document()                         # the typed docs/contract.md §3 document, as of `now`

`advance` is the only step with effects: it drops sources gone for good, diagnoses every source and
steps the verdict stabilizer (whose persistence counts refreshes), then builds the `Document`.
`document()` only returns it, so however often a view asks, it sees the same thing. `loadertop
snapshot`, `--once` and the TUI all read that document, so a figure means the same everywhere.

No torch, no zmq, no textual: messages come in already decoded by `loadertop.wire`.

Longer than this package's other modules (~550 lines) on purpose: every figure a view shows is
computed here once, from one window (`client/window.py` sums its reports), so that the TUI, the
snapshot, the report and the exporter cannot disagree.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import msgspec

from loadertop import diagnosis, findings, wire
from loadertop.client import ranks
from loadertop.client.distributions import stats_of_parts
from loadertop.client.document import (
    SNAPSHOT_SCHEMA,
    AutotuneBest,
    AutotuneFigures,
    AutotuneSwitchFigures,
    AutotuneTried,
    Document,
    EndFigures,
    EpochFigures,
    Finding,
    HistogramFigures,
    LoaderConfig,
    LoopFigures,
    QueueFigures,
    RngFigures,
    RngShareFigures,
    ShmFigures,
    Source,
    SourceFigures,
    StackFigures,
    StageFigures,
    State,
    Stats,
    SystemFigures,
    Verdict,
    ViewerStatus,
    WaitSplit,
    WorkerFigures,
)
from loadertop.client.ending import Ending, end_figures, finished, raised
from loadertop.client.hysteresis import VerdictStabilizer
from loadertop.client.resources import ResourceHistory
from loadertop.client.settings import SettingHistory
from loadertop.client.window import Window

HISTORY_S = 120.0  # reports kept per source (the longest window a viewer can ask for)
GONE_AFTER_S = 3.0  # no report for this long (reports come every 0.25 s): the source is gone
FORGET_AFTER_S = 600.0  # finished/gone sources stay visible this long, then are dropped
SYSTEM_STALE_S = 10.0  # machine figures older than this are not shown as current
LATE_REPORT_S = 1.0  # a report this old says the probe's thread is starved or frozen
LOOP_CPU_MIN_WALL_NS = 100_000_000  # loop CPU share while waiting: only from >= 100 ms of long waits
WAITING_FRACTION = 0.5  # the state is `waiting` when the loop waits at least this share of the time
WAITING_BLOCKED_MS = 1000.0  # ... or has been blocked in next() this long right now
MIN_PAIRED_BATCHES = 3  # wait_split rests on at least this many paired batches
PROCESS_CPU_MIN_S = 0.5  # the training process's CPU in cores: from at least this much time
HISTOGRAM_LE_MS = tuple(bound / 1e6 for bound in wire.HISTOGRAM_BOUNDS_NS)


def _ratio(num: float, den: float, *, min_denominator: float = 0) -> float | None:
    """A CPU-time / wall-time fraction in 0..1 (the contract's range), None without wall time.

    CPU time can exceed wall time by a hair (clock granularity, measured 1.001) or by more when a
    dataset decodes in threads; either way the figure means "computing all the time": 1."""
    if den <= 0 or den < min_denominator:
        return None
    return round(min(1.0, max(0.0, num / den)), 3)


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class SourceState:
    """What the viewer keeps of one source between refreshes."""

    source: str
    reports: deque[tuple[float, wire.LoaderReport]] = field(default_factory=deque)
    last: wire.LoaderReport | None = None
    last_received: float = 0.0
    first_received: float = 0.0
    endpoint: str | None = None
    missed: int = 0  # reports lost on the way (sequence gaps)
    finished_at: float | None = None
    batches_total: int = 0
    resources: ResourceHistory = field(default_factory=ResourceHistory)
    settings: SettingHistory = field(default_factory=SettingHistory)
    error: wire.LoopError | None = None  # the latest exception out of the loop's next()
    # How its process ended, from the job's black box (docs/contract.md §9): found when the
    # source fell silent and its process is gone (no goodbye: SIGKILL, the OOM killer...), or
    # after its goodbye once the process is gone (what only its launcher saw: the exit code).
    ending: Ending | None = None

    def add(self, msg: wire.LoaderReport, now: float) -> None:
        if self.last is not None:
            if msg.seq > self.last.seq + 1:
                self.missed += msg.seq - self.last.seq - 1
            elif msg.seq <= self.last.seq and msg.sent_at >= self.last.sent_at:
                self.missed = 0  # the process restarted its numbering (a new run, same id)
        else:
            self.first_received = now
        self.reports.append((now, msg))
        self.last = msg
        self.last_received = now
        self.batches_total = msg.batches_total
        self.finished_at = None
        self.ending = None
        if msg.resources is not None:
            self.resources.add(msg.resources, now)
        self.settings.add(msg, now)
        self.error = msg.error  # the probe clears it when a new epoch begins

    def prune(self, now: float) -> None:
        while self.reports and self.reports[0][0] < now - HISTORY_S:
            self.reports.popleft()

    def sort_key(self) -> tuple[int, str, int, float]:
        last = self.last
        return (last.rank if last is not None and last.rank is not None else -1,
                last.host if last is not None else "", last.pid if last is not None else 0,
                self.first_received)


def _cores(cpu_ns: int, seconds: float) -> float | None:
    """CPU time over the time it covers, in cores; None from less than PROCESS_CPU_MIN_S."""
    if seconds < PROCESS_CPU_MIN_S:
        return None
    return round(cpu_ns / (seconds * 1e9), 3)


@dataclass
class _SystemEntry:
    received: float
    figures: SystemFigures  # age_s filled in when a document is built


class Model:
    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = float(window_s)
        self.sources: dict[str, SourceState] = {}
        self.systems: dict[str, _SystemEntry] = {}
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self.endpoints: dict[str, float | None] = {}  # endpoint -> last time it delivered
        self.discovery_dir: str | None = None
        self.stabilizer = VerdictStabilizer()
        self.findings = findings.FindingTracker()
        self._document: Document | None = None

    # ------------------------------------------------------------ ingest
    def ingest(self, msg: wire.Message, now: float, endpoint: str | None = None) -> None:
        self.received += 1
        if endpoint is not None:
            self.endpoints[endpoint] = now
        if isinstance(msg, wire.LoaderReport):
            state = self.sources.get(msg.source)
            if state is None:
                state = self.sources[msg.source] = SourceState(msg.source, endpoint=endpoint)
            state.add(msg, now)
            state.prune(now)
        elif isinstance(msg, wire.SystemReport):
            try:
                figures = system_figures_of(msg)
            except msgspec.ValidationError:  # e.g. a GPU at 300 % util: valid msgpack, bad figures
                self.reject("malformed")
                return
            previous = self.systems.get(msg.host)
            peak = previous.figures.disk_read_peak_bytes_per_s if previous is not None else None
            rate = figures.disk_read_bytes_per_s
            if rate is not None and (peak is None or rate > peak):
                peak = rate
            figures = msgspec.structs.replace(figures, disk_read_peak_bytes_per_s=peak)
            self.systems[msg.host] = _SystemEntry(now, figures)
        elif isinstance(msg, wire.Goodbye):
            state = self.sources.get(msg.source)
            if state is not None:
                state.finished_at = now
                state.batches_total = max(state.batches_total, msg.batches_total)
                if msg.error is not None:
                    state.error = msg.error

    def reject(self, reason: str) -> None:
        """Count a frame that `wire.decode` refused (by its reason)."""
        self.rejected[reason] += 1

    def add_endpoint(self, endpoint: str) -> None:
        self.endpoints.setdefault(endpoint, None)

    def mark_ended(self, source: str, ending: Ending) -> None:
        """The process of `source` is gone and ended so (its black box says): without a goodbye,
        the source died; after one, this is the end the goodbye could not tell (a signal, the
        exit code). A later report from it (it was only silent) clears this."""
        state = self.sources.get(source)
        if state is not None:
            state.ending = ending

    # ------------------------------------------------------------ the refresh
    def advance(self, now: float) -> Document:
        """Move to `now`: forget sources gone for good, diagnose every source (one step of the
        verdict stabilizer each) and build the document that `document()` returns until the
        next call. Call it once per refresh."""
        for sid, state in list(self.sources.items()):
            if now - state.last_received > FORGET_AFTER_S:
                del self.sources[sid]
                self.stabilizer.forget(sid)
                self.findings.forget(sid)
        sources: list[Source] = []
        every_finding: list[Finding] = []
        verdicts: list[tuple[str, Verdict]] = []
        for state in sorted(self.sources.values(), key=SourceState.sort_key):
            if state.last is None:
                continue
            figures = self.source_figures(state, now)
            system = self.system_figures(figures.host, now)
            verdict = diagnosis.diagnose(figures, system, self.stabilizer.shown_category(state.source))
            shown = self.stabilizer.update(  # a held verdict said with today's figures
                state.source, verdict, now, partial(diagnosis.restate, source=figures, system=system))
            verdicts.append((state.source, shown))
            found = self.findings.update(state.source, findings.detect(figures, system), now)
            every_finding.extend(found)
            sources.append(Source(**msgspec.structs.asdict(figures), diagnosis=shown,
                                  findings=found))
        live_hosts = [s.host for s in sources if s.state not in ("gone", "finished")]
        system = self.system_figures(live_hosts[0] if live_hosts else None, now)
        if system is not None:
            every_finding.extend(
                self.findings.update(f"machine:{system.host}", findings.machine(system), now))
        last_data = max((t for t in self.endpoints.values() if t is not None), default=None)
        rank_figures = ranks.overview(sources)  # the straggler among ranks (client/ranks.py)
        self._document = Document(
            schema=SNAPSHOT_SCHEMA,
            taken_at=round(now, 3),
            window_s=self.window_s,
            sources=tuple(sources),
            system=system,
            # with ranks, the straggler's verdict, said of it (issue 37)
            diagnosis=diagnosis.overall(verdicts, system, rank_figures),
            findings=findings.ordered(every_finding),
            ranks=rank_figures,
            viewer=ViewerStatus(
                endpoints=tuple(sorted(self.endpoints)),
                connected=last_data is not None and now - last_data <= GONE_AFTER_S,
                received=self.received,
                bad_messages=sum(v for k, v in self.rejected.items() if k != "wrong_version"),
                wrong_version=self.rejected.get("wrong_version", 0),
                discovery_dir=self.discovery_dir,
            ),
        )
        return self._document

    def document(self) -> Document:
        """The document built by the last `advance` (no effects: ask as often as you like)."""
        if self._document is None:
            raise RuntimeError("Model.document() before the first advance(now)")
        return self._document

    # ------------------------------------------------------------ figures
    def source_figures(self, state: SourceState, now: float) -> SourceFigures:
        last = state.last
        assert last is not None
        window = Window(state.reports, now - self.window_s)
        batches, covered = window.batches, window.covered
        wait_ms = stats_of_parts(window.wait_us)
        rate = batches / covered if covered > 0 else None
        batch_size = last.config.batch_size
        age = max(0.0, now - state.last_received)
        live = state.finished_at is None and state.ending is None and age <= GONE_AFTER_S
        blocked_ms = None
        if last.blocked_ms is not None and live:
            # Reports arrive every 0.25 s; only a late one means the loop is still blocked now.
            late = age if age > LATE_REPORT_S else 0.0
            blocked_ms = round(last.blocked_ms + late * 1000.0, 1)
        workers = self._workers(last, window, state.resources)
        wait_fraction = (round(min(1.0, window.wait_ns / (covered * 1e9)), 3) if covered > 0
                         else None)
        config = last.config
        return SourceFigures(
            id=state.source,
            host=last.host,
            pid=last.pid,
            rank=last.rank,
            name=last.name,
            state=self._state(state, live, blocked_ms, batches, wait_fraction, workers,
                              diagnosis.stall_threshold_ms(wait_ms, state.batches_total)),
            config=LoaderConfig(
                num_workers=config.num_workers, batch_size=batch_size,
                prefetch_factor=config.prefetch_factor, pin_memory=config.pin_memory,
                persistent_workers=config.persistent_workers, dataset=config.dataset,
                worker_context=config.worker_context),
            batches=batches,
            batches_total=state.batches_total,
            batches_per_s=_round(rate),
            samples_per_s=_round(rate * batch_size) if rate is not None and batch_size else None,
            wait_ms=wait_ms,
            step_ms=stats_of_parts(window.step_us),
            wait_fraction=wait_fraction,
            blocked_ms=blocked_ms,
            queue=self._queue(last, window),
            workers=workers,
            loop=self._loop(last, window, wait_ms),
            epoch=last.epoch,
            command=last.command,
            endpoint=state.endpoint,
            started_at=last.process_started_at,
            age_s=round(age, 2),
            window_s=round(covered, 3),
            dropped=state.missed + last.dropped,
            probe_cpu_fraction=_round(last.probe_cpu_fraction, 4),
            stages=self._stages(last, window),
            process=msgspec.structs.replace(
                state.resources.process(now),
                cpu_cores=_cores(window.process_cpu_ns, window.process_cpu_s),
                loop_cpu_cores=_cores(window.loop_cpu_ns, window.loop_cpu_s)),
            loop_stack=_stack(last.loop_stack) if live else None,
            end=self._end(state),
            epoch_starts_ms=tuple(round(v, 1) for v in last.epoch_starts_ms),
            epochs=tuple(EpochFigures(epoch=e.epoch, start_ms=e.start_ms, first_wait_ms=e.first_wait_ms,
                                      run_ms=e.run_ms, run_wait_ms=e.run_wait_ms)
                         for e in last.epochs),
            rng=RngFigures(checked_workers=last.rng_checked, shared=tuple(
                RngShareFigures(state=r.state, workers=tuple(r.workers)) for r in last.rng_shared)),
            earlier_settings=state.settings.earlier(),
            wait_histogram=histogram_figures(last.wait_histogram),
            step_histogram=histogram_figures(last.step_histogram),
            autotune=_autotune(last.autotune),
        )

    @staticmethod
    def _end(state: SourceState) -> EndFigures | None:
        """How the loop ended, in the job's words (`client.ending`, docs/contract.md §9): its
        process's end where its black box told it, else the exception out of next() or the
        goodbye; None while it runs."""
        error = state.error
        said = f"{error.type}: {error.message}" if error is not None else None
        pid = state.last.pid if state.last is not None else 0
        if state.ending is not None:
            at = state.finished_at if state.finished_at is not None else state.last_received
            return end_figures(state.ending, pid, error=said, at=at)
        if error is not None:
            return end_figures(raised(error.type, error.message), pid, error=said, at=error.at)
        if state.finished_at is not None:
            return end_figures(finished(), pid, at=state.finished_at)
        return None

    @staticmethod
    def _queue(last: wire.LoaderReport, window: Window) -> QueueFigures:
        samples, waiting = window.queue_samples, window.queue_waiting_samples
        q = last.queue
        return QueueFigures(
            ready=q.ready,
            in_flight=q.in_flight,
            capacity=q.capacity,
            ready_mean=round(window.queue_ready_sum / samples, 2) if samples else None,
            in_flight_mean=round(window.queue_in_flight_sum / samples, 2) if samples else None,
            ready_when_waiting=(round(window.queue_waiting_ready_samples / waiting, 3)
                                if waiting else None),
            waiting_samples=waiting,
            loop_cpu_when_waiting=_ratio(window.queue_waiting_cpu_ns, window.queue_waiting_wall_ns,
                                         min_denominator=LOOP_CPU_MIN_WALL_NS),
        )

    @staticmethod
    def _workers(last: wire.LoaderReport, window: Window,
                 resources: ResourceHistory) -> tuple[WorkerFigures, ...]:
        out = []
        window_workers = window.workers
        for w in last.workers:
            if w.pid is not None:
                sums = window_workers.get((w.id, w.pid))
                if sums is not None:
                    fetch_us, collate_us, batches, wall, cpu = sums
                else:
                    fetch_us, collate_us = [], []
                    batches = wall = cpu = 0
            else:  # no pid to tell its processes apart: all of this id's
                fetch_us, collate_us = [], []
                batches = wall = cpu = 0
                for (wid, _), (fetch, collate, n, wall_ns, cpu_ns) in window_workers.items():
                    if wid == w.id:
                        fetch_us += fetch
                        collate_us += collate
                        batches += n
                        wall += wall_ns
                        cpu += cpu_ns
            slow = resources.worker(w.id, w.pid)
            cpu_percent, busy_ms = w.cpu_percent, w.busy_ms
            out.append(WorkerFigures(
                id=w.id, pid=w.pid, alive=w.alive, exitcode=w.exitcode,
                cpu_percent=None if cpu_percent is None else round(cpu_percent, 1),
                rss_bytes=w.rss_bytes, batches=batches,
                fetch_ms=stats_of_parts(fetch_us), collate_ms=stats_of_parts(collate_us),
                cpu_fraction=_ratio(cpu, wall),
                busy_ms=None if busy_ms is None else round(busy_ms, 1),
                stack=None if w.stack is None else _stack(w.stack),
                uss_bytes=slow.uss_bytes, pss_bytes=slow.pss_bytes, fds=slow.fds,
                threads=slow.threads, uss_trend=slow.uss_trend, rss_trend=slow.rss_trend,
                fetch_histogram=histogram_figures(w.fetch_histogram)))
        return tuple(out)

    @staticmethod
    def _stages(last: wire.LoaderReport, window: Window) -> StageFigures:
        staged = window.stages
        fetch_us: list[Sequence[int]] = []
        collate_us: list[Sequence[int]] = []
        handoff_us: list[Sequence[int]] = []
        paired = producing = handoff = 0
        for st in staged:
            paired += st.paired
            producing += st.producing_ns
            handoff += st.handoff_ns
            handoff_us.append(st.handoff_us)
        if last.config.num_workers == 0:
            for st in staged:  # num_workers=0 only: the workers report theirs
                fetch_us.append(st.fetch_us)
                collate_us.append(st.collate_us)
        else:
            for sums in window.workers.values():  # every worker process of the window
                fetch_us += sums[0]
                collate_us += sums[1]
        split = None
        if paired >= MIN_PAIRED_BATCHES and producing + handoff > 0:
            share = round(producing / (producing + handoff), 3)
            split = WaitSplit(producing=share, handoff=round(1.0 - share, 3))
        unpaired = None
        if not paired:
            unpaired = next((st.unpaired for st in reversed(staged) if st.unpaired), None)
        census = next(((st.batch_tensors, st.batch_bytes) for st in reversed(staged)
                       if st.batch_tensors is not None), (None, None))
        return StageFigures(
            fetch_ms=stats_of_parts(fetch_us), collate_ms=stats_of_parts(collate_us),
            handoff_ms=stats_of_parts(handoff_us) if paired else None,
            wait_split=split, batches_paired=paired, unpaired=unpaired,
            tensors_per_batch=census[0], bytes_per_batch=census[1])

    @staticmethod
    def _loop(last: wire.LoaderReport, window: Window, wait_ms: Stats | None) -> LoopFigures:
        if last.config.num_workers != 0:
            return LoopFigures(fetch_ms=None, cpu_fraction=None)
        # With num_workers=0 the loop's wait in next() *is* the fetch (the same samples: the same
        # figures, not sorted twice); its CPU share is sampled.
        return LoopFigures(fetch_ms=wait_ms,
                           cpu_fraction=_ratio(window.loop_fetch_cpu_ns, window.loop_fetch_wall_ns))

    @staticmethod
    def _state(state: SourceState, live: bool, blocked_ms: float | None, batches: int,
               wait_fraction: float | None, workers: Sequence[WorkerFigures],
               stall_ms: float) -> State:
        if state.finished_at is not None:
            return "finished"
        if not live:
            return "gone"
        if blocked_ms is not None and blocked_ms >= stall_ms:
            return "stalled"
        if any(w.alive is False and w.exitcode not in (0, None) for w in workers):
            return "stalled"
        if batches == 0 and blocked_ms is None:
            return "idle"
        if (wait_fraction or 0.0) >= WAITING_FRACTION or (blocked_ms or 0.0) >= WAITING_BLOCKED_MS:
            return "waiting"
        return "running"

    def system_figures(self, host: str | None, now: float) -> SystemFigures | None:
        """The latest figures of `host`'s machine (else of the freshest machine), None when
        nothing recent arrived."""
        entry = self.systems.get(host) if host is not None else None
        if entry is None and self.systems:
            entry = max(self.systems.values(), key=lambda e: e.received)
        if entry is None or now - entry.received > SYSTEM_STALE_S:
            return None
        return msgspec.structs.replace(entry.figures, age_s=round(now - entry.received, 2))


def system_figures_of(report: wire.SystemReport) -> SystemFigures:
    """A machine report as document figures, validated against the document's ranges (the wire
    checks types and sizes; a percentage above 100 is caught here). The wire's fields carry over
    by name, GPUs and cgroup included; `seq` and the flat `shm_*` are the wire's own."""
    fields = msgspec.structs.asdict(report)
    fields["age_s"] = 0.0
    shm = None
    if report.shm_path is not None and report.shm_total_bytes is not None \
            and report.shm_free_bytes is not None:
        shm = ShmFigures(path=report.shm_path, total_bytes=report.shm_total_bytes,
                         free_bytes=min(report.shm_free_bytes, report.shm_total_bytes))
    for key in ("shm_path", "shm_total_bytes", "shm_free_bytes"):
        del fields[key]
    fields["shm"] = shm
    return msgspec.convert(fields, SystemFigures, from_attributes=True)


def histogram_figures(histogram: wire.Histogram | None) -> HistogramFigures | None:
    """The probe's cumulative bucket counts as document figures; None without them, or when
    they are not counted in this version's buckets (a foreign probe's: never guessed at)."""
    if histogram is None or len(histogram.counts) != len(HISTOGRAM_LE_MS) + 1:
        return None
    return HistogramFigures(le_ms=HISTOGRAM_LE_MS, counts=tuple(histogram.counts),
                            count=sum(histogram.counts), sum_ms=histogram.sum_ns / 1e6)


def _stack(stack: wire.Stack | None) -> StackFigures | None:
    if stack is None:
        return None
    user = stack.user_frame if stack.user_frame is not None and \
        stack.user_frame < len(stack.frames) else None
    return StackFigures(frames=tuple(stack.frames), user_frame=user, taken_at=stack.taken_at)


def _autotune(report: wire.AutotuneReport | None) -> AutotuneFigures | None:
    """The probe's `run --autotune` state as the document shows it (docs/contract.md §10)."""
    if report is None:
        return None
    best = (AutotuneBest(num_workers=report.best_num_workers,
                         samples_per_s=_round(report.best_samples_per_s))
            if report.best_num_workers is not None else None)
    return AutotuneFigures(
        state=report.state, num_workers=report.num_workers,
        program_num_workers=report.program_num_workers, epoch=report.epoch, best=best,
        tried=tuple(AutotuneTried(num_workers=t.num_workers, samples_per_s=_round(t.samples_per_s),
                                  noise=round(t.noise, 4), epochs=t.epochs, note=t.note,
                                  windows=t.windows)
                    for t in report.tried),
        reason=report.reason,
        switches=tuple(AutotuneSwitchFigures(
            epoch=s.epoch, batch=s.batch, from_workers=s.from_workers, to_workers=s.to_workers,
            reason=s.reason, gain=round(s.gain, 4) if s.gain is not None else None,
            prefetch_factor=s.prefetch_factor)
            for s in report.switches),
        switch_count=report.switch_count, fixed=report.fixed,
        prefetch_factor=report.prefetch_factor,
        program_prefetch_factor=report.program_prefetch_factor)
