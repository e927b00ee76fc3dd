"""Findings from the probe's slow readings: memory trends, file descriptors, threads, /dev/shm.

Pure: figures in, findings out (no I/O, no torch, no psutil). The readings come every few seconds
(`probe.resources`); the memory trends are `viewer.resources`' (least squares over the samples
after a process's warm-up). A figure that is not known is no evidence: its rule does not fire.

One finding per kind and source: its `worker` is set when exactly one worker is concerned (and
not the main process), and the summary names every process concerned.
"""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    MemoryTrend,
    ProcessFigures,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.client.units import say_bytes, say_fraction
from loadertop.findings._common import finding

_MIB: Final = 1024 * 1024

# --- memory trends (copy_on_read, memory_growth)
#: A trend counts from this many readings past the warm-up (20 s at the probe's 5 s).
TREND_MIN_SAMPLES: Final = 4
#: "Steadily": at least this share of consecutive readings rose.
RISING_SHARE_MIN: Final = 0.6
#: copy_on_read: a worker's USS grew at least this much over its trend (the fitted line) ...
COW_MIN_GROWTH_BYTES: Final = 32 * _MIB
#: ... while its RSS grew by at most this share of that (RSS "looks flat": the pages were
#: already resident, shared with the main process; each one read is now a private copy).
COW_RSS_SHARE_MAX: Final = 0.25
#: memory_growth: RSS rising over at least this long ("over minutes") ...
GROWTH_MIN_S: Final = 120.0
#: ... by at least this much (the fitted line) ...
GROWTH_MIN_BYTES: Final = 64 * _MIB
#: ... and at least this share of what the process held when the trend began.
GROWTH_MIN_SHARE: Final = 0.1

# --- fd_low
#: Open file descriptors at this share of the soft RLIMIT_NOFILE.
FD_USED_SHARE: Final = 0.8

# --- threads_oversubscribed
#: The threads a worker has of its own, measured with torch 2.13, the same with loadertop and
#: without (it starts none in a worker: probe/worker.py): 3 in a fork worker once it has handed
#: over batches, 4 in a spawn worker. The threads beyond these are a pool.
WORKER_OWN_THREADS: Final = 4
#: A pool: at least this many threads beyond a worker's own (OpenMP, MKL, OpenCV, a thread pool).
POOL_MIN_THREADS: Final = 2
#: The workers' computing threads (one each, plus their pools) at this many per core available.
THREADS_PER_CORE_MAX: Final = 2.0

# --- shm_low
#: /dev/shm free below this share of its size ...
SHM_FREE_MIN_SHARE: Final = 0.1
#: ... or below this much (a batch of 64 RGB 224x224 images as float32 is 37 MiB).
SHM_FREE_MIN_BYTES: Final = 32 * _MIB

#: Readings older than this are not judged (the probe stopped sending them: no viewer, or ended).
READINGS_STALE_S: Final = 30.0

_LIVE_STATES: Final = ("running", "waiting", "stalled", "idle")


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    """copy_on_read, memory_growth, fd_low, threads_oversubscribed of one source."""
    if source.state not in _LIVE_STATES:
        return []
    process = source.process
    if process.age_s is None or process.age_s > READINGS_STALE_S:
        return []
    workers = [w for w in source.workers if w.alive is not False and w.pid is not None]
    out: list[Finding] = []
    for found in (copy_on_read(source, workers), memory_growth(source, process, workers),
                  fd_low(source, process, workers),
                  threads_oversubscribed(source, workers, system)):
        if found is not None:
            out.append(found)
    return out


def machine(system: SystemFigures) -> list[Finding]:
    """shm_low: the machine's own."""
    found = shm_low(system)
    return [found] if found is not None else []


# ---------------------------------------------------------------------------------------------
# the rules
# ---------------------------------------------------------------------------------------------

def fitted_growth(trend: MemoryTrend) -> float:
    """How much the least-squares line rose over the trend (robust to one odd reading)."""
    return trend.slope_bytes_per_s * trend.over_s


def _steady(trend: MemoryTrend | None) -> bool:
    return (trend is not None and trend.samples >= TREND_MIN_SAMPLES
            and trend.rising_share >= RISING_SHARE_MIN and trend.slope_bytes_per_s > 0)


def copies_on_read(w: WorkerFigures) -> bool:
    """USS grows steadily by COW_MIN_GROWTH_BYTES while RSS grows by at most COW_RSS_SHARE_MAX
    of that."""
    uss, rss = w.uss_trend, w.rss_trend
    if not _steady(uss) or rss is None or rss.samples < TREND_MIN_SAMPLES:
        return False
    assert uss is not None
    grown = fitted_growth(uss)
    return grown >= COW_MIN_GROWTH_BYTES and fitted_growth(rss) <= COW_RSS_SHARE_MAX * grown


