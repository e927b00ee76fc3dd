"""The message schema and codec shared by the probe (inside training) and the viewer.

Every frame on the wire is ``PREFIX + version + b"\\0" + msgpack body``. The prefix doubles as the
ZeroMQ subscription topic, so a viewer subscribes to ``b"loadertop/"`` and still *sees* messages of
a foreign schema version, which it counts and drops instead of mis-decoding. No pickle: the body is
msgspec msgpack decoded straight into typed, bounded Structs, so a hostile or corrupt frame can
only ever raise :class:`WireError`.

The viewer side imports this module, so it must never import torch (nor zmq: framing is bytes).

No `from __future__ import annotations` here: msgspec reads each Struct's annotations when the
class is made, and string annotations cost it an eval each (typing._eval_type, a compile() per
annotation; docs/performance.md: the import with and without). The probe imports it at a
program's first loader. `X | None` needs
Python >= 3.10, which pyproject.toml requires.
"""

import operator
from itertools import repeat
from typing import Annotated

import msgspec
from msgspec import Meta

SCHEMA_VERSION = 1
TOPIC = b"loadertop/"
FRAME_PREFIX = TOPIC + str(SCHEMA_VERSION).encode() + b"\0"

# Bounds: a message from a socket is untrusted; these keep one frame's cost to the viewer small.
MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_SAMPLES = 4096  # samples of one kind in one report (the probe decimates beyond this)
MAX_WORKERS = 1024
MAX_TEXT = 4096

Count = Annotated[int, Meta(ge=0)]
Pid = Annotated[int, Meta(ge=0, le=2**32)]
Micros = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1000)]  # cpu fractions can exceed 1 with threads
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
ShortText = Annotated[str, Meta(max_length=256)]
# Sequences decode as tuples and the report structs are gc=False: a viewer keeps HISTORY_S of
# every source's reports (for 64 sources ~3k reports, ~70k sequences), and as lists in tracked
# structs they were objects that each full garbage collection walked (docs/performance.md: what
# that cost `loadertop export`). The collector untracks a tuple of numbers or strings
# the first time it looks at it, and nothing decoded from the wire can form a cycle. The probe
# still builds them from lists (msgpack arrays alike); nothing reads them back there.
Samples = Annotated[tuple[Micros, ...], Meta(max_length=MAX_SAMPLES)]

# The fixed buckets every wait, step and worker fetch is counted in (docs/contract.md §8: Prometheus
# histograms that count every batch, where the samples above are decimated). Upper bounds in ns,
# from 50 µs (a batch handed over from a full queue) to 60 s (a stall); one more bucket holds what
# lies beyond the last bound. Fixed within schema 1: other bounds would be another field.
HISTOGRAM_BOUNDS_NS: tuple[int, ...] = tuple(round(us * 1000) for us in (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000))
MAX_BUCKETS = 64


class WireError(ValueError):
    """A frame that is not a valid loadertop message; ``reason`` is a short counter key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class LoaderConfig(msgspec.Struct, frozen=True, gc=False):
    num_workers: Count
    batch_size: Annotated[int, Meta(ge=0)] | None
    prefetch_factor: Count | None
    pin_memory: bool
    persistent_workers: bool
    dataset: ShortText
    worker_context: ShortText | None
    drop_last: bool = False
    iterable: bool = False


class QueueReport(msgspec.Struct, frozen=True, gc=False):
    """Queue depth as sampled by the probe's background thread during one report interval.

    ``ready``/``in_flight`` are the latest sample (None when torch's internals could not be read);
    the sums over ``samples`` give means; ``waiting_samples`` counts samples taken while the loop
    was blocked in ``next()`` and ``waiting_ready_samples`` those of them that found a batch ready.
    """

    capacity: Count | None
    ready: Count | None = None
    in_flight: Count | None = None
    samples: Count = 0
    ready_sum: Count = 0
    in_flight_sum: Count = 0
    waiting_samples: Count = 0
    waiting_ready_samples: Count = 0
    # CPU time the loop's thread used between consecutive samples that caught it inside the same
    # next() call: near 0 means it was blocked (or starved), near 1 that it was busy receiving.
    waiting_cpu_ns: Count = 0
    waiting_wall_ns: Count = 0


MAX_FRAMES = 256  # frames of one stack (innermost kept)
Frames = Annotated[tuple[Text, ...], Meta(max_length=MAX_FRAMES)]


class Stack(msgspec.Struct, frozen=True, gc=False):
    """A thread's Python stack, innermost frame last, each ``"file:line in function"``.

    ``user_frame`` indexes the innermost frame of the user's own code (not the standard library,
    torch or loadertop), judged on the trainer's side where those paths are known; None when every
    frame is a library's. ``taken_at`` is when it was read (Unix time)."""

    frames: Frames
    user_frame: Annotated[int, Meta(ge=0, lt=MAX_FRAMES)] | None = None
    taken_at: Seconds = 0.0


