"""The snapshot document (docs/contract.md §3), as typed, immutable msgspec Structs.

One type per object of the document. The viewer model builds them, `diagnosis` reads them and
returns a `Verdict`, and every view reads them: the TUI, the text report, `snapshot --json` (one
`msgspec.json.encode`). Decoding a document with `msgspec.json.decode(raw, type=Document)`
validates it: the field types carry the contract's ranges (fractions in 0..1, counts >= 0), and a
field's definition order is its key order in the JSON.

A figure that cannot be known is None (JSON null), never a made-up 0. A `Stats` object is either
present with all five figures, or the whole figure is None.

Schema `loadertop.snapshot/1` grows only by adding keys (docs/contract.md §5's `stages` and `findings` are
the next): a new field gets a new Struct here and one line in `SourceFigures` or `Document`.
Readers of an older document ignore keys they do not know.

This module is shared by both sides of the project and imports nothing but msgspec: no torch,
textual or zmq.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

import msgspec
from msgspec import Meta

SNAPSHOT_SCHEMA: Final = "loadertop.snapshot/1"

#: The source states of docs/contract.md §3 (their rules: `client.model`).
State = Literal["running", "waiting", "stalled", "idle", "finished", "gone"]
STATES: tuple[State, ...] = get_args(State)

#: The diagnosis categories of docs/contract.md §4. `loadertop.diagnosis` names each one as a constant
#: (a test checks the two sets are the same).
Category = Literal["idle", "insufficient_data", "compute_bound", "input_bound_io",
                   "input_bound_cpu", "cpu_saturated", "main_process_bound", "memory_pressure",
                   "stalled", "epoch_start_bound"]

#: The findings of docs/contract.md §5 (their rules: `loadertop.findings`) and their severities.
FindingKind = Literal["worker_hung", "loop_hung", "worker_died", "oom_killed", "slow_worker",
                      "copy_on_read", "memory_growth", "duplicate_rng", "shm_low", "fd_low",
                      "threads_oversubscribed", "epoch_start_slow"]
FINDING_KINDS: tuple[FindingKind, ...] = get_args(FindingKind)
Severity = Literal["critical", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)

Count = Annotated[int, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
NonNegative = Annotated[float, Meta(ge=0)]
Percent = Annotated[float, Meta(ge=0, le=100)]
Milliseconds = Annotated[float, Meta(ge=0)]


class _Figures(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Base of every document object: immutable, built by keyword, and — holding no reference
    cycles — kept out of the garbage collector's way (`gc=False`): a viewer builds thousands a
    minute. (msgspec 0.19 passes `frozen` and `gc` on to subclasses, but `kw_only` applies to the
    fields a class itself defines: every subclass repeats `kw_only=True`, so a field with a
    default — the keys added after schema 1's release — may come before one without.)"""


class Stats(_Figures, frozen=True, kw_only=True):
    """A distribution over the window, in milliseconds."""

    mean: Milliseconds
    p50: Milliseconds
    p95: Milliseconds
    p99: Milliseconds
    max: Milliseconds


class LoaderConfig(_Figures, frozen=True, kw_only=True):
    num_workers: Count
    batch_size: Count | None
    prefetch_factor: Count | None  # None with num_workers=0
    pin_memory: bool
    persistent_workers: bool
    dataset: str  # the dataset's class name
    worker_context: str | None  # fork / spawn / forkserver; None with num_workers=0


class QueueFigures(_Figures, frozen=True, kw_only=True):
    ready: Count | None  # the latest sample; None when torch's internals could not be read
    in_flight: Count | None
    capacity: Count | None  # num_workers * prefetch_factor (0 with num_workers=0)
    ready_mean: NonNegative | None
    in_flight_mean: NonNegative | None
    # Of the samples taken while the loop was blocked in next(), the share that found another
    # batch ready; `waiting_samples` is how many such samples there were.
    ready_when_waiting: Fraction | None
    waiting_samples: Count
    # The loop thread's CPU share inside long next() calls (None before 100 ms of them).
    loop_cpu_when_waiting: Fraction | None


class StackFigures(_Figures, frozen=True, kw_only=True):
    """A thread's Python stack as the probe read it: innermost frame last, each
    `"file:line in function"`; `user_frame` indexes the innermost frame of the user's own code
    (None when every frame is the standard library's, torch's or loadertop's)."""

    frames: tuple[str, ...]
    user_frame: Count | None
    taken_at: NonNegative  # Unix time