def _trend_words(trend: MemoryTrend) -> str:
    return (f"{say_bytes(trend.first_bytes)} → {say_bytes(trend.last_bytes)} over "
            f"{trend.over_s:.0f} s ({_rate(trend.slope_bytes_per_s)}, "
            f"rising in {say_fraction(trend.rising_share)} of {trend.samples} readings)")


def _rate(bytes_per_s: float) -> str:
    sign = "-" if bytes_per_s < 0 else "+"
    per_min = abs(bytes_per_s) * 60
    return f"{sign}{say_bytes(per_min)}/min"


def _names(ids: list[int]) -> str:
    return ("worker " if len(ids) == 1 else "workers ") + ", ".join(str(i) for i in ids)


def _one(ids: list[int]) -> int | None:
    return ids[0] if len(ids) == 1 else None


def copy_on_read(source: SourceFigures, workers: list[WorkerFigures]) -> Finding | None:
    hit = [w for w in workers if copies_on_read(w)]
    if not hit:
        return None
    ids = [w.id for w in hit]
    evidence = []
    for w in hit:
        assert w.uss_trend is not None and w.rss_trend is not None
        evidence.append(f"worker {w.id} USS {_trend_words(w.uss_trend)}; RSS "
                        f"{_rate(w.rss_trend.slope_bytes_per_s)} (threshold: USS +"
                        f"{say_bytes(COW_MIN_GROWTH_BYTES)}, RSS at most "
                        f"{say_fraction(COW_RSS_SHARE_MAX)} of that)")
    private = sum(w.uss_bytes or 0 for w in hit)
    if private:
        evidence.append(f"private memory of these workers now {say_bytes(private)} "
                        f"(each may end up with a whole copy of what it reads)")
    summary = (f"{_names(ids)}: private memory (USS) grows steadily while RSS stays flat — "
               "reading Python objects copies them into every worker (copy-on-read)")
    advice = [
        f"keep {source.config.dataset}'s data in numpy arrays, torch tensors or Arrow columns "
        "instead of lists or dicts of Python objects: reading a Python object writes its "
        "reference count, which copies its memory page into the worker (pytorch#13246)",
        "a list of strings (file paths, captions): one numpy array (np.array(paths, "
        "dtype=np.bytes_)) or one bytes buffer with an offsets array",
        "or load the data inside each worker (in worker_init_fn, or lazily on first use) "
        "rather than in the main process before the workers fork",
    ]
    return finding("copy_on_read", "warning", source.id, _one(ids), summary, evidence, advice)


def grows(trend: MemoryTrend | None) -> bool:
    """RSS rising steadily over GROWTH_MIN_S by GROWTH_MIN_BYTES and GROWTH_MIN_SHARE."""
    if not _steady(trend) or trend is None or trend.over_s < GROWTH_MIN_S:
        return False
    grown = fitted_growth(trend)
    return grown >= GROWTH_MIN_BYTES and grown >= GROWTH_MIN_SHARE * trend.first_bytes


def memory_growth(source: SourceFigures, process: ProcessFigures,
                  workers: list[WorkerFigures]) -> Finding | None:
    main = grows(process.rss_trend)
    hit = [w for w in workers if grows(w.rss_trend)]
    if not main and not hit:
        return None
    ids = [w.id for w in hit]
    threshold = (f"(threshold: steadily over {GROWTH_MIN_S:.0f} s, +{say_bytes(GROWTH_MIN_BYTES)}"
                 f" and +{say_fraction(GROWTH_MIN_SHARE)})")
    evidence = []
    who = []
    if main:
        assert process.rss_trend is not None
        who.append("the training process")
        evidence.append(f"training process RSS {_trend_words(process.rss_trend)} {threshold}")
    for w in hit:
        assert w.rss_trend is not None
        evidence.append(f"worker {w.id} RSS {_trend_words(w.rss_trend)} {threshold}")
    if hit:
        who.append(_names(ids))
    summary = f"memory of {' and '.join(who)} grows steadily (it will run out if it goes on)"
    advice = ["find what accumulates (seed §5.1): tracemalloc snapshots a minute apart, or "
              "memray, show which line's allocations grow"]
    if main:
        advice.append("in the training loop: keep no per-step tensors in Python lists (losses, "
                      "outputs, metrics): store loss.item() or tensor.detach().cpu(), not the "
                      "tensor with its autograd graph")
    if hit:
        advice.append("in the dataset: bound any cache it fills (functools.lru_cache(maxsize=…) "
                      "or a fixed-size dict); close files it opens per item")
    advice.append("memory that levels off after the first epoch is a cache filling, not a leak")
    worker = _one(ids) if not main else None
    return finding("memory_growth", "warning", source.id, worker, summary, evidence, advice)