class WorkerResources(msgspec.Struct, frozen=True, gc=False):
    """One worker's slow readings (every few seconds, the probe thread): private memory, open
    files, threads. None where this platform or permissions do not tell."""

    id: Count
    pid: Pid
    uss_bytes: Count | None = None
    pss_bytes: Count | None = None
    rss_bytes: Count | None = None
    fds: Count | None = None
    threads: Count | None = None


class ResourceReport(msgspec.Struct, frozen=True, gc=False):
    """The training process's and its workers' slow readings, sampled every few seconds by the
    probe thread (never the training thread); sent in the report after each sample."""

    sampled_at: Seconds
    rss_bytes: Count | None = None
    uss_bytes: Count | None = None
    fds: Count | None = None
    fd_limit: Count | None = None  # RLIMIT_NOFILE, soft
    threads: Count | None = None
    workers: Annotated[tuple[WorkerResources, ...], Meta(max_length=MAX_WORKERS)] = ()


class LoopError(msgspec.Struct, frozen=True, gc=False):
    """An exception other than StopIteration that left the loop's next() (the loop ended)."""

    type: ShortText
    message: Text
    at: Seconds  # Unix time


class RngShare(msgspec.Struct, frozen=True, gc=False):
    """A random state that two or more workers of one epoch started with identically."""

    state: ShortText  # e.g. "dataset.rng (numpy Generator)", "numpy global", "random"
    workers: Annotated[tuple[Count, ...], Meta(max_length=MAX_WORKERS)]


