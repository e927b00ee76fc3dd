"""Name the bottleneck: pure functions from a window of figures to a verdict.

No I/O and no torch / textual / zmq here (the standard library and the document's types only), so
the viewer, `snapshot --json` and the tests all judge alike.

    verdict = diagnose(source, system, previous=stabilizer.shown_category(source_id))
    shown = stabilizer.update(source_id, verdict, now)       # hysteresis between refreshes
    top = overall([(source_id, shown), ...], system, ranks)    # the most urgent, plus "source"
                                                               # (with ranks: the straggler's)

`source` is a `SourceFigures` and `system` a `SystemFigures` (or None) of `loadertop.client.document`;
a verdict is a frozen `Verdict`: category, summary, evidence, advice (CONTRACT §3/§4). Every
figure may be None (unknown) or, from a broken reading, not finite: a rule treats both as "no
evidence" and never invents a value.

Two layers of hysteresis keep a steady workload from flickering between categories:

* **margins** (in `diagnose`, given the category shown now as ``previous``): a threshold is crossed
  at one value and crossed back only past a second one, e.g. the loop becomes input-bound at a wait
  fraction >= 10 % but goes back to compute-bound only below 7 %. The evidence names the threshold
  a user should read (10 %), and the margin only when it decided ("held until below 7 %");
* **persistence** (`VerdictStabilizer`): a new category replaces the shown one only after
  `STABLE_UPDATES` consecutive updates (or `STABLE_SECONDS` over at least two), except the urgent
  ones (`stalled`, `memory_pressure`), which show at once.

Precedence inside `diagnose`: stalled > memory_pressure > idle > insufficient_data > compute_bound >
(the loop waits:) main_process_bound > cpu_saturated > input_bound_io > input_bound_cpu.
A stall (a dead worker, a loop blocked far longer than usual) is checked before memory pressure
because it means training has stopped, and a worker killed by SIGKILL under memory pressure is
most likely the OOM killer's doing: the stalled verdict then carries the memory evidence and advice
too, so nothing is lost. See the README ("How the bottleneck is named") for every threshold and the
reason for it.
"""

from __future__ import annotations

import math
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from loadertop.client.document import (
    Category,
    GpuFigures,
    OverallVerdict,
    Ranks,
    SettingFigures,
    SourceFigures,
    StackFigures,
    Stats,
    SystemFigures,
    Verdict,
    WorkerFigures,
)

# ---------------------------------------------------------------------------------------------
# Category names (CONTRACT §4): defined once here, imported elsewhere. `document.Category` is the
# same set as a type (a test checks it).
# ---------------------------------------------------------------------------------------------
IDLE: Final = "idle"
INSUFFICIENT_DATA: Final = "insufficient_data"
COMPUTE_BOUND: Final = "compute_bound"
INPUT_BOUND_IO: Final = "input_bound_io"
INPUT_BOUND_CPU: Final = "input_bound_cpu"
CPU_SATURATED: Final = "cpu_saturated"
MAIN_PROCESS_BOUND: Final = "main_process_bound"
MEMORY_PRESSURE: Final = "memory_pressure"
STALLED: Final = "stalled"

CATEGORIES: tuple[Category, ...] = (
    IDLE, INSUFFICIENT_DATA, COMPUTE_BOUND, INPUT_BOUND_IO, INPUT_BOUND_CPU,
    CPU_SATURATED, MAIN_PROCESS_BOUND, MEMORY_PRESSURE, STALLED,
)

# Shown at once by VerdictStabilizer: waiting a few refreshes to report a dead worker or a machine
# about to swap itself to death helps nobody.
URGENT_CATEGORIES: frozenset[Category] = frozenset({STALLED, MEMORY_PRESSURE})

# The categories in which the loop waits for data (the margin on the wait fraction applies to them).
INPUT_BOUND_CATEGORIES: frozenset[Category] = frozenset(
    {INPUT_BOUND_IO, INPUT_BOUND_CPU, CPU_SATURATED, MAIN_PROCESS_BOUND})

# `overall` picks the first of these found among the sources (most urgent first):
# - stalled: training makes no progress at all (or is about to crash);
# - memory_pressure: the OOM killer or swapping is next, and it slows every process on the machine;
# - cpu_saturated: machine-wide, and its advice ("fewer workers") overrides other sources' "more";
# - main_process_bound: the one input-bound case that more workers make worse, easy to misread;
# - input_bound_io before input_bound_cpu: the storage fix (format, caching) is the longer job and a
#   slow disk slows every reader of it; the CPU case is usually fixed with one number;
# - compute_bound (healthy, but running) says more than insufficient_data, which says more than idle.
OVERALL_RANK: tuple[Category, ...] = (
    STALLED, MEMORY_PRESSURE, CPU_SATURATED, MAIN_PROCESS_BOUND, INPUT_BOUND_IO,
    INPUT_BOUND_CPU, COMPUTE_BOUND, INSUFFICIENT_DATA, IDLE,
)

# ---------------------------------------------------------------------------------------------
# Thresholds: the only place they are defined. The README repeats them with the reasons, and the
# viewer derives its colour bands from them.
# ---------------------------------------------------------------------------------------------

# Judge a window only with at least this many batches: 1-4 waits are dominated by chance (one slow
# file, the first batch of an epoch).
MIN_BATCHES = 5
# ... unless the loop is slow (steps of seconds, big models): 2 batches covering this much loop time
# (wait + step) are judged too, or such a loop would never leave insufficient_data.
MIN_BATCHES_SLOW = 2
SLOW_WINDOW_MIN_MS = 2000.0

# The loop is input-bound at a wait fraction (waiting / wall time) >= 10 %. PyTorch's profiler
# plugin flagged loading above 5 % of *step* time; 10 % of wall time leaves room for the ordinary
# sub-millisecond cost of next() (unpickling, fd passing) that no setting removes.
WAIT_FRACTION_INPUT_BOUND = 0.10
# ... and goes back to compute-bound only below 7 %: a margin against flicker near 10 %.
WAIT_FRACTION_COMPUTE_BOUND = 0.07

# A GPU busy less than this while the loader keeps up: the step itself leaves it idle.
GPU_UNDERUSED_PERCENT = 70.0

# Batches already fetched and ready in >= 50 % of the samples taken while the loop was blocked in
# next(): the workers are ahead, the main process (receive, unpickle, collate, pin) is the limit.
READY_WHEN_WAITING_MAIN_BOUND = 0.5
READY_WHEN_WAITING_LEAVE = 0.4  # margin: leave main_process_bound only below this
# ... unless the loop's thread was measured off the CPU 3/4 of the time inside next(): blocked on the
# next in-order batch (the "ready" ones arrived out of order or sit in a worker's send buffer) or
# starved of CPU by busy workers — the workers or the CPU are the limit, not the main process.
LOOP_CPU_MAIN_BOUND_MIN = 0.25
# Where stages are measured (CONTRACT §5) the split of the loop's wait decides, with the queue
# samples above as a check (see `_main_bound_evidence`): main-process-bound when at least this
# share of the wait came after the batch was produced (receiving, unpickling, pin_memory,
# in-order waiting).
HANDOFF_MAIN_BOUND = 0.5
HANDOFF_LEAVE = 0.4  # margin: leave main_process_bound only below this
# A handoff is "many small tensors" when a batch holds at least this many tensors averaging under
# SMALL_TENSOR_BYTES: each crosses processes with its own shared-memory handle.
MANY_TENSORS_PER_BATCH = 32
SMALL_TENSOR_BYTES = 64 * 1024

# The machine's CPU (or our workers' share of the cores available to us) is busy >= 90 %: every
# core is in use and one more worker only time-slices with the others.
CPU_SATURATED_PERCENT = 90.0
CPU_SATURATED_LEAVE_PERCENT = 85.0  # margin: leave cpu_saturated only below this
# load_avg_1m >= this x cores_available counts as saturated only when cpu_percent is unknown (first
# sample): Linux's load counts tasks blocked on disk (D state) and, in a container, the whole host,
# and it lags a minute, so it is weaker evidence than a CPU percentage.
LOAD_SATURATED_PER_CORE = 1.0

# Workers busy on CPU less than half of the time they spend producing a batch mostly wait on
# storage, network, sleep or locks: I/O-bound; at or above it they compute.
IO_CPU_FRACTION = 0.5
IO_CPU_FRACTION_MARGIN = 0.05  # the shown side holds until the fraction is 0.05 past the boundary
# iowait at or above this backs an I/O verdict (and decides it when worker CPU figures are missing).
IOWAIT_HIGH_PERCENT = 10.0
# Disk reads at or above this are worth naming in the evidence.
DISK_READ_NOTABLE_BYTES_PER_S = 1024.0 * 1024.0

# Workers are never advised beyond this many per core available: a worker that waits on I/O needs
# no core, but each one costs memory and start-up time.
IO_WORKERS_PER_CORE_MAX = 4
# A worker count is advised only when the model of the loop (see `_WorkerPlan`) predicts at least
# this gain over the current count: below it, a measurement's noise and each worker's memory win.
WORKER_GAIN_MIN = 0.10
# The count advised is the smallest whose predicted throughput is within this of the best count's.
NEAR_BEST = 0.05
# An earlier setting of the same loader with fewer workers that gave throughput within this of
# the current one shows that the extra workers did not help.
MORE_WORKERS_GAIN_MIN = 0.10
# Fetch per batch this many times the earlier setting's, with more workers now: they queue.
FETCH_ROSE_FACTOR = 1.3
# ... and then a gain below this share of what the added workers would give if each kept its
# earlier fetch time (2 -> 6 workers: up to +200 %) says that they mostly queue, even when the gain
# itself is above MORE_WORKERS_GAIN_MIN (seen live: 2 -> 6 workers on a 2-slot store, +5-10 %).
QUEUE_GAIN_SHARE = 0.25
# The training process using this much CPU (in cores) is named as what limits the workers' CPU.
MAIN_BUSY_CORES = 0.5
# The CPU's cap on throughput within this of the rate a worker count is predicted to give: the
# CPU is (nearly) the limit too, so the advice shows the budget it rests on. Measured readings
# move by several percent, so a cap just above the prediction may be the limit in fact.
CPU_NEAR_CAP = 0.15
# Disk reads at this share of the highest rate seen in the run: the disk may be at its limit.
DISK_NEAR_PEAK_SHARE = 0.8
# Many small batches: each costs ~0.5-0.8 ms to receive in the main process (FIELD-NOTES), so from
# 200 batches/s on that overhead alone is >= 10 % of wall time.
TINY_BATCHES_PER_S = 200.0