def fd_low(source: SourceFigures, process: ProcessFigures,
           workers: list[WorkerFigures]) -> Finding | None:
    limit = process.fd_limit
    if not limit:
        return None
    threshold = FD_USED_SHARE * limit
    main = process.fds is not None and process.fds >= threshold
    hit = [w for w in workers if w.fds is not None and w.fds >= threshold]
    if not main and not hit:
        return None
    evidence = []
    who = []
    if main:
        who.append("the training process")
        evidence.append(f"training process: fds {process.fds} of limit {limit} "
                        f"(threshold {say_fraction(FD_USED_SHARE)})")
    for w in hit:
        evidence.append(f"worker {w.id}: fds {w.fds} of limit {limit}, the training process's "
                        f"(threshold {say_fraction(FD_USED_SHARE)})")
    ids = [w.id for w in hit]
    if hit:
        who.append(_names(ids))
    summary = (f"{' and '.join(who)} {'is' if len(who) == 1 and len(ids) <= 1 else 'are'} "
               "close to the open-file limit (\"received 0 items of ancdata\", "
               "\"Too many open files\")")
    advice = [
        "torch.multiprocessing.set_sharing_strategy('file_system') at the top of the training "
        "script (module level, so that spawn and forkserver workers run it too: each process has "
        "its own setting): a tensor then crosses to the main process by a file name, not a file "
        "descriptor",
        f"or raise the limit (now {limit}): ulimit -n 65536 before starting, or "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)) at the start",
    ]
    if source.config.num_workers:
        advice.append("fewer tensors in flight: collate a batch into a few large tensors, or a "
                      "smaller prefetch_factor")
    worker = _one(ids) if not main else None
    return finding("fd_low", "warning", source.id, worker, summary, evidence, advice)


def pool_threads(w: WorkerFigures) -> int:
    """A worker's threads beyond its own (0 when unknown)."""
    return max(0, w.threads - WORKER_OWN_THREADS) if w.threads is not None else 0


def threads_oversubscribed(source: SourceFigures, workers: list[WorkerFigures],
                           system: SystemFigures | None) -> Finding | None:
    cores = system.cores_available if system is not None else None
    counted = [w for w in workers if w.threads is not None]
    if not cores or not counted:
        return None
    pooled = [w for w in counted if pool_threads(w) >= POOL_MIN_THREADS]
    computing = sum(1 + pool_threads(w) for w in counted)
    if not pooled or computing < THREADS_PER_CORE_MAX * cores:
        return None
    threads = sorted({w.threads for w in counted if w.threads is not None})
    each = (f"{threads[0]}" if len(threads) == 1 else f"{threads[0]}–{threads[-1]}")
    cores_text = f"{cores:g} core" + ("" if cores == 1 else "s")
    summary = (f"{len(counted)} workers run {each} threads each: {computing} computing threads "
               f"on {cores_text} (OpenMP/MKL/OpenCV pools multiplied by the workers)")
    evidence = [
        f"{len(counted)} workers × {each} threads, {WORKER_OWN_THREADS} of them a worker's own: "
        f"{computing} computing threads on {cores_text} (threshold "
        f"{THREADS_PER_CORE_MAX:g} per core, a pool from {POOL_MIN_THREADS} threads)",
    ]
    busy = [w.cpu_percent for w in counted if w.cpu_percent is not None]
    if busy:
        evidence.append(f"workers' CPU {sum(busy):.0f} % of one core together")
    advice = [
        "one thread per worker: in worker_init_fn call cv2.setNumThreads(0) (OpenCV) and "
        "torch.set_num_threads(1), or set OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "
        "OPENBLAS_NUM_THREADS=1 in the environment before the workers start",
        "the workers already run in parallel: a pool inside each one only time-slices the cores",
    ]
    return finding("threads_oversubscribed", "warning", source.id, None, summary, evidence,
                   advice)


def shm_low(system: SystemFigures) -> Finding | None:
    shm = system.shm
    if shm is None or shm.total_bytes <= 0:
        return None
    free = min(shm.free_bytes, shm.total_bytes)
    share = free / shm.total_bytes
    if share >= SHM_FREE_MIN_SHARE and free >= SHM_FREE_MIN_BYTES:
        return None
    summary = (f"{shm.path} is nearly full: {say_bytes(free)} free of "
               f"{say_bytes(shm.total_bytes)} (workers hand batches over through it; full, "
               "they die of SIGBUS)")
    evidence = [f"{shm.path}: {say_bytes(free)} free of {say_bytes(shm.total_bytes)}, "
                f"{say_fraction(share)} (threshold: {say_fraction(SHM_FREE_MIN_SHARE)} or "
                f"{say_bytes(SHM_FREE_MIN_BYTES)})"]
    advice = [
        "in Docker, a bigger --shm-size (the default is 64 MiB), e.g. docker run --shm-size=8g "
        "(or --ipc=host); in Kubernetes an emptyDir with medium: Memory mounted at /dev/shm",
        "fewer workers or a smaller prefetch_factor: every batch in flight lives there",
        f"files left in {shm.path} by killed jobs (torch_* with the file_system sharing "
        "strategy) hold space until removed",
    ]
    return finding("shm_low", "warning", None, None, summary, evidence, advice)