class MemoryTrend(_Figures, frozen=True, kw_only=True):
    """A memory figure's course over the samples kept (warm-up excluded): first and last reading,
    the least-squares slope, and the share of consecutive samples that rose (1: every one)."""

    over_s: NonNegative
    first_bytes: Count
    last_bytes: Count
    slope_bytes_per_s: float
    rising_share: Fraction
    samples: Count


class HistogramFigures(_Figures, frozen=True, kw_only=True):
    """Every value the probe counted since it began recording the loader — cumulative over the
    loader's life, not the window, and every batch, not a sample (docs/contract.md §8: what `loadertop
    export` serves as a Prometheus histogram). `counts[i]` values lie in (`le_ms[i-1]`,
    `le_ms[i]`]; the last count, one more than the bounds, is beyond the last bound (+Inf).
    `count` is their number and `sum_ms` their sum."""

    le_ms: tuple[Milliseconds, ...]
    counts: tuple[Count, ...]
    count: Count
    sum_ms: Milliseconds


class WorkerFigures(_Figures, frozen=True, kw_only=True):
    id: Count
    pid: Count | None
    alive: bool | None
    exitcode: int | None  # negative: killed by that signal
    cpu_percent: NonNegative | None  # of one core; above 100 with threads
    rss_bytes: Count | None
    batches: Count
    fetch_ms: Stats | None  # per batch, getting the items (collate_fn excluded)
    collate_ms: Stats | None  # per batch, the collate_fn
    cpu_fraction: Fraction | None  # CPU time / wall time while producing batches
    # Inside its current batch for this long (None: not busy or unknown), and then its stack.
    busy_ms: Milliseconds | None = None
    stack: StackFigures | None = None
    # The slow readings (every few seconds): private memory, open files, threads.
    uss_bytes: Count | None = None
    pss_bytes: Count | None = None
    fds: Count | None = None
    threads: Count | None = None
    uss_trend: MemoryTrend | None = None
    rss_trend: MemoryTrend | None = None
    # Every batch this worker id fetched (items, as `fetch_ms`), since the loader began; None
    # from a probe that does not count them.
    fetch_histogram: HistogramFigures | None = None


class ProcessFigures(_Figures, frozen=True, kw_only=True):
    """The training process itself (slow readings, every few seconds; None until the first)."""

    rss_bytes: Count | None = None
    uss_bytes: Count | None = None
    fds: Count | None = None
    fd_limit: Count | None = None  # RLIMIT_NOFILE (soft)
    threads: Count | None = None
    rss_trend: MemoryTrend | None = None
    uss_trend: MemoryTrend | None = None
    age_s: NonNegative | None = None  # since the readings were taken
    # From every report, over the window (not slow readings): the CPU the training process used,
    # in cores (every thread: the loop, pin_memory's, the probe's; its workers are not counted),
    # and the share of it that the thread iterating this loader used.
    cpu_cores: NonNegative | None = None
    loop_cpu_cores: NonNegative | None = None


class AutotuneBest(_Figures, frozen=True, kw_only=True):
    num_workers: Count
    samples_per_s: NonNegative | None


class AutotuneTried(_Figures, frozen=True, kw_only=True):
    num_workers: Count
    samples_per_s: NonNegative | None
    noise: NonNegative  # the rate's standard error, relative to it
    epochs: Count  # its measurements: epochs, and windows inside an epoch
    note: str | None = None  # "memory" or "failed": never tried again in the run
    windows: Count = 0  # of `epochs`, windows inside a long epoch


class AutotuneSwitchFigures(_Figures, frozen=True, kw_only=True):
    """One change of num_workers inside an epoch (docs/contract.md §10)."""

    epoch: Count  # the loader's epoch, from 0
    batch: Count  # the loop had this many of the epoch's batches when it began
    from_workers: Count = msgspec.field(name="from")
    to_workers: Count = msgspec.field(name="to")
    reason: str
    gain: float | None = None  # the new count's rate over the old one's, once both are measured
    prefetch_factor: Count | None = None  # the new iterator's, where the switch changed it


class AutotuneFigures(_Figures, frozen=True, kw_only=True):
    """`run --autotune`'s state for one loader (docs/contract.md §10)."""

    state: str  # exploring | settled | backing_off
    num_workers: Count  # the count of the epoch running now
    program_num_workers: Count
    epoch: Count  # epochs the tuner has seen end
    best: AutotuneBest | None
    tried: tuple[AutotuneTried, ...]
    reason: str
    switches: tuple[AutotuneSwitchFigures, ...] = ()  # inside epochs, the latest (up to 64)
    switch_count: Count = 0  # ... and how many there were in all
    fixed: str | None = None  # why the count changes only between epochs (None: it may inside)
    prefetch_factor: Count | None = None  # the one the loader gets now ...
    program_prefetch_factor: Count | None = None  # ... and the program's