# Memory: available below 5 % of total (cgroup-aware figures) leaves the kernel reclaiming pages
# and the OOM killer one allocation away.
MEM_AVAILABLE_MIN_FRACTION = 0.05
MEM_AVAILABLE_LEAVE_FRACTION = 0.07  # margin: leave memory_pressure only above this
# Swapping: >= 1 MiB/s (256 pages/s) read back from swap means the working set does not fit.
SWAP_RATE_MIN_BYTES_PER_S = 1024.0 * 1024.0
# Swap-*out* alone counts only when available memory is also below this: with plenty available the
# kernel pushes cold pages out to make room for page cache (e.g. while a dataset is read), harmless.
MEM_AVAILABLE_SWAP_OUT_FRACTION = 0.10

# A loop blocked in next() for >= max(STALL_MIN_MS, STALL_FACTOR x recent p99 wait) is stalled.
# 5 s is above the per-epoch worker start-up of spawn without persistent workers (1.5-3.5 s on the
# reference machine), so a new epoch is not a stall; 10x p99 leaves room for a slow but live tail.
STALL_MIN_MS = 5000.0
STALL_FACTOR = 10.0
# Before the first batch ever (batches_total == 0) there is no history: worker start-up, dataset
# init and (spawn) re-importing torch in every worker take seconds; give it this long.
STALL_NO_HISTORY_MS = 30000.0

# VerdictStabilizer: a new (non-urgent) category must be seen in this many consecutive updates ...
# slow_worker (also a finding): one worker's batch time (items + collate, p50) at least this many
# times the median of the others', and above an absolute floor (scheduling noise at tiny times),
# from at least this many batches of each; only while the loop waits for data (it holds it back).
SLOW_WORKER_FACTOR = 3.0
SLOW_WORKER_MIN_MS = 2.0
SLOW_WORKER_MIN_BATCHES = 3

STABLE_UPDATES = 3
# ... or over this many seconds (at least two consecutive updates) before it is shown.
STABLE_SECONDS = 5.0

_GIB = 1024.0**3
_MIB = 1024.0**2
_KIB = 1024.0
# Products of huge (still valid) figures that overflow to inf are clamped to this before they
# become a worker count: math.floor/ceil of inf raise.
_FLOAT_MAX = sys.float_info.max


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

def diagnose(source: SourceFigures, system: SystemFigures | None,
             previous: Category | None = None) -> Verdict:
    """The verdict for one source.

    ``system`` is the source's machine (None when no figures arrived). ``previous`` is the
    category shown now (e.g. ``VerdictStabilizer.shown_category``): it moves each threshold to its
    "leave" value so that a figure hovering at a boundary keeps the verdict.
    """
    facts = _Facts.read(source, system)

    stall = _stall_verdict(facts)
    memory = _memory_findings(facts.system, previous)
    if stall is not None:
        if memory is not None:
            return _verdict(STALLED, stall.summary, [*stall.evidence, *memory.evidence],
                            [*stall.advice, *_memory_advice(facts)])
        return stall
    if memory is not None:
        return _verdict(MEMORY_PRESSURE, memory.summary, memory.evidence + _worker_rss_evidence(facts),
                        _memory_advice(facts))

    early = _idle_or_insufficient(facts)
    if early is not None:
        return early

    wait_fraction = facts.wait_fraction
    held = previous in INPUT_BOUND_CATEGORIES
    threshold = WAIT_FRACTION_COMPUTE_BOUND if held else WAIT_FRACTION_INPUT_BOUND
    if wait_fraction < threshold:
        return _compute_bound_verdict(facts)
    wait_line = f"wait fraction {_pct(wait_fraction)} (threshold {_pct(WAIT_FRACTION_INPUT_BOUND)}"
    if wait_fraction < WAIT_FRACTION_INPUT_BOUND:  # only the margin kept it input-bound
        wait_line += f", held until below {_pct(WAIT_FRACTION_COMPUTE_BOUND)}"
    return _input_bound_verdict(facts, wait_line + ")", previous)


def overall(verdicts: Sequence[tuple[str, Verdict]], system: SystemFigures | None,
            ranks: Ranks | None = None) -> OverallVerdict:
    """The top-level diagnosis: the most urgent source verdict (see OVERALL_RANK) plus "source".

    Ties keep the order of ``verdicts``. With no sources it is about the machine: memory_pressure
    when memory is short, else idle, with "source": None.

    ``ranks`` (the document's `ranks`, `client/ranks.py`): when it names a straggler whose own
    verdict is that its loop waits for data, that rank sets the pace of the whole job (every step
    ends in a collective the other ranks wait in), so the top-level verdict is the straggler's —
    its category, evidence and advice — with a summary that says so (`_straggler_summary`). Only a
    stall or memory pressure, which stop or threaten every rank, still come first.
    """
    best: tuple[int, int, str, Verdict] | None = None
    for position, (source_id, verdict) in enumerate(verdicts):
        rank = OVERALL_RANK.index(verdict.category)
        if best is None or (rank, position) < best[:2]:
            best = (rank, position, source_id, verdict)
    if best is not None:
        shown = best[3]
        straggling = _straggler_verdict(verdicts, ranks)
        if straggling is not None and shown.category not in URGENT_CATEGORIES:
            return straggling
        return OverallVerdict(category=shown.category, source=best[2], summary=shown.summary,
                              evidence=shown.evidence, advice=shown.advice)
    memory = _memory_findings(system or _NO_SYSTEM, None)
    if memory is not None:
        return OverallVerdict(category=MEMORY_PRESSURE, source=None, summary=memory.summary,
                              evidence=tuple(memory.evidence),
                              advice=("find the processes using the memory (top -o %MEM) and free "
                                      "it before starting training",))
    return OverallVerdict(category=IDLE, source=None, summary="no instrumented DataLoader found",
                          evidence=("no sources",), advice=())


def _straggler_verdict(verdicts: Sequence[tuple[str, Verdict]],
                       ranks: Ranks | None) -> OverallVerdict | None:
    """The straggler's own verdict as the top-level one, or None when there is no straggler or its
    loop is not judged to wait for data (a verdict still held at compute_bound, too few batches)."""
    if ranks is None or ranks.straggler is None:
        return None
    verdict = next((v for sid, v in verdicts if sid == ranks.straggler), None)
    group = next((g for g in ranks.groups if any(r.id == ranks.straggler for r in g.ranks)), None)
    if verdict is None or group is None or verdict.category not in INPUT_BOUND_CATEGORIES:
        return None
    me = next(r for r in group.ranks if r.id == ranks.straggler)
    others = [r for r in group.ranks if r.id != ranks.straggler]
    if len(group.ranks) <= 8:
        by_rank = ", ".join(f"rank {r.rank}: {_pct(r.wait_fraction)}" for r in group.ranks)
    else:
        by_rank = (f"rank {me.rank}: {_pct(me.wait_fraction)}, the other {len(others)} ranks: "
                   f"{_pct_range([r.wait_fraction for r in others])}")
    evidence = (*verdict.evidence,
                f"wait fraction by rank of {group.name!r}: {by_rank} (median "
                f"{_pct(group.median_wait_fraction)}): every step waits for the slowest rank")
    return OverallVerdict(category=verdict.category, source=ranks.straggler,
                          summary=_straggler_summary(me.rank, verdict.summary,
                                                    [(r.rank, r.wait_fraction) for r in others]),
                          evidence=evidence, advice=verdict.advice)


def _straggler_summary(rank: int, summary: str, others: Sequence[tuple[int, float]]) -> str:
    """"rank 1 holds the job back: its loop waits 75 % of the time for data; …; rank 0 waits in
    its step (3 % for data)" — the straggler's own summary, said of it, and where the other ranks
    wait: in their step, inside the collective that waits for the straggler."""
    own = "its " + summary[len("the "):] if summary.startswith("the loop ") else summary
    text = f"rank {rank} holds the job back: {own}"
    if not others:
        return text
    ids = [str(r) for r, _ in sorted(others)]
    figure = _pct_range([w for _, w in others])
    if len(ids) == 1:
        return f"{text}; rank {ids[0]} waits in its step ({figure} for data)"
    if len(ids) <= 4:
        return (f"{text}; ranks {', '.join(ids[:-1])} and {ids[-1]} wait in their step ({figure} "
                "for data)")
    return f"{text}; the other {len(ids)} ranks wait in their step ({figure} for data)"


def _pct_range(fractions: Sequence[float]) -> str:
    """"3 %", or "2–4 %" from the lowest to the highest."""
    low, high = _fmt(min(fractions) * 100.0), _fmt(max(fractions) * 100.0)
    return f"{low} %" if low == high else f"{low}–{high} %"


@dataclass(frozen=True)
class SlowWorker:
    worker: WorkerFigures
    batch_ms: float  # its p50 time per batch (items and collate)
    others_ms: float  # the median of the other workers' p50
    ratio: float