class Histogram(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Every value counted since the probe began recording this loader (cumulative, so a report
    lost on the way loses nothing): ``counts[i]`` values in (bound i-1, bound i] of
    HISTOGRAM_BOUNDS_NS (a value equal to a bound is in that bound's bucket, as Prometheus's
    ``le``), the last beyond the last bound; ``sum_ns`` their sum. A viewer ignores a histogram
    whose length is not ``len(HISTOGRAM_BOUNDS_NS) + 1``."""

    counts: Annotated[tuple[Count, ...], Meta(max_length=MAX_BUCKETS)]
    sum_ns: Count = 0


class EpochReport(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One epoch of the loader that has ended (the next `iter()` began), in ms of the loop's
    time (docs/contract.md §5): from its `iter()` to its first batch (`start_ms`: torch starts the
    workers there, spawn pickles the dataset to each, and the first `next()` waits for them), of
    that the first `next()` (`first_wait_ms`), from its first batch to its last (`run_ms`), and the
    loop's wait in `next()` for the batches after the first (`run_wait_ms`)."""

    epoch: Count
    start_ms: Annotated[float, Meta(ge=0)]
    first_wait_ms: Annotated[float, Meta(ge=0)]
    run_ms: Annotated[float, Meta(ge=0)]
    run_wait_ms: Annotated[float, Meta(ge=0)]


class WorkerReport(msgspec.Struct, frozen=True, gc=False):
    id: Count
    pid: Pid | None
    alive: bool | None
    exitcode: int | None = None
    cpu_percent: Annotated[float, Meta(ge=0)] | None = None
    rss_bytes: Count | None = None
    batches: Count = 0  # batches this worker finished fetching during the interval
    fetch_us: Samples = ()  # per batch: getting the items, collate_fn excluded (possibly decimated)
    fetch_wall_ns: Count = 0  # exact sums over all `batches` (items and collate), for cpu_fraction
    fetch_cpu_ns: Count = 0
    collate_us: Samples = ()  # per batch: the collate_fn
    # Inside its current batch for this long (None: not busy, or unknown): it has work
    # outstanding and produced nothing since. With `stack` once that passes STACK_AFTER_MS.
    busy_ms: Annotated[float, Meta(ge=0)] | None = None
    stack: Stack | None = None
    # Every batch this worker id fetched (items, collate_fn excluded, as `fetch_us`), cumulative
    # over the loader's life and its epochs' worker processes; None from an older probe.
    fetch_histogram: Histogram | None = None


class StageReport(msgspec.Struct, frozen=True, gc=False):
    """Where the loop's wait went during one interval (docs/contract.md §5).

    With workers, each batch the loop received is paired with the stamp its worker took when the
    batch was produced; ``handoff_us`` and the two sums cover the paired batches only.
    ``unpaired`` says why no batch could be paired (``in_order_false``, ``iterable_ended``,
    ``unreadable``, ``overflow``, ``workers_unhooked``) — the viewer then shows ``null``, never a guess. With
    ``num_workers=0`` the loop fetches itself: one batch per ``LOOP_CPU_SAMPLE_NS`` is timed
    stage by stage, and ``fetch_us``/``collate_us`` hold those samples.
    """

    paired: Count = 0
    producing_ns: Count = 0  # of the paired batches' waits: before the batch was produced
    handoff_ns: Count = 0  # ... and after
    handoff_us: Samples = ()
    fetch_us: Samples = ()  # num_workers=0 only (workers report theirs in WorkerReport)
    collate_us: Samples = ()
    unpaired: ShortText | None = None
    batch_tensors: Count | None = None  # the latest sampled batch: how many tensors it holds
    batch_bytes: Count | None = None  # ... and their bytes


class AutotuneSetting(msgspec.Struct, frozen=True, gc=False):
    """One num_workers `run --autotune` measured (docs/contract.md §10)."""

    num_workers: Count
    samples_per_s: Annotated[float, Meta(ge=0)] | None
    noise: Annotated[float, Meta(ge=0)]  # the rate's standard error, relative to it
    epochs: Count  # its measurements: epochs, and windows inside an epoch
    note: ShortText | None = None  # "memory" or "failed": never tried again in the run
    windows: Count = 0  # of `epochs`, windows inside a long epoch


class AutotuneSwitch(msgspec.Struct, frozen=True, gc=False):
    """One change of num_workers inside an epoch (docs/contract.md §10)."""

    epoch: Count  # the loader's epoch, from 0
    batch: Count  # the loop had this many of the epoch's batches when it began
    from_workers: Count = msgspec.field(name="from")
    to_workers: Count = msgspec.field(name="to")
    reason: Text = ""
    gain: float | None = None  # the new count's rate over the old one's, once both are measured
    prefetch_factor: Count | None = None  # the new iterator's, where the switch changed it


class AutotuneReport(msgspec.Struct, frozen=True, gc=False):
    """What `run --autotune` is doing with this loader's num_workers (docs/contract.md §10)."""

    state: ShortText  # exploring | settled | backing_off
    num_workers: Count  # the count of the epoch running now (or the next one)
    program_num_workers: Count  # the program's own
    epoch: Count  # epochs the tuner has seen end
    best_num_workers: Count | None
    best_samples_per_s: Annotated[float, Meta(ge=0)] | None
    tried: Annotated[tuple[AutotuneSetting, ...], Meta(max_length=256)]
    reason: Text
    # inside epochs: the latest switches, how many there were, and why the loader has none
    switches: Annotated[tuple[AutotuneSwitch, ...], Meta(max_length=64)] = ()
    switch_count: Count = 0
    fixed: ShortText | None = None
    # prefetch_factor: the one the loader gets now, and the program's (None without workers)
    prefetch_factor: Count | None = None
    program_prefetch_factor: Count | None = None


class LoaderReport(msgspec.Struct, frozen=True, gc=False, tag="loader"):
    """One loader's activity since its previous report; identity and config repeat in every report
    so a viewer that joins late needs only one message to know the source."""

    source: Text
    seq: Count
    host: ShortText
    pid: Pid
    name: ShortText
    rank: Annotated[int, Meta(ge=0)] | None
    command: Text
    process_started_at: Seconds
    sent_at: Seconds
    interval_s: Annotated[float, Meta(ge=0, le=3600)]
    config: LoaderConfig
    epoch: Count
    batches: Count
    batches_total: Count
    wait_ns: Count  # exact sums over `batches`
    step_ns: Count
    wait_us: Samples
    step_us: Samples
    blocked_ms: Annotated[float, Meta(ge=0)] | None  # inside next() right now, for this long
    queue: QueueReport
    workers: Annotated[tuple[WorkerReport, ...], Meta(max_length=MAX_WORKERS)]
    loop_fetch_us: Samples = ()  # num_workers=0: the main process fetches, sampled
    loop_fetch_wall_ns: Count = 0
    loop_fetch_cpu_ns: Count = 0
    dropped: Count = 0  # messages or samples the probe knows it lost, cumulative
    probe_cpu_fraction: Fraction | None = None
    stages: StageReport | None = None
    resources: ResourceReport | None = None  # in the report after each slow sample
    loop_stack: Stack | None = None  # the loop's thread, while blocked in next() for a while
    error: LoopError | None = None  # the last exception out of next() this epoch
    # First-batch latency of the latest epochs (up to 8, oldest first; in every report): from
    # the loader's iter() (torch starts the workers there) to the loop having batch 0.
    epoch_starts_ms: Annotated[tuple[Annotated[float, Meta(ge=0)], ...], Meta(max_length=64)] = ()
    # The latest epochs that ended (up to 4, oldest first; in every report; () from an older
    # probe): where each epoch's time went, its start apart from the rest.
    epochs: Annotated[tuple[EpochReport, ...], Meta(max_length=64)] = ()
    rng_checked: Count = 0  # workers of this epoch whose starting random state was read
    rng_shared: Annotated[tuple[RngShare, ...], Meta(max_length=64)] = ()
    # CPU time over this report's interval (None where it could not be read): the whole training
    # process (every thread, its workers not included) and the thread that iterates this loader.
    process_cpu_ns: Count | None = None
    loop_cpu_ns: Count | None = None
    # Every wait and step since the probe began recording this loader (not decimated; None from
    # an older probe): what `loadertop export` serves as Prometheus histograms.
    wait_histogram: Histogram | None = None
    step_histogram: Histogram | None = None
    # `run --autotune` only (None otherwise, and from an older probe): docs/contract.md §10.
    autotune: AutotuneReport | None = None


class GpuProcess(msgspec.Struct, frozen=True, gc=False):
    pid: Pid
    used_mem_bytes: Count | None = None


class GpuReport(msgspec.Struct, frozen=True, gc=False):
    index: Count
    name: ShortText
    uuid: ShortText | None = None
    util_percent: float | None = None
    mem_util_percent: float | None = None
    mem_used_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: Annotated[tuple[GpuProcess, ...], Meta(max_length=MAX_WORKERS)] = ()


class CgroupReport(msgspec.Struct, frozen=True, gc=False):
    version: int | None = None
    cpu_quota_cores: float | None = None
    mem_limit_bytes: Count | None = None
    mem_used_bytes: Count | None = None


class SystemReport(msgspec.Struct, frozen=True, gc=False, tag="system"):
    """The trainer's machine, sampled on the trainer's side (a remote viewer must see *its* CPU)."""

    host: ShortText
    seq: Count
    sent_at: Seconds
    cpu_count: Count
    cores_available: float | None = None
    cpu_percent: float | None = None
    per_cpu_percent: Annotated[tuple[float, ...], Meta(max_length=4096)] | None = None
    iowait_percent: float | None = None
    load_avg_1m: float | None = None
    mem_total_bytes: Count | None = None
    mem_available_bytes: Count | None = None
    mem_used_percent: float | None = None
    swap_total_bytes: Count | None = None
    swap_used_bytes: Count | None = None
    swap_in_bytes_per_s: float | None = None
    swap_out_bytes_per_s: float | None = None
    disk_read_bytes_per_s: float | None = None
    disk_write_bytes_per_s: float | None = None
    cgroup: CgroupReport | None = None
    gpu_status: ShortText = "no_nvml"
    gpus: Annotated[tuple[GpuReport, ...], Meta(max_length=64)] = ()
    # /dev/shm (or LOADERTOP_SHM_PATH): workers hand batches over through it.
    shm_path: ShortText | None = None
    shm_total_bytes: Count | None = None
    shm_free_bytes: Count | None = None


class Goodbye(msgspec.Struct, frozen=True, gc=False, tag="bye"):
    """The source's process is exiting (at exit, even after an uncaught exception): the viewer
    marks it `finished`, not `gone`; ``error`` says how its loop ended when it crashed."""

    source: Text
    seq: Count
    sent_at: Seconds
    batches_total: Count = 0
    error: LoopError | None = None


class WorkerSample(msgspec.Struct, frozen=True, tag="wsample", array_like=True):
    """Worker process -> its own main process (its unix socket, probe/inbox.py; never to
    viewers): one fetched batch. Workers write it with probe/sample_codec.py, not msgspec.

    ``generation`` counts the fetchers this worker process has made (torch makes a new one per
    epoch of persistent workers) and ``seq`` the batches of this fetcher: with the worker's pid
    they name the task, so the main process can pair ``done_ns`` with the loop's receive stamp.
    ``ended`` marks the fetch that found an iterable dataset exhausted (no timing then).
    """

    source: Text
    worker_id: Count
    pid: Pid
    fetch_ns: Count  # the whole batch: items and collate
    cpu_ns: Count
    dropped: Count = 0  # samples this worker could not send before this one
    collate_ns: Count = 0
    done_ns: Count = 0  # perf_counter_ns() when the batch was produced (CLOCK_MONOTONIC)
    generation: Count = 0
    seq: Count = 0
    ended: bool = False
    tensors: Count | None = None  # sampled now and then: tensors in the batch and their bytes
    tensor_bytes: Count | None = None


class WorkerStart(msgspec.Struct, frozen=True, tag="wstart", array_like=True):
    """Worker process -> its main process, once per worker process before its first batch:
    digests of the random states it starts with (read, never drawn from), and the file its
    faulthandler watchdog writes its stacks to."""

    source: Text
    worker_id: Count
    pid: Pid
    digests: Annotated[dict[ShortText, ShortText], Meta(max_length=64)] = {}
    stack_file: Text | None = None


Message = LoaderReport | SystemReport | Goodbye
WorkerMessage = WorkerSample | WorkerStart

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
_PREFIX_LEN = len(FRAME_PREFIX)
_sample_decoder = msgspec.msgpack.Decoder(WorkerMessage)


def encode(msg: Message) -> bytes:
    return FRAME_PREFIX + _encoder.encode(msg)


def decode(frame: bytes) -> Message:
    """Decode one frame, or raise WireError(reason) with reason in
    {"too_large", "not_loadertop", "wrong_version", "malformed"}."""
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError("too_large", f"{len(frame)} bytes")
    if frame.startswith(FRAME_PREFIX):
        # This version's frame (a viewer's every frame): the body decoded in place, not copied
        # out twice as the split below does (docs/performance.md, "The TUI watching many sources").
        try:
            return _decoder.decode(memoryview(frame)[_PREFIX_LEN:])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise WireError("malformed", str(exc)[:200]) from None
    if not frame.startswith(TOPIC):
        raise WireError("not_loadertop")
    head, sep, body = frame[len(TOPIC) :].partition(b"\0")
    if not sep:
        raise WireError("malformed", "no version separator")
    if head != str(SCHEMA_VERSION).encode():
        raise WireError("wrong_version", head[:16].decode("ascii", "replace"))
    try:
        return _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError("malformed", str(exc)[:200]) from None


def encode_sample(sample: WorkerMessage) -> bytes:
    return _encoder.encode(sample)


def decode_sample(data: bytes) -> WorkerMessage:
    try:
        return _sample_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError("malformed", str(exc)[:200]) from None


def decimate(samples: list[int], limit: int = MAX_SAMPLES) -> list[int]:
    """Keep at most `limit` samples, evenly spaced (the (i * n // limit)-th of n), so percentiles
    stay representative. In C-level loops (map over range), not a comprehension: the probe does
    this at every report at high batch rates (docs/performance.md)."""
    n = len(samples)
    if n <= limit:
        return samples
    return list(map(samples.__getitem__,
                    map(operator.floordiv, range(0, n * limit, n), repeat(limit, limit))))