class SettingFigures(_Figures, frozen=True, kw_only=True):
    """An earlier setting of this loader in this run: the program re-created it with another
    `num_workers` or `batch_size`. Its latest stretch (up to 30 s, start-up excluded), as sums."""

    num_workers: Count
    batch_size: Count | None
    seconds: NonNegative  # the time measured
    batches: Count
    batches_per_s: NonNegative
    samples_per_s: NonNegative | None
    fetch_ms: NonNegative | None  # mean per batch, items and collate (with 0 workers: the wait)
    cpu_fraction: Fraction | None  # the workers' CPU time / wall time while producing batches
    wait_fraction: Fraction
    workers_rss_bytes: Count | None  # the workers' RSS, summed, at the end of the stretch
    ended_at: NonNegative  # Unix time (when the viewer received its last report)


class EndFigures(_Figures, frozen=True, kw_only=True):
    """How the loop ended: `finished` (the process said goodbye, no error), `crashed` (an
    exception other than StopIteration left next(): `error` is `"Type: message"`), `stopped` (a
    signal ended it: SIGTERM, ^C, or a `SystemExit(128 + N)` a signal's handler raised) or
    `died` (the process is gone without a goodbye, e.g. SIGKILL: `error` says how, as far as its
    black box and its cgroup tell; `at` is its last report). `ended` is the job's end in the
    words of `loadertop ls` (docs/contract.md §9: `client.ending`), the same on every screen;
    `oom_killer` whether a death names the OOM killer (`counted`: its cgroup counted the kill;
    `likely`: memory was near a limit)."""

    how: Literal["finished", "crashed", "stopped", "died"]
    error: str | None
    at: NonNegative | None  # Unix time
    ended: str = ""
    oom_killer: Literal["counted", "likely"] | None = None


class RngShareFigures(_Figures, frozen=True, kw_only=True):
    state: str  # e.g. "dataset.rng (numpy Generator)"
    workers: tuple[Count, ...]


class RngFigures(_Figures, frozen=True, kw_only=True):
    """The random states this epoch's workers started with: how many workers were read, and the
    states two or more of them share (their augmentations repeat)."""

    checked_workers: Count = 0
    shared: tuple[RngShareFigures, ...] = ()


class Finding(_Figures, frozen=True, kw_only=True):
    """One pitfall found live (docs/contract.md §5): `since` is when its condition began (Unix time);
    it stays listed while the condition holds and `findings.LINGER_S` after."""

    kind: FindingKind
    severity: Severity
    source: str | None  # None: about the machine
    worker: Count | None
    since: NonNegative
    summary: str
    evidence: tuple[str, ...]
    advice: tuple[str, ...]
    stack: tuple[str, ...] | None
    user_frame: Count | None = None  # in `stack`: the innermost frame of the user's own code


class LoopFigures(_Figures, frozen=True, kw_only=True):
    """num_workers=0: the main process fetches each batch itself (None with workers)."""

    fetch_ms: Stats | None
    cpu_fraction: Fraction | None


class WaitSplit(_Figures, frozen=True, kw_only=True):
    """Of the loop's wait: the share before the batch it waited for was produced, and after."""

    producing: Fraction
    handoff: Fraction


class StageFigures(_Figures, frozen=True, kw_only=True):
    """Where a batch's time goes (docs/contract.md §5), over the window.

    `fetch_ms` and `collate_ms` come from every batch a worker made (with `num_workers=0`, from one
    batch per 10 ms timed in the loop). `handoff_ms` and `wait_split` rest on the batches the probe
    could pair with the moment their worker produced them (`batches_paired`); `unpaired` says why
    none could be (`in_order_false`, `iterable_ended`, `unreadable`, `lost_count`, `overflow`,
    `inconsistent`, `workers_unhooked`) — the figures are then None, never a guess. `tensors_per_batch` and
    `bytes_per_batch` describe a recently sampled batch (workers only).
    """

    fetch_ms: Stats | None
    collate_ms: Stats | None
    handoff_ms: Stats | None
    wait_split: WaitSplit | None
    batches_paired: Count
    unpaired: str | None
    tensors_per_batch: Count | None
    bytes_per_batch: Count | None