def slow_worker(source: SourceFigures) -> SlowWorker | None:
    """The one worker that takes SLOW_WORKER_FACTOR times longer per batch than the others while
    the loop waits: with in-order delivery (torch's default) every round of batches waits for it,
    and more workers do not help (a bad shard, file or disk behind its share of the indices)."""
    wait_fraction = _finite(source.wait_fraction)
    if wait_fraction is None or wait_fraction < WAIT_FRACTION_INPUT_BOUND:
        return None
    times = []
    for w in source.workers:
        fetch = _stat(w.fetch_ms)
        if fetch is None or w.batches < SLOW_WORKER_MIN_BATCHES:
            continue
        times.append((fetch + (_stat(w.collate_ms) or 0.0), w))
    if len(times) < 2:
        return None
    times.sort(key=lambda t: t[0])
    slowest_ms, slowest = times[-1]
    others = [t for t, _ in times[:-1]]
    mid = len(others) // 2
    median = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
    if slowest_ms < SLOW_WORKER_MIN_MS or slowest_ms < SLOW_WORKER_FACTOR * median:
        return None
    ratio = slowest_ms / median if median > 0 else math.inf
    return SlowWorker(worker=slowest, batch_ms=slowest_ms, others_ms=median, ratio=ratio)


def slow_ratio_text(slow: SlowWorker) -> str:
    return f"{slow.ratio:.0f}×" if math.isfinite(slow.ratio) else "far more than"


def slow_worker_line(slow: SlowWorker) -> str:
    ratio = slow_ratio_text(slow)
    return (f"worker {slow.worker.id} takes {_ms(slow.batch_ms)} per batch, {ratio} the others' "
            f"{_ms(slow.others_ms)} (threshold {SLOW_WORKER_FACTOR:g}×)")


def slow_worker_advice(slow: SlowWorker) -> str:
    return (f"more workers will not fix one slow worker: look at what worker {slow.worker.id} "
            f"reads (torch sends task i to worker i mod num_workers: a slow file, shard or disk "
            f"behind its share); in_order=False lets the others' batches through meanwhile")


def stall_threshold_ms(wait_ms: Stats | None, batches_total: int) -> float:
    """How long the loop may be blocked in next() before the source counts as stalled, from its
    recent waits (``wait_ms``) and how many batches it ever delivered."""
    p99 = _stat(wait_ms, "p99")  # as the stalled verdict's evidence reads it (the mean stands in)
    if p99 is None and batches_total == 0:
        return STALL_NO_HISTORY_MS
    return max(STALL_MIN_MS, STALL_FACTOR * (p99 or 0.0))


class VerdictStabilizer:
    """Hysteresis over time: keeps the shown category until a new one has persisted.

    ``update`` returns the verdict to show. A verdict of the shown category replaces it at once (its
    figures refresh every update); an urgent one (stalled, memory_pressure) shows at once; any other
    new category shows after ``updates`` consecutive updates, or once it has lasted ``seconds``
    over at least two consecutive updates. While a change is pending, the last verdict of the
    shown category stays (its figures are those of its last update).
    """

    def __init__(self, updates: int = STABLE_UPDATES, seconds: float = STABLE_SECONDS) -> None:
        self.updates = max(1, int(updates))
        self.seconds = float(seconds)
        self._states: dict[str, _StabilizerState] = {}

    def update(self, source_id: str, verdict: Verdict, now: float) -> Verdict:
        category = verdict.category
        state = self._states.get(source_id)
        if state is None or category == state.shown.category or category in URGENT_CATEGORIES:
            self._states[source_id] = _StabilizerState(shown=verdict)
            return verdict
        if category == state.pending_category:
            state.pending_count += 1
        else:
            state.pending_category, state.pending_count, state.pending_since = category, 1, now
        lasted = now - state.pending_since
        if state.pending_count >= self.updates or (state.pending_count >= 2 and lasted >= self.seconds):
            self._states[source_id] = _StabilizerState(shown=verdict)
        return self._states[source_id].shown

    def shown_category(self, source_id: str) -> Category | None:
        """The category shown now for this source (pass it to `diagnose` as ``previous``)."""
        state = self._states.get(source_id)
        return state.shown.category if state is not None else None

    def forget(self, source_id: str) -> None:
        """Drop a source that is gone for good."""
        self._states.pop(source_id, None)


# ---------------------------------------------------------------------------------------------
# Reading the figures
# ---------------------------------------------------------------------------------------------

@dataclass
class _StabilizerState:
    shown: Verdict
    pending_category: Category | None = None
    pending_count: int = 0
    pending_since: float = 0.0


def _finite(value: float | None) -> float | None:
    """The value when it is a finite number, else None (a broken reading is no evidence)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def _stat(stats: Stats | None, key: str = "p50") -> float | None:
    """One figure of a `Stats`; the mean stands in for one that is not finite."""
    if stats is None:
        return None
    value = _finite(getattr(stats, key))
    return value if value is not None else _finite(stats.mean)


def _weighted_mean(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Mean of (value, weight) pairs, weighted by batches when every weight is > 0; None when
    huge values overflow it (inf, or NaN from inf - inf)."""
    if not pairs:
        return None
    if all(w > 0 for _, w in pairs):
        return _finite(sum(v * w for v, w in pairs) / sum(w for _, w in pairs))
    return _finite(sum(v for v, _ in pairs) / len(pairs))


# Stands in for an unknown machine: every figure None, no GPU, no cores known.
_NO_SYSTEM = SystemFigures(
    host="", sent_at=0.0, cpu_count=0, cores_available=None, cpu_percent=None,
    per_cpu_percent=None, iowait_percent=None, load_avg_1m=None, mem_total_bytes=None,
    mem_available_bytes=None, mem_used_percent=None, swap_total_bytes=None, swap_used_bytes=None,
    swap_in_bytes_per_s=None, swap_out_bytes_per_s=None, disk_read_bytes_per_s=None,
    disk_write_bytes_per_s=None, cgroup=None, gpu_status="no_nvml", gpus=(), age_s=0.0)


@dataclass(frozen=True)
class _Facts:
    """The figures the rules use, read once."""

    source: SourceFigures
    system: SystemFigures
    wait_fraction: float  # NaN when unknown (checked before any comparison)
    step_ms: float | None
    cores: float | None
    cpu_count: float | None

    @classmethod
    def read(cls, source: SourceFigures, system: SystemFigures | None) -> _Facts:
        sysd = system if system is not None else _NO_SYSTEM
        wait_fraction = _finite(source.wait_fraction)
        if wait_fraction is None:
            wait, step = _stat(source.wait_ms, "mean"), _stat(source.step_ms, "mean")
            if wait is not None and step is not None and wait + step > 0:
                wait_fraction = wait / (wait + step)
        cpu_count = float(sysd.cpu_count) if sysd.cpu_count > 0 else None
        cores = _finite(sysd.cores_available)
        if cores is None or cores <= 0:
            cores = cpu_count
        return cls(source=source, system=sysd,
                   wait_fraction=wait_fraction if wait_fraction is not None else math.nan,
                   step_ms=_stat(source.step_ms), cores=cores, cpu_count=cpu_count)

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
    def active(self) -> bool:
        """The loop is still iterating (so a worker exiting is not a normal shutdown)."""
        return self.source.state not in ("idle", "finished", "gone")

    def fetch_ms(self, key: str = "p50") -> float | None:
        """Time to produce one batch — the items and the collate_fn: the workers' (weighted by
        batches), or the main process'."""
        if not self.uses_workers:
            return _stat(self.source.loop.fetch_ms, key)
        pairs = [(v + (_stat(w.collate_ms, key) or 0.0), float(w.batches)) for w in self.workers
                 if (v := _stat(w.fetch_ms, key)) is not None]
        return _weighted_mean(pairs)

    def handoff_share(self) -> float | None:
        split = self.source.stages.wait_split
        return _finite(split.handoff) if split is not None else None

    def cpu_fraction(self) -> tuple[float | None, str]:
        """(CPU time / wall time while producing batches, where the figure comes from)."""
        if not self.uses_workers:
            return _finite(self.source.loop.cpu_fraction), "main process fetch cpu_fraction"
        pairs = [(v, float(w.batches)) for w in self.workers
                 if (v := _finite(w.cpu_fraction)) is not None]
        if pairs:
            return _weighted_mean(pairs), "worker cpu_fraction"
        # Fallback: the workers' process CPU (100 = one core). While the loop waits for data the
        # workers are producing all the time, so this approximates the same fraction.
        percents = self._worker_percents()
        if percents:
            return min(1.0, sum(percents) / len(percents) / 100.0), "worker process CPU"
        return None, ""

    @cached_property
    def cpu(self) -> _CpuBudget | None:
        """The CPU figures both the category and the advice rest on (`_CpuBudget`), read once;
        None when the cores available are unknown."""
        return _cpu_budget(self) if self.cores is not None else None

    def worker_cores_busy(self) -> float | None:
        percents = self._worker_percents()
        return _finite(sum(percents) / 100.0) if percents else None

    def _worker_percents(self) -> list[float]:
        return [v for w in self.workers if (v := _finite(w.cpu_percent)) is not None]

    def worker_rss(self) -> list[float]:
        return [float(w.rss_bytes) for w in self.workers if w.rss_bytes is not None]


# ---------------------------------------------------------------------------------------------
# Formatting (human-readable figures in evidence and advice)
# ---------------------------------------------------------------------------------------------

def _fmt(value: float) -> str:
    if abs(value) >= 10:
        return f"{value:.0f}"
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def _pct(fraction: float) -> str:
    return f"{_fmt(fraction * 100.0)} %"


def _pct_value(percent: float) -> str:
    return f"{_fmt(percent)} %"


