"""worker_hung: a worker inside one batch far longer than its recent batches took."""

from __future__ import annotations

from typing import Final

from loadertop import diagnosis
from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
    WorkerFigures,
)
from loadertop.client.units import say_ms
from loadertop.findings._common import LIVE_STATES, finding, where_in

KIND: Final = "worker_hung"

# A worker inside one batch this long, and this many times its own recent p99 per batch; a worker
# with no batch in the window (it is stuck, after all) is judged by the floor when the loader
# delivered batches before, else by the no-history figure (a slow first batch is normal: workers
# open files, fill caches). The same figures as the loop's stall.
WORKER_HUNG_MIN_MS: Final = diagnosis.STALL_MIN_MS
WORKER_HUNG_FACTOR: Final = diagnosis.STALL_FACTOR
WORKER_HUNG_NO_HISTORY_MS: Final = diagnosis.STALL_NO_HISTORY_MS


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _worker_hung(source) if source.state in LIVE_STATES else []


def worker_hung_threshold_ms(worker: WorkerFigures, batches_total: int) -> float:
    per_batch = None
    if worker.fetch_ms is not None:
        per_batch = worker.fetch_ms.p99 + (worker.collate_ms.p99 if worker.collate_ms else 0.0)
    if per_batch is None:
        return WORKER_HUNG_MIN_MS if batches_total > 0 else WORKER_HUNG_NO_HISTORY_MS
    return max(WORKER_HUNG_MIN_MS, WORKER_HUNG_FACTOR * per_batch)


def _worker_hung(source: SourceFigures) -> list[Finding]:
    out = []
    for w in source.workers:
        if w.busy_ms is None or w.alive is False:
            continue
        threshold = worker_hung_threshold_ms(w, source.batches_total)
        if w.busy_ms < threshold:
            continue
        where = where_in(w.stack)
        summary = f"worker {w.id} has been inside one batch for {say_ms(w.busy_ms)}"
        summary += f", at {where}" if where else ""
        evidence = [f"inside one batch for {say_ms(w.busy_ms)} (threshold {say_ms(threshold)})"]
        if w.fetch_ms is not None:
            evidence.append(f"its recent batches took {say_ms(w.fetch_ms.p50)} (p50)")
        if w.stack is None:
            evidence.append("no stack: the worker's watchdog file could not be read")
        advice = ["the stack shows where it is: a lock, a network read or a C call that never "
                  "returns; pass timeout=SECONDS to the DataLoader to turn a hang into an error"]
        if (source.config.worker_context or "fork") == "fork":
            advice.append("a deadlock right after fork (OpenMP/OpenCV threads, a lock held while "
                          "forking, pytorch#1355): try multiprocessing_context='spawn'")
        if w.pid is not None:
            advice.append(f"a live view of it: py-spy dump --pid {w.pid}")
        out.append(finding("worker_hung", "critical", source.id, w.id, summary, evidence, advice,
                           w.stack))
    return out