class EpochFigures(_Figures, frozen=True, kw_only=True):
    """One epoch of the loader that has ended (the next `iter()` began), in ms of the loop's
    time: from its `iter()` to its first batch (`start_ms`: torch starts the workers there,
    spawn pickles the dataset to each, the first `next()` waits for them), of that the first
    `next()` (`first_wait_ms`, counted in the wait too), from its first batch to its last
    (`run_ms`), and the loop's wait in `next()` for the batches after the first (`run_wait_ms`)."""

    epoch: Count  # the loader's count of its epochs (its first iter() is 1)
    start_ms: Milliseconds
    first_wait_ms: Milliseconds
    run_ms: Milliseconds
    run_wait_ms: Milliseconds


class Verdict(_Figures, frozen=True, kw_only=True):
    """One source's diagnosis (docs/contract.md §4): what limits it, the figures that decided, what to do.

    `pending`: the category the latest figures point to while the verdict's hysteresis still
    holds this one (`client.hysteresis`); the summary, evidence and advice are then this
    category's words for those latest figures. None when nothing is pending."""

    category: Category
    summary: str
    evidence: tuple[str, ...]
    advice: tuple[str, ...]
    pending: Category | None = None


class OverallVerdict(_Figures, frozen=True, kw_only=True):
    """The document's top-level diagnosis: the most urgent source's verdict (`source` its id) —
    with ranks, the straggler's, its summary saying that rank holds the job back — or one about
    the machine as a whole (`source` None)."""

    category: Category
    source: str | None
    summary: str
    evidence: tuple[str, ...]
    advice: tuple[str, ...]
    pending: Category | None = None  # as `Verdict.pending`, of the verdict shown here


class SourceFigures(_Figures, frozen=True, kw_only=True):
    """What is measured of one DataLoader over the window: the input of `diagnosis.diagnose`."""

    id: str  # host:pid:name
    host: str
    pid: Count
    rank: Count | None
    name: str
    state: State
    config: LoaderConfig
    batches: Count  # in the window
    batches_total: Count
    batches_per_s: NonNegative | None
    samples_per_s: NonNegative | None
    wait_ms: Stats | None  # the loop blocked in next(), per batch
    step_ms: Stats | None  # the loop's own time between batches
    wait_fraction: Fraction | None
    blocked_ms: NonNegative | None  # inside next() right now, for this long
    queue: QueueFigures
    workers: tuple[WorkerFigures, ...]
    loop: LoopFigures
    epoch: Count
    command: str
    endpoint: str | None
    started_at: NonNegative  # the process's start (Unix time)
    age_s: NonNegative  # since the source's last report
    window_s: NonNegative  # the time the window's reports cover
    dropped: Count  # reports lost on the way plus samples the probe dropped
    probe_cpu_fraction: NonNegative | None  # the shim's background thread, in cores
    stages: StageFigures  # docs/contract.md §5
    # Keys added after schema 1's first release (docs/contract.md §5) have defaults, so a document or
    # recording written before them still decodes.
    process: ProcessFigures = msgspec.field(default_factory=ProcessFigures)
    loop_stack: StackFigures | None = None  # while the loop is blocked in next() for a while
    end: EndFigures | None = None  # None while the loop runs without error
    epoch_starts_ms: tuple[Milliseconds, ...] = ()  # recent epochs' first-batch latency
    epochs: tuple[EpochFigures, ...] = ()  # the latest epochs that ended, oldest first
    rng: RngFigures = msgspec.field(default_factory=RngFigures)
    earlier_settings: tuple[SettingFigures, ...] = ()  # oldest first; the current one is not listed
    # Every wait and step since the loader began (docs/contract.md §8), None from a probe that does not
    # count them.
    wait_histogram: HistogramFigures | None = None
    step_histogram: HistogramFigures | None = None
    autotune: AutotuneFigures | None = None  # `run --autotune` only (docs/contract.md §10)


class Source(SourceFigures, frozen=True, kw_only=True):
    """A `sources[]` entry: the figures, their verdict and findings (most severe first)."""

    diagnosis: Verdict
    findings: tuple[Finding, ...] = ()


class GpuProcess(_Figures, frozen=True, kw_only=True):
    pid: Count
    used_mem_bytes: Count | None


class GpuFigures(_Figures, frozen=True, kw_only=True):
    index: Count
    name: str
    uuid: str | None
    util_percent: Percent | None
    mem_util_percent: Percent | None
    mem_used_bytes: Count | None
    mem_total_bytes: Count | None
    temperature_c: float | None
    power_w: NonNegative | None
    power_limit_w: NonNegative | None
    processes: tuple[GpuProcess, ...]