def _ms(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:.1f} s"
    if value >= 10:
        return f"{value:.0f} ms"
    if value >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", _GIB), ("MiB", _MIB), ("KiB", _KIB)):
        if value >= size:
            return f"{_fmt(value / size)} {unit}"
    return f"{value:.0f} B"


def _cores(value: float) -> str:
    text = _fmt(value)
    return f"{text} core" + ("" if text == "1" else "s")


def _core_share(value: float) -> str:
    """A fraction of a core with the digits it needs: 0.06, 0.9, 1.9, 12."""
    if value < 1:
        return f"{value:.2f}".rstrip("0").rstrip(".") or "0"
    return _fmt(value)


def _workers(count: int) -> str:
    return f"{count} worker" + ("" if count == 1 else "s")


def _verdict(category: Category, summary: str, evidence: Sequence[str],
             advice: Sequence[str]) -> Verdict:
    return Verdict(category=category, summary=summary, evidence=tuple(evidence),
                   advice=tuple(advice))


# ---------------------------------------------------------------------------------------------
# stalled
# ---------------------------------------------------------------------------------------------

def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        name = _signal_name(-exitcode)
        return f"killed by {name} (signal {-exitcode})" if name.startswith("SIG") else f"killed by {name}"
    return f"exited with code {exitcode}"


def _exit_advice(code: int | None, pid: int | None) -> list[str]:
    advice = []
    if code == -signal.SIGKILL:
        advice.append("SIGKILL is most often the kernel's OOM killer: check "
                      "`dmesg -T | grep -i -E 'out of memory|killed process'` (or the container's "
                      "OOM events); then fewer workers or a smaller prefetch_factor / batch_size")
    elif code == -signal.SIGBUS:
        advice.append("SIGBUS in a worker usually means /dev/shm is full (pytorch#5040): check "
                      "`df -h /dev/shm`; enlarge it (docker run --shm-size=8g) or use fewer workers")
    elif code is not None and code in (-signal.SIGSEGV, -signal.SIGABRT):
        advice.append("a native crash in the worker: often OpenMP/OpenCV state inherited across fork "
                      "(pytorch#1355); try multiprocessing_context='spawn' or cv2.setNumThreads(0)")
    elif code is not None and code > 0:
        advice.append(f"the worker exited with code {code}: look for its traceback on the training "
                      "process's stderr")
    advice.append("torch's own message for the dead worker is on the training process's stderr "
                  f"(\"DataLoader worker (pid {pid if pid is not None else '?'}) ...\")")
    return advice


def _stall_verdict(facts: _Facts) -> Verdict | None:
    src = facts.source
    dead = [w for w in facts.workers if w.alive is False and w.exitcode != 0] if facts.active else []
    if dead:
        evidence: list[str] = []
        advice: list[str] = []
        for w in dead:
            evidence.append(f"worker {w.id} (pid {w.pid if w.pid is not None else '?'}) "
                            f"{_describe_exit(w.exitcode)}")
            advice.extend(a for a in _exit_advice(w.exitcode, w.pid) if a not in advice)
        first = dead[0]
        summary = f"worker {first.id} died: {_describe_exit(first.exitcode)}"
        if first.exitcode == -signal.SIGKILL:
            summary += ", likely the OOM killer"
        if len(dead) > 1:
            summary += f"; {len(dead)} workers dead"
        return _verdict(STALLED, summary, evidence, advice)

    blocked = _finite(src.blocked_ms)
    if blocked is None:
        return None
    threshold = stall_threshold_ms(src.wait_ms, src.batches_total)
    if blocked < threshold:
        return None
    p99 = _stat(src.wait_ms, "p99")
    evidence = [f"blocked in next() for {_ms(blocked)} (threshold {_ms(threshold)})"]
    if p99 is not None:
        evidence.append(f"recent wait p99 {_ms(p99)}")
    # Where it hangs: a worker stuck inside one batch says more than the loop waiting for it.
    stuck = [(w, frame) for w in facts.workers
             if w.stack is not None and (frame := user_frame(w.stack)) is not None]
    loop_frame = user_frame(src.loop_stack) if src.loop_stack is not None else None
    for w, frame in stuck[:4]:
        evidence.append(f"worker {w.id} inside one batch for {_ms(w.busy_ms or 0.0)}, at {frame}")
    if loop_frame is not None:
        evidence.append(f"the loop waits at {loop_frame}")
    ready, in_flight = src.queue.ready, src.queue.in_flight
    if ready is not None or in_flight is not None:
        evidence.append(f"queue: {ready if ready is not None else '?'} ready, "
                        f"{in_flight if in_flight is not None else '?'} in flight")
    advice = []
    worker_pids = [w.pid for w in facts.workers if w.pid is not None]
    if ready is not None and ready > 0:
        advice.append("batches are ready yet next() does not return: the main process is stuck "
                      "(receive, collate or pin_memory thread)")
    if worker_pids:
        others = " ".join(str(pid) for pid in worker_pids[1:4])
        others += f" and {len(worker_pids) - 4} more" if len(worker_pids) > 4 else ""
        advice.append(f"see where the workers hang: py-spy dump --pid {worker_pids[0]}"
                      + (f" (likewise {others})" if others else ""))
        advice.append("workers all idle with work outstanding suggest a deadlock after fork "
                      "(OpenMP/OpenCV threads, pytorch#1355): try multiprocessing_context='spawn'")
    advice.append(f"see where the loop waits: py-spy dump --pid {src.pid}")
    advice.append("pass timeout=SECONDS to the DataLoader to turn a hang into an error")
    summary = f"the loop has been blocked in next() for {_ms(blocked)}"
    summary += f" (recent p99 {_ms(p99)})" if p99 is not None else ""
    if stuck:
        summary += f"; worker {stuck[0][0].id} is stuck at {short_frame(stuck[0][1])}"
    elif loop_frame is not None:
        summary += f" at {short_frame(loop_frame)}"
    return _verdict(STALLED, summary, evidence, advice)


def user_frame(stack: StackFigures) -> str | None:
    """The innermost frame of the user's own code in `stack` (see `probe/stacks.py`)."""
    if stack.user_frame is None or stack.user_frame >= len(stack.frames):
        return None
    return stack.frames[stack.user_frame]


def short_frame(frame: str) -> str:
    """`"/long/path/to/data.py:42 in load"` as `"data.py:42 in load"`."""
    path, sep, rest = frame.partition(":")
    return path.rsplit("/", 1)[-1] + sep + rest


# ---------------------------------------------------------------------------------------------
# memory_pressure
# ---------------------------------------------------------------------------------------------

@dataclass
class _MemoryFindings:
    summary: str
    evidence: list[str]


def _memory_findings(system: SystemFigures, previous: Category | None) -> _MemoryFindings | None:
    total = system.mem_total_bytes
    available = system.mem_available_bytes
    swap_in = _finite(system.swap_in_bytes_per_s)
    swap_out = _finite(system.swap_out_bytes_per_s)
    fraction = available / total if total and available is not None else None
    held = previous == MEMORY_PRESSURE
    threshold = MEM_AVAILABLE_LEAVE_FRACTION if held else MEM_AVAILABLE_MIN_FRACTION

    low = fraction is not None and fraction < threshold
    swapping_in = swap_in is not None and swap_in >= SWAP_RATE_MIN_BYTES_PER_S
    swapping_out = (swap_out is not None and swap_out >= SWAP_RATE_MIN_BYTES_PER_S
                    and fraction is not None and fraction < MEM_AVAILABLE_SWAP_OUT_FRACTION)
    if not (low or swapping_in or swapping_out):
        return None
    evidence = []
    if fraction is not None and total is not None and available is not None:
        margin = (f", held until {_pct(MEM_AVAILABLE_LEAVE_FRACTION)} available"
                  if low and fraction >= MEM_AVAILABLE_MIN_FRACTION else "")
        evidence.append(f"memory available {_pct(fraction)} ({_bytes(available)} of {_bytes(total)}; "
                        f"threshold {_pct(MEM_AVAILABLE_MIN_FRACTION)}{margin})")
    if swap_in is not None and (swapping_in or swapping_out):
        evidence.append(f"swap in {_bytes(swap_in)}/s (threshold {_bytes(SWAP_RATE_MIN_BYTES_PER_S)}/s)")
    if swap_out and (swapping_in or swapping_out):
        evidence.append(f"swap out {_bytes(swap_out)}/s")
    if low and fraction is not None and available is not None:
        summary = f"memory nearly exhausted: {_pct(fraction)} available ({_bytes(available)})"
        if swapping_in or swapping_out:
            summary += " and swapping"
    else:
        rate = max(swap_in or 0.0, swap_out or 0.0)
        summary = f"the machine is swapping ({_bytes(rate)}/s)"
    return _MemoryFindings(summary, evidence)


def _worker_rss_evidence(facts: _Facts) -> list[str]:
    rss = facts.worker_rss()
    if not rss:
        return []
    total = sum(rss)
    count = len(rss)
    text = f"{count} workers use {_bytes(total)} RSS" if count != 1 else f"1 worker uses {_bytes(total)} RSS"
    if count > 1:
        text += f" ({_bytes(total / count)} each; shared pages count once per worker)"
    return [text]


def _memory_advice(facts: _Facts) -> list[str]:
    config = facts.source.config
    advice = []
    workers = facts.worker_count
    if workers >= 2:
        rss = facts.worker_rss()
        each = f" (each holds ~{_bytes(sum(rss) / len(rss))} RSS)" if rss else ""
        advice.append(f"fewer workers: try num_workers={max(1, workers // 2)}{each}")
    prefetch = config.prefetch_factor
    if facts.uses_workers and prefetch is not None and prefetch > 1:
        advice.append(f"fewer batches in flight: try prefetch_factor=1 (now {prefetch}: "
                      f"{prefetch * max(workers, 1)} batches held at once)")
    batch_size = config.batch_size
    if batch_size is not None and batch_size >= 2:
        advice.append(f"smaller batches: try batch_size={batch_size // 2}")
    if facts.uses_workers:
        advice.append("if worker memory grows over time, it is copy-on-read of Python objects "
                      "(pytorch#13246): keep the dataset in numpy arrays or tensors, not lists/dicts")
    if not advice:
        advice.append("find the processes using the memory (top -o %MEM)")
    return advice


