"""threads_oversubscribed: the workers' thread pools (OpenMP, MKL, OpenCV) multiplied by the
workers, far more computing threads than cores."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.findings._common import finding, resource_workers

KIND: Final = "threads_oversubscribed"

#: The threads a worker has of its own, measured with torch 2.13, the same with loadertop and
#: without (it starts none in a worker: probe/worker.py): 3 in a fork worker once it has handed
#: over batches, 4 in a spawn worker. The threads beyond these are a pool.
WORKER_OWN_THREADS: Final = 4
#: A pool: at least this many threads beyond a worker's own (OpenMP, MKL, OpenCV, a thread pool).
POOL_MIN_THREADS: Final = 2
#: The workers' computing threads (one each, plus their pools) at this many per core available.
THREADS_PER_CORE_MAX: Final = 2.0


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    workers = resource_workers(source)
    found = _threads_oversubscribed(source, workers, system) if workers is not None else None
    return [found] if found is not None else []


def pool_threads(w: WorkerFigures) -> int:
    """A worker's threads beyond its own (0 when unknown)."""
    return max(0, w.threads - WORKER_OWN_THREADS) if w.threads is not None else 0


def _threads_oversubscribed(source: SourceFigures, workers: list[WorkerFigures],
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