class CgroupFigures(_Figures, frozen=True, kw_only=True):
    version: int | None
    cpu_quota_cores: NonNegative | None
    mem_limit_bytes: Count | None
    mem_used_bytes: Count | None


class ShmFigures(_Figures, frozen=True, kw_only=True):
    path: str  # /dev/shm, or LOADERTOP_SHM_PATH
    total_bytes: Count
    free_bytes: Count


class SystemFigures(_Figures, frozen=True, kw_only=True):
    """The trainer's machine, as sampled on the trainer's side (cgroup-aware)."""

    host: str
    sent_at: NonNegative  # when the trainer sampled it (Unix time)
    cpu_count: Count
    cores_available: NonNegative | None  # cgroup quota and affinity applied
    cpu_percent: Percent | None
    per_cpu_percent: tuple[Percent, ...] | None
    iowait_percent: Percent | None
    load_avg_1m: NonNegative | None
    mem_total_bytes: Count | None
    mem_available_bytes: Count | None
    mem_used_percent: Percent | None
    swap_total_bytes: Count | None
    swap_used_bytes: Count | None
    swap_in_bytes_per_s: NonNegative | None
    swap_out_bytes_per_s: NonNegative | None
    disk_read_bytes_per_s: NonNegative | None
    disk_write_bytes_per_s: NonNegative | None
    cgroup: CgroupFigures | None
    gpu_status: str  # "ok" | "no_nvml" | "no_gpu" | "error: …"
    gpus: tuple[GpuFigures, ...]
    age_s: NonNegative  # since the viewer received it
    shm: ShmFigures | None = None
    # The highest disk read rate of this machine's reports since the viewer began receiving them
    # (1 s readings): a rate near it says the storage may be giving all it has.
    disk_read_peak_bytes_per_s: NonNegative | None = None


class RankFigures(_Figures, frozen=True, kw_only=True):
    rank: Count
    id: str
    wait_fraction: Fraction
    batches_per_s: NonNegative | None


class RankGroup(_Figures, frozen=True, kw_only=True):
    """The ranks of one loader name (a distributed run), beside their median wait fraction."""

    name: str
    median_wait_fraction: Fraction
    ranks: tuple[RankFigures, ...]


class Ranks(_Figures, frozen=True, kw_only=True):
    straggler: str | None  # the source whose waiting holds the other ranks back
    straggler_rank: Count | None
    groups: tuple[RankGroup, ...]


class ViewerStatus(_Figures, frozen=True, kw_only=True):
    endpoints: tuple[str, ...]
    connected: bool  # an endpoint delivered within the last few seconds
    received: Count
    bad_messages: Count  # malformed, foreign or too large: counted and dropped
    wrong_version: Count  # frames of another schema version
    discovery_dir: str | None


class WorstFinding(_Figures, frozen=True, kw_only=True):
    kind: FindingKind
    severity: Severity
    summary: str


class JobSummary(_Figures, frozen=True, kw_only=True):
    """A job of this machine's black boxes as `loadertop ls --json` lists it (docs/contract.md §9):
    `ended` in `client.ending`'s words; `duration_s` to its end (until now while it runs; null
    when unknown); `worst_finding` the most severe finding at the end of its recording;
    `recording` its newest segment."""

    pid: Annotated[int, Meta(ge=1)]
    host: str
    command: str
    started_at: float
    duration_s: NonNegative | None
    ended: str
    worst_finding: WorstFinding | None
    recording: str | None


class Document(_Figures, frozen=True, kw_only=True):
    schema: Literal["loadertop.snapshot/1"]
    taken_at: NonNegative
    window_s: NonNegative
    sources: tuple[Source, ...]
    system: SystemFigures | None
    diagnosis: OverallVerdict
    findings: tuple[Finding, ...] = ()  # every source's and the machine's own; most severe first
    ranks: Ranks
    viewer: ViewerStatus
    # With no live source (`snapshot --json` exits 1): the job that ended last, as `ls --json`
    # lists it (docs/contract.md §3); null otherwise, or when no job ended.
    last_job: JobSummary | None = None


def encode_json(document: Document, *, indent: int = 2) -> bytes:
    """The document as `snapshot --json` prints it (NaN, should one slip in, becomes null)."""
    raw = msgspec.json.encode(document)
    return msgspec.json.format(raw, indent=indent) if indent else raw


def decode_json(raw: bytes | str) -> Document:
    """Parse and validate a document; raises `msgspec.ValidationError` / `DecodeError`."""
    return msgspec.json.decode(raw, type=Document)