# ---------------------------------------------------------------------------------------------
# idle, insufficient_data
# ---------------------------------------------------------------------------------------------

def _idle_or_insufficient(facts: _Facts) -> Verdict | None:
    src = facts.source
    batches = src.batches
    blocked = _finite(src.blocked_ms)
    stopped = src.state in ("idle", "finished", "gone")
    if not batches and (blocked is None or stopped):
        why = {"finished": "the loop has finished", "gone": "the process is gone"}.get(
            src.state, "the loop is not iterating")
        return _verdict(IDLE, f"no batches in the window: {why}", ["0 batches in the window"], [])
    if not batches and blocked is not None:
        threshold = stall_threshold_ms(src.wait_ms, src.batches_total)
        return _verdict(INSUFFICIENT_DATA, f"waiting for a batch for {_ms(blocked)}",
                        ["0 batches in the window", f"blocked in next() for {_ms(blocked)} "
                         f"(stall threshold {_ms(threshold)})"],
                        ["wait: workers may still be starting"])
    covered = None
    wait_mean, step_mean = _stat(src.wait_ms, "mean"), _stat(src.step_ms, "mean")
    if wait_mean is not None and step_mean is not None:
        covered = batches * (wait_mean + step_mean)
    slow_enough = (batches >= MIN_BATCHES_SLOW and covered is not None
                   and covered >= SLOW_WINDOW_MIN_MS)
    if batches < MIN_BATCHES and not slow_enough:
        return _verdict(INSUFFICIENT_DATA,
                        f"{batches} batches in the window: too few to judge",
                        [f"{batches} batches (need {MIN_BATCHES})"], ["wait for more batches"])
    if math.isnan(facts.wait_fraction):
        return _verdict(INSUFFICIENT_DATA, "the wait fraction is unknown",
                        [f"{batches} batches, wait fraction unknown"],
                        ["wait for the next refresh"])
    return None


# ---------------------------------------------------------------------------------------------
# compute_bound
# ---------------------------------------------------------------------------------------------

def _source_gpus(facts: _Facts) -> list[GpuFigures]:
    """The GPUs this source's process uses (by pid); the only GPU when there is exactly one."""
    if facts.system.gpu_status != "ok":
        return []
    gpus = list(facts.system.gpus)
    pid = facts.source.pid
    mine = [g for g in gpus if any(p.pid == pid for p in g.processes)]
    if mine:
        return mine
    return gpus if len(gpus) == 1 else []


def _compute_bound_verdict(facts: _Facts) -> Verdict:
    wait_fraction = facts.wait_fraction
    evidence = [f"wait fraction {_pct(wait_fraction)} (threshold {_pct(WAIT_FRACTION_INPUT_BOUND)})"]
    queue = facts.source.queue
    ready_mean, capacity = _finite(queue.ready_mean), queue.capacity
    if ready_mean is not None and capacity:
        evidence.append(f"queue {_fmt(ready_mean)} of {capacity} batches ready on average")
    if facts.step_ms is not None:
        evidence.append(f"step p50 {_ms(facts.step_ms)}")
    summary = f"the loader keeps up (the loop waits {_pct(wait_fraction)}): the training step is the limit"
    advice = ["nothing to fix in loading"]
    idle_gpus = []
    for gpu in _source_gpus(facts):
        util = _finite(gpu.util_percent)
        if util is not None:
            evidence.append(f"GPU {gpu.index} util {_pct_value(util)} "
                            f"(threshold {_pct_value(GPU_UNDERUSED_PERCENT)})")
            if util < GPU_UNDERUSED_PERCENT:
                idle_gpus.append(gpu.index)
    if idle_gpus:
        summary = (f"the loader keeps up, but the step itself leaves GPU "
                   f"{', '.join(str(i) for i in idle_gpus)} idle")
        advice = ["nothing to fix in loading: the step itself leaves the GPU idle; profile it "
                  "(torch.profiler): host-side Python, .item()/.cpu() syncs, many small kernels",
                  "try a larger batch_size, mixed precision (torch.autocast) or torch.compile"]
    return _verdict(COMPUTE_BOUND, summary, evidence, advice)


# ---------------------------------------------------------------------------------------------
# the loop waits: main_process_bound, cpu_saturated, input_bound_io, input_bound_cpu
# ---------------------------------------------------------------------------------------------

def _input_bound_verdict(facts: _Facts, wait_line: str, previous: Category | None) -> Verdict:
    sysd = facts.system
    waits = f"the loop waits {_pct(facts.wait_fraction)} of the time"
    gpu_lines = [f"GPU {g.index} util {_pct_value(u)} (starved)"
                 for g in _source_gpus(facts) if (u := _finite(g.util_percent)) is not None]

    saturation = _cpu_saturation(facts, previous)
    main_bound = _main_bound_evidence(facts, previous) if facts.uses_workers else None
    if main_bound is not None:
        evidence = [wait_line, *main_bound]
        advice = _main_process_advice(facts)
        if saturation is not None:
            evidence += saturation[0]
            fewer = _fewer_workers_text(facts)
            advice.append("the CPU is saturated too: the workers compete with the main process"
                          + ("" if fewer == "more workers will not help" else f"; {fewer}"))
        return _verdict(MAIN_PROCESS_BOUND,
                        f"{waits} although batches are ready: the main process is the limit",
                        evidence + gpu_lines, advice)

    producing_lines = _producing_lines(facts)
    slow = slow_worker(facts.source) if facts.uses_workers else None
    if slow is not None:
        producing_lines = [slow_worker_line(slow), *producing_lines]
    if saturation is not None:
        evidence, busy_text = saturation
        slow_advice = [slow_worker_advice(slow)] if slow is not None else []
        return _verdict(CPU_SATURATED, f"{waits} for data and every core is busy ({busy_text})",
                        [wait_line, *producing_lines, *evidence, *gpu_lines],
                        slow_advice + _cpu_saturated_advice(facts) + _stage_advice(facts))

    fraction, origin = facts.cpu_fraction()
    iowait = _finite(sysd.iowait_percent)
    disk_read = _finite(sysd.disk_read_bytes_per_s)
    io_lines = []
    if iowait is not None and iowait >= IOWAIT_HIGH_PERCENT:
        io_lines.append(f"iowait {_pct_value(iowait)} (threshold {_pct_value(IOWAIT_HIGH_PERCENT)})")
    if disk_read is not None and disk_read >= DISK_READ_NOTABLE_BYTES_PER_S:
        io_lines.append(f"disk reads {_bytes(disk_read)}/s")

    if fraction is not None:
        boundary = IO_CPU_FRACTION
        if previous == INPUT_BOUND_IO:
            boundary += IO_CPU_FRACTION_MARGIN
        elif previous == INPUT_BOUND_CPU:
            boundary -= IO_CPU_FRACTION_MARGIN
        io_bound = fraction < boundary
        fraction_line = f"{origin} {fraction:.2f} (I/O-bound below {IO_CPU_FRACTION:.2f}"
        if io_bound and fraction >= IO_CPU_FRACTION:  # only the margin kept it I/O-bound
            fraction_line += f", held until {boundary:.2f}"
        elif not io_bound and fraction < IO_CPU_FRACTION:  # only the margin kept it CPU-bound
            fraction_line += f", CPU-bound held down to {boundary:.2f}"
        fraction_line += ")"
    else:
        # No CPU figure for the fetching side: iowait decides; without it the CPU case is assumed
        # (its advice, more workers, also helps I/O) and the evidence says the figure is missing.
        fraction_line = "worker cpu_fraction unknown: judged by iowait"
        io_bound = iowait is not None and iowait >= IOWAIT_HIGH_PERCENT
        if not io_bound and iowait is None:
            fraction_line = "worker cpu_fraction and iowait unknown: CPU-bound assumed"

    who = "the workers" if facts.uses_workers else "the main process, fetching itself,"
    if io_bound:
        advice = [slow_worker_advice(slow)] if slow is not None else _worker_count_advice(facts, "io")
        return _verdict(INPUT_BOUND_IO,
                        f"{waits} for data; {who} wait{'s' if not facts.uses_workers else ''} "
                        "on storage or network",
                        [wait_line, *producing_lines, fraction_line, *io_lines, *gpu_lines],
                        advice + _stage_advice(facts))
    evidence = [wait_line, *producing_lines, fraction_line]
    busy = _finite(sysd.cpu_percent)
    if busy is not None:
        cores_text = f" ({_cores(facts.cores)} available)" if facts.cores else ""
        evidence.append(f"CPU {_pct_value(busy)} busy{cores_text}")
    computes = "the workers compute" if facts.uses_workers else "the main process fetches itself"
    advice = [slow_worker_advice(slow)] if slow is not None else _worker_count_advice(facts, "cpu")
    return _verdict(INPUT_BOUND_CPU, f"{waits} for data; {computes} and CPU is left",
                    evidence + io_lines + gpu_lines, advice + _stage_advice(facts))


def _main_bound_evidence(facts: _Facts, previous: Category | None) -> list[str] | None:
    """Evidence that the main process is the limit, or None.

    Where stages are known the measured split of the wait decides, and the queue samples ("a
    batch was ready while the loop waited", vetoed when the loop's thread was off the CPU) must
    not contradict it: when the main process is the limit the workers run ahead and batches pile
    up. A long handoff with no batch waiting means the batches leave the workers late, not that
    the loop is slow to take them — measured here: a worker computing in pure Python (holding the
    GIL its queue's feeder thread needs) showed 75–100 % handoff, p50 about one whole fetch, and
    no second batch ready in any sample; 4 CPU-burning workers and a busy loop on 2 cores showed
    68 % handoff with the loop's thread off the CPU. Where the split is unknown (in_order=False,
    an unknown torch layout) the queue samples decide alone.
    """
    held = previous == MAIN_PROCESS_BOUND
    handoff = facts.handoff_share()
    lines: list[str] = []
    if handoff is not None:
        threshold = HANDOFF_LEAVE if held else HANDOFF_MAIN_BOUND
        if handoff < threshold:
            return None
        margin = (f", held until below {_pct(HANDOFF_LEAVE)}" if handoff < HANDOFF_MAIN_BOUND
                  else "")
        lines = [f"{_pct(handoff)} of the wait came after the batch was produced: handing it "
                 f"to the loop (threshold {_pct(HANDOFF_MAIN_BOUND)}{margin})"]
        handoff_ms = _stat(facts.source.stages.handoff_ms)
        if handoff_ms is not None:
            lines.append(f"handoff {_ms(handoff_ms)} per batch (p50)")
    queue = facts.source.queue
    ready_when_waiting = _finite(queue.ready_when_waiting)
    if ready_when_waiting is None:
        return lines or None  # no queue samples: the split alone, where there is one
    ready_threshold = READY_WHEN_WAITING_LEAVE if held else READY_WHEN_WAITING_MAIN_BOUND
    loop_cpu = _finite(queue.loop_cpu_when_waiting)
    loop_blocked = loop_cpu is not None and loop_cpu < LOOP_CPU_MAIN_BOUND_MIN
    if ready_when_waiting < ready_threshold or loop_blocked:
        return None
    margin = (f", held until below {_pct(READY_WHEN_WAITING_LEAVE)}"
              if ready_when_waiting < READY_WHEN_WAITING_MAIN_BOUND else "")
    return [*lines, f"a batch was ready in {_pct(ready_when_waiting)} of the samples while "
            f"the loop waited (threshold {_pct(READY_WHEN_WAITING_MAIN_BOUND)}{margin})"]


def _late_delivery(facts: _Facts) -> bool:
    """Most of the wait came after production, yet the main process was not the limit (see
    `_main_bound_evidence`): the batches leave the workers late."""
    handoff = facts.handoff_share()
    return facts.uses_workers and handoff is not None and handoff >= HANDOFF_MAIN_BOUND


def _producing_lines(facts: _Facts) -> list[str]:
    """An input-bound verdict's measured share: how much of the wait was for production."""
    split = facts.source.stages.wait_split
    handoff = facts.handoff_share()
    producing = _finite(split.producing) if split is not None else None
    if handoff is None or producing is None:
        return []
    if _late_delivery(facts):
        ready = _finite(facts.source.queue.ready_when_waiting)
        queue_text = (f"a second batch was ready in only {_pct(ready)} of the samples while the "
                      "loop waited" if ready is not None else "the loop waited")
        return [f"{_pct(handoff)} of the wait came after the batch was produced, yet "
                f"{queue_text}: the batches leave the workers late"]
    if facts.uses_workers:
        return [f"{_pct(producing)} of the wait came before the batch was produced: "
                "the workers are the limit"]
    return [f"{_pct(producing)} of the wait went to fetching and collating in the loop"]


def _stage_advice(facts: _Facts) -> list[str]:
    """Name the stage that costs most of producing a batch, where it is not the fetch."""
    stages = facts.source.stages
    advice = []
    if _late_delivery(facts):
        advice.append("a finished batch waits in its worker until the worker's queue feeder thread "
                      "can send it: per-item work in pure Python holds the GIL that thread needs "
                      "(numpy / torch / PIL operations release it), and a busy CPU delays it too")
    fetch, collate = _stat(stages.fetch_ms, "mean"), _stat(stages.collate_ms, "mean")
    if fetch is None or collate is None or collate <= fetch:
        return advice
    return [*advice, f"collate_fn takes {_ms(collate)} per batch, more than getting the items "
            f"({_ms(fetch)}): make it cheaper (stack arrays once with torch.stack or numpy, no "
            "per-item Python work), or do the per-item part in the dataset's __getitem__"]


def _cpu_saturation(facts: _Facts, previous: Category | None) -> tuple[list[str], str] | None:
    """(evidence, short "busy" text) when every core available to us is busy, else None.

    It reads the one CPU figure (`_CpuBudget.busy_share`, from `_Facts.cpu`) that the advice's
    capacity model rests on too, so a verdict that says CPU is left never advises as if none
    were (issue 37): the machine's reading, or what the job uses of the cores available to it."""
    sysd = facts.system
    held = previous == CPU_SATURATED
    threshold = CPU_SATURATED_LEAVE_PERCENT if held else CPU_SATURATED_PERCENT

    def threshold_text(percent: float) -> str:
        margin = (f", held until below {_pct_value(CPU_SATURATED_LEAVE_PERCENT)}"
                  if percent < CPU_SATURATED_PERCENT else "")
        return f"(threshold {_pct_value(CPU_SATURATED_PERCENT)}{margin})"

    budget = facts.cpu
    busy = _finite(sysd.cpu_percent)
    cores = facts.cores
    load = _finite(sysd.load_avg_1m)
    evidence: list[str] = []
    text = ""
    share = budget.busy_share() if budget is not None else \
        (busy / 100.0 if busy is not None else None)
    if share is not None and share * 100.0 >= threshold:
        # The evidence names each reading at the threshold: the machine's, and the job's own use
        # of the cores available to it (under a cgroup quota the machine may be idle while our
        # share is full, and the machine's reading, a second's average, may lag below what the
        # batches a second and the CPU each costs fill).
        if busy is not None and busy >= threshold:
            evidence.append(f"CPU {_pct_value(busy)} {threshold_text(busy)}")
            text = f"CPU {_pct_value(busy)}"
        job = budget.job_share() if budget is not None else None
        if budget is not None and job is not None and job * 100.0 >= threshold:
            evidence.append(f"{budget.use_text()} {threshold_text(job * 100.0)}")
            text = text or budget.use_text(short=True)
    if busy is None and not evidence and cores and load is not None \
            and load >= LOAD_SATURATED_PER_CORE * cores:
        fraction, _ = facts.cpu_fraction()
        if fraction is None or fraction >= IO_CPU_FRACTION:  # off-CPU workers inflate load (D state)
            evidence.append(f"load {load:.1f} on {_cores(cores)} available (CPU % not yet known)")
            text = f"load {load:.1f}"
    if not evidence:
        return None
    if facts.cpu_count and cores and cores < facts.cpu_count:
        evidence.append(f"cgroup allows {_cores(cores)} of the machine's {_cores(facts.cpu_count)}")
    if load is not None and not text.startswith("load"):
        evidence.append(f"load {load:.1f}")
    worker_cores = budget.workers_cores if budget is not None else facts.worker_cores_busy()
    if busy is not None and worker_cores is not None and facts.cpu_count:
        busy_cores = busy / 100.0 * facts.cpu_count
        if busy_cores > 0 and worker_cores < 0.5 * busy_cores:
            evidence.append(f"workers use {_cores(worker_cores)} of {_cores(busy_cores)} busy: "
                            "other processes take most of the CPU")
    return evidence, text


def _fewer_workers_target(facts: _Facts) -> tuple[int, _CpuBudget] | None:
    """Fewer workers, as many as the measured CPU for workers holds (each using its measured
    share of a core while it produces), when `num_workers` exceeds the cores; else None."""
    workers = facts.worker_count
    budget = facts.cpu
    if facts.cores is None or budget is None or workers <= facts.cores:
        return None
    fraction, _ = facts.cpu_fraction()
    each = max(fraction if fraction is not None else 1.0, 0.01)  # of a core, while producing
    target = max(1, math.floor(min(budget.for_workers / each, _FLOAT_MAX) + 0.5))
    return (target, budget) if target < workers else None


def _fewer_workers_text(facts: _Facts) -> str:
    fewer = _fewer_workers_target(facts)
    if fewer is None:
        return "more workers will not help"
    target, budget = fewer
    return (f"num_workers={facts.worker_count} exceeds the {_cores(facts.cores or 0)} available: "
            f"try num_workers={target} ({budget.text()})")


def _busy_main_advice(budget: _CpuBudget) -> list[str]:
    if budget.main_cores < MAIN_BUSY_CORES or not budget.main_measured:
        return []
    share = _core_share(budget.main_cores)
    return [f"the training process itself uses {share} core{'' if share == '1' else 's'}: what it "
            "does besides waiting (the step, logging, pin_memory) takes CPU the workers need"]


def _cpu_saturated_advice(facts: _Facts) -> list[str]:
    advice = [_fewer_workers_text(facts)]
    if advice[0] != "more workers will not help":
        advice.append("more workers will not help")
    else:
        # The capacity model says the same as the category, with its figures: where the CPU caps
        # the rate near where it is now (others filling the machine leave a cap far above it,
        # which would only confuse).
        budget, rate = facts.cpu, _finite(facts.source.batches_per_s)
        cap = budget.max_batches_per_s() if budget is not None and facts.uses_workers else None
        if budget is not None and cap is not None and rate and cap <= (1.0 + CPU_NEAR_CAP) * rate:
            advice.append(f"no CPU left for more workers: {budget.cap_text(rate)}")
            advice.extend(_busy_main_advice(budget))
    advice += ["make per-sample transforms cheaper (decode at a lower resolution, fewer "
               "augmentations, vectorised ops)",
               "move augmentation to the GPU (e.g. torchvision.transforms.v2 on CUDA tensors, DALI)",
               "pre-process offline: store decoded, resized samples"]
    return advice


# torch 2.13's default sharing strategy (file_descriptor) sends each tensor's storage as a file
# descriptor that the main process fetches from the worker's resource-sharer thread, one
# connection a tensor: the loop's thread sat off the CPU half of the handoff for batches of 64
# tensors of 8 B, and file_system gave 146-165 batches/s against 42-47 (2 workers, fork, spawn
# and forkserver, measured here). Each process has its own setting: spawn and forkserver workers
# take it from the script's module level, which they import again, not from the main process.
_SHARE_BY_FILE_NAME = (
    "if the batch must keep its tensors: torch.multiprocessing.set_sharing_strategy('file_system') "
    "at the top of the training script (module level, so that spawn and forkserver workers run it "
    "too): a tensor then crosses by a shared-memory file name instead of a file descriptor the main "
    "process fetches from the worker one at a time; a process killed meanwhile can leave torch_* "
    "files in /dev/shm")


def _main_process_advice(facts: _Facts) -> list[str]:
    config = facts.source.config
    stages = facts.source.stages
    advice = ["more workers will not help: the main process receives and unpickles every batch"]
    tensors, size = stages.tensors_per_batch, stages.bytes_per_batch
    if tensors is not None and size is not None and tensors >= MANY_TENSORS_PER_BATCH \
            and size / tensors < SMALL_TENSOR_BYTES:
        advice.insert(0, f"a batch holds {tensors} tensors of {_bytes(size / tensors)} on average: "
                         "the handoff pays per tensor (a shared-memory handle and a file descriptor "
                         "each); stack them into a few large tensors in collate_fn")
        advice.insert(1, _SHARE_BY_FILE_NAME)
    elif tensors is None or tensors >= MANY_TENSORS_PER_BATCH:
        # Unknown (no census yet, or a batch too large to count), or many large tensors: the
        # general advice. Where the workers counted a few tensors, it would be wrong to give.
        advice.append("return fewer, larger tensors per batch (one stacked tensor instead of lists "
                      "or dicts of many small ones): each tensor crosses processes with its own "
                      "shared-memory handle")
    advice.append("use a cheap collate_fn: stack in the workers, avoid Python-object batches")
    if config.pin_memory:
        advice.append("pin_memory=True copies every batch in a thread of the main process: compare "
                      "with pin_memory=False")
    rate = _finite(facts.source.batches_per_s)
    if rate is not None and rate >= TINY_BATCHES_PER_S:
        batch_size = config.batch_size
        target = f"try batch_size={batch_size * 4}" if batch_size else "increase batch_size"
        advice.append(f"{_fmt(rate)} batches/s each cost ~0.5 ms to receive: {target}")
    return advice


def _ceil(ratio: float) -> int:
    """A worker count for ``ratio``: at least 1, and a number even when the ratio overflowed."""
    return math.ceil(min(max(ratio, 1.0), _FLOAT_MAX) - 1e-9)


@dataclass(frozen=True)
class _CpuBudget:
    """The CPU of the cores available to the job, from measurement (issue 15): the cores, what
    the training process uses (every thread of it: the loop, pin_memory's, the probe's), what our
    workers use, and what other processes use of the same cores. Other processes count only beyond
    the cores the job may not use anyway (a cgroup quota of 2 on a busy 64-core machine leaves the
    2 free).

    Computed once a verdict (`_Facts.cpu`), it is the one figure both sides of a verdict rest on
    (issue 37): the category (`_cpu_saturation`: is CPU left? `busy_share`) and the advice's
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
        of = f"of {_cores(self.cores)}" + ("" if short else " available")
        from_rate = (f"{_fmt(self.rate)} batches/s × {_ms(self.worker_cpu_ms)} of CPU a batch"
                     if self.workers_from_rate and self.rate is not None
                     and self.worker_cpu_ms is not None else "")
        if workers is None:
            return f"the training process uses {_fmt(used)} {of}"
        if self.main_in_use <= 0 and not self.others:
            return f"workers use {_fmt(used)} {of}" + ("" if short or not from_rate else
                                                        f": {from_rate}")
        if short:
            return f"the job uses {_fmt(used)} {of}"
        parts = [f"workers {_fmt(workers)}" + (f" ({from_rate})" if from_rate else "")]
        if self.main_in_use > 0:
            parts.append(f"the training process {_core_share(self.main_in_use)}")
        if self.others:
            parts.append(f"other processes {_core_share(self.others)}")
        return f"the job uses {_fmt(used)} {of}: {', '.join(parts)}"

    def text(self) -> str:
        main = "the training process" if self.main_measured else \
            "the training process (not measured: its step counted as CPU)"
        parts = [_cores(self.cores), f"{_core_share(self.main_cores)} {main}"]
        if self.others is None:
            parts.append("other processes unknown")
        elif self.others > 0:
            parts.append(f"{_core_share(self.others)} other processes")
        return f"CPU for workers: {' − '.join(parts)} = {_cores(self.for_workers)}"

    def cap_text(self, rate_now: float | None) -> str:
        """The capacity model in words: "CPU for workers: …; a batch costs 48 ms in a worker + 2.6
        ms in the training process of CPU, so at most ~40 batches/s (now 38)"."""
        per_batch = [f"{_ms(self.worker_cpu_ms)} in a worker"] if self.worker_cpu_ms else []
        if self.main_cpu_ms:
            per_batch.append(f"{_ms(self.main_cpu_ms)} in the training process")
        return (f"{self.text()}; a batch costs {' + '.join(per_batch) or 'its CPU'} of CPU, so at "
                f"most ~{_fmt(self.max_batches_per_s() or 0.0)} batches/s"
                + (f" (now {_fmt(rate_now)})" if rate_now else ""))


def _cpu_budget(facts: _Facts) -> _CpuBudget:
    """The measured budget (cores must be known): the one place the CPU figures are read."""
    assert facts.cores is not None
    sysd, source = facts.system, facts.source
    rate = _finite(source.batches_per_s)
    fetch_mean = facts.fetch_ms("mean")
    fraction, _ = facts.cpu_fraction()
    worker_cpu_ms = _finite(max(0.0, fetch_mean * fraction)) \
        if fetch_mean is not None and fraction is not None else None
    rate = rate if rate is not None and rate > 0 else None
    process_cores = _finite(source.process.cpu_cores)
    measured = process_cores is not None
    main_in_use = max(0.0, process_cores) if process_cores is not None else 0.0
    if process_cores is None:
        step = _stat(source.step_ms, "mean")
        process_cores = min(1.0, step * rate / 1000.0) if step is not None and rate else 0.0
    process_cores = max(0.0, process_cores)
    main_cores = process_cores
    fetch_cores = _finite(worker_cpu_ms * rate / 1000.0) \
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
    busy, count = _finite(sysd.cpu_percent), facts.cpu_count
    if busy is not None and count and (workers is not None or not facts.uses_workers):
        others = max(0.0, busy / 100.0 * count - process_cores - (workers or 0.0))
        others = max(0.0, others - (count - facts.cores))  # the cores we may not use go first
        others = others if others >= 0.05 else 0.0  # readings a second apart: below is noise
    return _CpuBudget(cores=facts.cores, main_cores=main_cores, main_measured=measured,
                      others=others, worker_cpu_ms=worker_cpu_ms, main_cpu_ms=main_cpu_ms,
                      rate=rate, machine=busy / 100.0 if busy is not None else None,
                      workers_cores=workers, workers_from_rate=from_rate, main_in_use=main_in_use)


@dataclass(frozen=True)
class _WorkerPlan:
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
    budget: _CpuBudget | None
    cpu_max: float | None = None  # the most batches/s the CPU budget allows (None: not known)

    def cpu_near(self) -> bool:
        """The CPU limits the prediction, or its cap is within CPU_NEAR_CAP of it."""
        if self.bound == "cpu":
            return True
        return self.cpu_max is not None and self.cpu_max <= (1.0 + CPU_NEAR_CAP) * self.predicted

    def rate_text(self, rate_now: float | None) -> str:
        now = f", now {_fmt(rate_now)}" if rate_now is not None else ""
        return f"up to ~{_fmt(self.predicted)} batches/s{now}"

    def basis(self) -> str:
        where = "per worker" if self.now else "in the main process"
        return f"fetch {_ms(self.fetch_ms)} a batch {where}, step {_ms(self.step_ms)}"


def _worker_limit(facts: _Facts) -> int | None:
    """The most workers ever advised: IO_WORKERS_PER_CORE_MAX per core (None: cores unknown)."""
    if facts.cores is None:
        return None
    return max(1, math.floor(min(IO_WORKERS_PER_CORE_MAX * facts.cores, _FLOAT_MAX)))


def _worker_plan(facts: _Facts) -> _WorkerPlan | None:
    """None when fetch or step time is unknown."""
    fetch, step = facts.fetch_ms("mean"), _stat(facts.source.step_ms, "mean")
    if fetch is None or step is None or fetch <= 0:
        return None
    budget = facts.cpu
    limit = _worker_limit(facts)
    cpu_max = budget.max_batches_per_s() if budget is not None else None
    step_max = 1000.0 / max(step, 1e-3)

    def predicted(n: int) -> tuple[float, str]:
        options = [(n * 1000.0 / fetch, "workers"), (step_max, "step")]
        if cpu_max is not None:
            options.append((cpu_max, "cpu"))
        return min(options)

    now = facts.worker_count
    if now == 0:
        rate = _finite(facts.source.batches_per_s)
        predicted_now, bound_now = (rate, "workers") if rate is not None else (0.0, "workers")
    else:
        predicted_now, bound_now = predicted(now)
    top = limit if limit is not None else max(now + 1, _ceil(fetch / max(step, 1e-3)))
    best, _ = predicted(top)
    # predicted(n) = min(n * 1000 / fetch, a ceiling) grows with n: the smallest n near the best
    # in closed form (no loop over counts a hostile figure could make astronomical).
    count = min(top, _ceil((1.0 - NEAR_BEST) * best * fetch / 1000.0))
    rate, bound = predicted(count)
    if count <= now or rate < (1.0 + WORKER_GAIN_MIN) * predicted_now:
        return _WorkerPlan(count=None, now=now, predicted=predicted_now, predicted_now=predicted_now,
                           bound=predicted(now + 1)[1] if now else bound_now, fetch_ms=fetch,
                           step_ms=step, limit=limit, budget=budget, cpu_max=cpu_max)
    return _WorkerPlan(count=count, now=now, predicted=rate, predicted_now=predicted_now,
                       bound=bound, fetch_ms=fetch, step_ms=step, limit=limit, budget=budget,
                       cpu_max=cpu_max)


@dataclass(frozen=True)
class _MoreDidNotHelp:
    earlier: SettingFigures
    gain: float  # the current throughput over the earlier one's, less 1
    fetch_rose: float | None  # the current fetch per batch over the earlier one's


def _more_did_not_help(facts: _Facts) -> _MoreDidNotHelp | None:
    """An earlier setting of this loader, with fewer workers, that gave (about) as much: the
    measured proof that the extra workers do not help (issue 15)."""
    now_rate = _finite(facts.source.batches_per_s)
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
        return _MoreDidNotHelp(earlier=best, gain=gain, fetch_rose=rose)
    proportional = workers / best.num_workers - 1.0 if best.num_workers else math.inf
    if rose is not None and rose >= FETCH_ROSE_FACTOR and gain < QUEUE_GAIN_SHARE * proportional:
        return _MoreDidNotHelp(earlier=best, gain=gain, fetch_rose=rose)
    return None


def _rate_text(rate: float, batch_size: int | None) -> str:
    if batch_size:
        return f"{_fmt(rate * batch_size)} samples/s"
    return f"{_fmt(rate)} batches/s"


def _more_did_not_help_advice(facts: _Facts, seen: _MoreDidNotHelp, kind: str) -> list[str]:
    earlier, batch_size = seen.earlier, facts.source.config.batch_size
    now_rate = _finite(facts.source.batches_per_s) or 0.0
    sign = "+" if seen.gain >= 0 else "−"
    as_much = "as much" if seen.gain < MORE_WORKERS_GAIN_MIN else "nearly as much"
    advice = [f"num_workers={earlier.num_workers} gave {as_much}: "
              f"{_rate_text(earlier.batches_per_s, batch_size)} with "
              f"{_workers(earlier.num_workers)} earlier in this run, "
              f"{_rate_text(now_rate, batch_size)} now with {_workers(facts.worker_count)} "
              f"({sign}{_pct(abs(seen.gain))}): more workers do not help here"]
    if seen.gain >= MORE_WORKERS_GAIN_MIN and earlier.num_workers:
        ratio = facts.worker_count / earlier.num_workers
        advice.append(f"{_fmt(ratio)} × the workers would give up to "
                      f"+{_pct(ratio - 1.0)} if each kept its earlier fetch time: the knee lies "
                      f"between {earlier.num_workers} and {facts.worker_count}")
    if seen.fetch_rose is not None and seen.fetch_rose >= FETCH_ROSE_FACTOR and \
            earlier.fetch_ms is not None:
        fraction, _ = facts.cpu_fraction()
        cpu = f" while the workers' CPU share stayed at {fraction:.2f}" \
            if fraction is not None and fraction < IO_CPU_FRACTION else ""
        queue = ("they queue for the storage (or the service): it serves fewer reads at once"
                 if kind == "io" else "they queue for the CPU")
        advice.append(f"a batch took {_ms(earlier.fetch_ms)} with "
                      f"{_workers(earlier.num_workers)} and takes {_ms(facts.fetch_ms('mean') or 0)}"
                      f" now{cpu}: {queue}")
    advice.append(_TUNE_TEXT)
    return advice


_TUNE_TEXT = ("`loadertop tune -- COMMAND` runs the program with one worker count after another "
              "and finds the knee")


def _io_saturation_signs(facts: _Facts) -> list[str]:
    """The measured signs that the storage may already give all it has."""
    sysd = facts.system
    signs = []
    iowait = _finite(sysd.iowait_percent)
    if iowait is not None and iowait >= IOWAIT_HIGH_PERCENT:
        signs.append(f"iowait is {_pct_value(iowait)}")
    rate, peak = _finite(sysd.disk_read_bytes_per_s), _finite(sysd.disk_read_peak_bytes_per_s)
    if rate is not None and peak is not None and peak >= DISK_READ_NOTABLE_BYTES_PER_S \
            and rate >= DISK_NEAR_PEAK_SHARE * peak:
        signs.append(f"disk reads run at {_bytes(rate)}/s, {_pct(rate / peak)} of the most seen "
                     f"in this run ({_bytes(peak)}/s)")
    return signs


def _worker_count_advice(facts: _Facts, kind: str) -> list[str]:
    """One recommendation first (a count, or why more workers will not help), then its reason and
    the alternatives."""
    workers = facts.worker_count
    if kind == "io":
        cheaper = ("cache the data (local disk, RAM, page cache) or store it in a faster format "
                   "(fewer, larger files: WebDataset shards, LMDB, memory-mapped arrays)")
    else:
        cheaper = "make transforms cheaper (or move them to the GPU, or pre-process offline)"
    seen = _more_did_not_help(facts)
    if seen is not None:
        return [*_more_did_not_help_advice(facts, seen, kind), cheaper]

    plan = _worker_plan(facts)
    rate_now = _finite(facts.source.batches_per_s)
    advice: list[str] = []
    if plan is None:
        limit = _worker_limit(facts)
        target = max(2 * workers, workers + 1)
        if limit is not None:
            target = min(target, limit)
        if target > workers:
            advice.append(f"try num_workers={target} (fetch or step time unknown: doubling)")
        advice.append(cheaper)
        return advice

    budget = plan.budget
    if plan.count is not None:
        count = plan.count
        lead = f"try num_workers={count}" if workers else \
            f"use workers at all: try num_workers={count}"
        if kind == "io":
            lead += f", if the storage serves {count} read{'' if count == 1 else 's'} at once"
        reason = [plan.basis()]
        if budget is not None and (plan.cpu_near() or budget.main_cores >= MAIN_BUSY_CORES):
            reason.append(budget.text())
        if plan.limit is not None and count == plan.limit and plan.bound == "workers":
            reason.append(f"at most {IO_WORKERS_PER_CORE_MAX} per core on "
                          f"{_cores(facts.cores or 0)}")
        advice.append(f"{lead}: {plan.rate_text(rate_now)} ({'; '.join(reason)})")
        if kind == "io":
            signs = _io_saturation_signs(facts)
            if signs:
                advice.append(f"the storage may already be near its limit ({', '.join(signs)}): "
                              "more workers would then only queue")
            advice.append("the live view cannot tell how many reads the storage serves at once: "
                          + _TUNE_TEXT)
            advice.append(cheaper)
            advice.append("workers waiting on I/O need no core, but each one costs memory")
        else:
            advice.append(cheaper)
        if facts.cores is None:
            advice.append("core count unknown: the worker count is not capped")
        return advice

    # More workers are not predicted to help: say what limits.
    if plan.bound == "cpu" and budget is not None:
        # The CPU caps the rate near what the workers give at full speed. The verdict is not
        # cpu_saturated (it would not ask for a count), so by the same figure CPU is left (issue
        # 37): the cap is what the advice names, not "no CPU left".
        cap = budget.max_batches_per_s() or 0.0
        full = plan.now * 1000.0 / plan.fetch_ms if plan.now else 0.0
        who = _workers(plan.now)
        reach = (f"which {who} reach{'es' if plan.now == 1 else ''} at full speed" if full >= cap
                 else f"and {who} give{'s' if plan.now == 1 else ''} ~{_fmt(full)} at full speed")
        advice.append(f"more workers would add little: {budget.cap_text(rate_now)}, {reach} "
                      f"({plan.basis()})")
        advice.extend(_busy_main_advice(budget))
        advice.append(cheaper)
        return advice
    if plan.limit is not None and workers >= plan.limit:
        advice.append(f"{_workers(workers)} is already {IO_WORKERS_PER_CORE_MAX} per core on "
                      f"{_cores(facts.cores or 0)}: {cheaper}")
        return advice
    prefetch = facts.source.config.prefetch_factor or 2
    advice.append(f"{_workers(workers)} keep{'s' if workers == 1 else ''} up on average "
                  f"({plan.basis()}): the waits come in bursts; try prefetch_factor={prefetch * 2}")
    advice.append(cheaper)
    return advice


def advised_num_workers(source: SourceFigures, system: SystemFigures | None) -> int | None:
    """The worker count the live advice would have the user try for `source`, or None when it
    advises none (the loader is not input-bound, more workers are not predicted to help, or
    fetch and step times are unknown). For `loadertop tune`'s first trial."""
    verdict = diagnose(source, system)
    facts = _Facts.read(source, system)
    if verdict.category == CPU_SATURATED:
        fewer = _fewer_workers_target(facts)
        return fewer[0] if fewer is not None else None
    if verdict.category not in (INPUT_BOUND_IO, INPUT_BOUND_CPU):
        return None
    if facts.uses_workers and slow_worker(source) is not None:
        return None
    if _more_did_not_help(facts) is not None:
        return None
    plan = _worker_plan(facts)
    return plan.count if plan is not None else None
