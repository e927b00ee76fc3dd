"""Defensive readers of torch DataLoader iterator internals, called only off the hot path.

These are private torch attributes of `_MultiProcessingDataLoaderIter` (`dataloader.py`):
`_num_workers`, `_prefetch_factor`, `_tasks_outstanding`, `_data_queue`, `_worker_result_queue`,
`_task_info`, `_pin_memory`, `_shutdown`, `_workers`. Checked on torch 2.13.0, the version this
project tests with; older 2.x releases are expected but not verified here. Every reader returns
None rather than raising when a torch version lacks an attribute, so a torch change degrades a
figure to `null` instead of crashing training.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QueueDepth:
    ready: int
    in_flight: int
    capacity: int


def _qsize(queue: Any) -> int | None:
    try:
        return int(queue.qsize())
    except (NotImplementedError, AttributeError, OSError, ValueError):
        # mp.Queue.qsize() raises NotImplementedError on macOS (no sem_getvalue).
        return None


def read_queue(it: Any) -> QueueDepth | None:
    """Batches ready / in flight / capacity of a live multiprocessing iterator (cheap: a few
    attribute reads and two qsize calls).

    `_tasks_outstanding` counts indices sent to workers and not yet taken off the data queue;
    batches already taken but arriving out of order sit in `_task_info` as `(wid, data)` entries,
    so `len(_task_info) - _tasks_outstanding` counts those without scanning the dict (a scan from
    this thread could also race the training thread's mutations).
    """
    try:
        if getattr(it, "_shutdown", False):
            return None
        capacity = int(it._num_workers) * int(it._prefetch_factor)
        outstanding = int(it._tasks_outstanding)
        queued = _qsize(it._data_queue)
        if queued is None:
            return None
        if getattr(it, "_pin_memory", False):
            # With pin_memory the workers' results wait in `_worker_result_queue` for the pin
            # thread, which moves them to `_data_queue`: both hold fetched batches.
            raw = _qsize(it._worker_result_queue)
            if raw is None:
                return None
            queued += raw
        out_of_order = max(0, len(it._task_info) - outstanding)
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    ready = queued + out_of_order
    in_flight = max(0, outstanding - queued)
    return QueueDepth(ready=ready, in_flight=in_flight, capacity=capacity)


def outstanding_by_worker(it: Any) -> dict[int, int] | None:
    """Worker id -> tasks sent to it whose batch the loop has not taken yet (None: unreadable).

    torch 2.13 `_try_put_index` sets `_task_info[idx] = (worker_id,)` when it sends task idx, and
    `_get_data`'s caller extends it to `(worker_id, data)` when an out-of-order batch arrives and
    deletes it when the loop takes it. `list(dict.items())` runs in C under the GIL: one
    consistent copy, however the training thread mutates the dict meanwhile.
    """
    try:
        if getattr(it, "_shutdown", False):
            return None
        items = list(it._task_info.items())
    except (AttributeError, TypeError, RuntimeError):
        return None
    out: dict[int, int] = {}
    for _, info in items:
        if isinstance(info, tuple) and len(info) == 1:
            out[info[0]] = out.get(info[0], 0) + 1
    return out


def worker_pids(it: Any) -> list[tuple[int, int | None, object]]:
    """(worker id, pid, process object) for the iterator's workers; [] for num_workers=0."""
    try:
        return worker_pids_in(getattr(it, "_workers", None))
    except Exception:
        return []


def worker_pids_in(workers: Any) -> list[tuple[int, int | None, object]]:
    """(worker id, pid, process object) for a list of an iterator's workers (its `_workers`)."""
    out = []
    try:
        workers = list(workers or ())
    except Exception:
        return []
    for wid, proc in enumerate(workers):
        try:
            pid = proc.pid
        except (ValueError, AttributeError):  # a closed Process raises ValueError
            pid = None
        out.append((wid, pid, proc))
    return out


def worker_state(pid: int | None, proc: Any) -> tuple[bool | None, int | None]:
    """(alive, exitcode) of a worker *without reaping it*.

    Never `proc.is_alive()` / `proc.exitcode` here: both call waitpid, and a monitor that reaps a
    dead worker before torch's SIGCHLD check sees it loses torch's own error message and leaves
    torch 2.13 to notice the death at its next 5 s check (docs/performance.md). `waitid(...,
    WNOWAIT)` peeks instead.
    Exit codes follow multiprocessing: negative = killed by that signal.
    """
    if pid is None:
        return None, None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        # Already reaped (by torch's join at shutdown): the Popen recorded the code.
        code = getattr(getattr(proc, "_popen", None), "returncode", None)
        return False, code
    except (OSError, AttributeError):
        info = None
        # Not a child we can peek at (no waitid): psutil, if a viewer had it loaded (on this, the
        # publisher's thread, an import could deadlock a worker forked meanwhile).
        psutil = sys.modules.get("psutil")
        if psutil is None:
            return None, None
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            return False, None
        except psutil.Error:
            return None, None
        return status != psutil.STATUS_ZOMBIE, None
    if info is None:
        return True, None
    if info.si_code == os.CLD_EXITED:
        return False, info.si_status
    return False, -info.si_status  # CLD_KILLED / CLD_DUMPED: killed by signal si_status


def worker_context(loader: Any) -> str | None:
    """How the loader's workers start ("fork", "spawn", "forkserver"); None for num_workers=0
    or where it cannot be read. torch 2.13 starts them with `multiprocessing_context`, or
    torch.multiprocessing's default context when that is None."""
    if not int(getattr(loader, "num_workers", 0) or 0):
        return None
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is None:
        try:
            import torch.multiprocessing as mp

            return mp.get_start_method(allow_none=False)
        except Exception:
            return None
    return ctx.get_start_method() if hasattr(ctx, "get_start_method") else str(ctx)


def settings_key(loader: Any) -> tuple[Any, ...] | None:
    """What `loader_config` reads, in a form cheap to compare: the settings a DataLoader lets
    change once made (num_workers, prefetch_factor, pin_memory, multiprocessing_context; torch
    2.13 refuses to set batch_size, drop_last, persistent_workers... after __init__, a
    loader-like may not), the loader's class and the dataset's."""
    try:
        return (getattr(loader, "num_workers", None), getattr(loader, "prefetch_factor", None),
                getattr(loader, "pin_memory", None),
                getattr(loader, "multiprocessing_context", None),
                getattr(loader, "batch_size", None), getattr(loader, "drop_last", None),
                getattr(loader, "persistent_workers", None), type(loader),
                type(getattr(loader, "dataset", None)))
    except Exception:
        return None


def batch_size(loader: Any) -> int | None:
    """Samples per batch: the loader's `batch_size`, else its batch sampler's. A DataLoader made
    with `batch_sampler=` has `batch_size` None (torch 2.13): Hugging Face's Trainer gets its
    loaders from accelerate 1.x, which makes them so, around a `BatchSamplerShard` that keeps the
    wrapped sampler's `batch_size` and, with `split_batches`, yields `batch_size //
    num_processes` of it; a sampler wrapping another (accelerate's `SkipBatchSampler` when
    resuming) is looked through. None when no sampler says (a batch size that varies)."""
    size = getattr(loader, "batch_size", None)
    if isinstance(size, int):
        return size
    sampler = getattr(loader, "batch_sampler", None)
    for _ in range(4):
        if sampler is None:
            return None
        size = getattr(sampler, "batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            processes = getattr(sampler, "num_processes", 1)
            if getattr(sampler, "split_batches", False) is True and isinstance(processes, int) \
                    and processes > 1:
                return max(1, size // processes)
            return size
        sampler = getattr(sampler, "batch_sampler", None)
    return None


def loader_config(loader: Any) -> dict[str, Any]:
    """The loader's settings as reported on the wire (best effort for loader-likes)."""
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    dataset = getattr(loader, "dataset", None)
    context = worker_context(loader)
    iterable = False
    try:
        from torch.utils.data import IterableDataset

        iterable = isinstance(dataset, IterableDataset)
    except Exception:
        pass
    prefetch = getattr(loader, "prefetch_factor", None)
    return {
        "num_workers": num_workers,
        "batch_size": batch_size(loader),
        "prefetch_factor": (prefetch if prefetch is not None else 2) if num_workers else None,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "dataset": type(dataset).__name__ if dataset is not None else type(loader).__name__,
        "worker_context": context,
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "iterable": iterable,
    }


# torch 2.13's messages for a worker that died: `_error_if_any_worker_fails` (C,
# torch/csrc/DataLoader.cpp) raises "DataLoader worker (pid N) is killed by signal: …" or
# "… (pid N) exited unexpectedly with exit code …", and `_try_get_data` raises "DataLoader worker
# (pid(s) N, M) exited unexpectedly".
_WORKER_FAILURE = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([0-9][0-9, ]*)\)")


def uncaught_worker_failure() -> tuple[BaseException, set[int]] | None:
    """At exit: the exception the program is dying of, when it is torch's report of a DataLoader
    worker's death, and the pids it names; else None.

    torch raises that error from its SIGCHLD handler, in the main thread, wherever that thread is
    when the signal arrives: in a real job mostly the training step, not `next()`, so the
    iterator's wrapper never sees it. CPython (3.11) sets `sys.last_value` (3.12: also
    `sys.last_exc`) as it prints an uncaught exception, before the atexit handlers run."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(exc, RuntimeError):
        return None
    try:
        match = _WORKER_FAILURE.search(str(exc))
    except Exception:
        return None
    if match is None:
        return None
    pids = {int(p) for p in re.findall(r"[0-9]+", match.group(1))}
    return exc, pids
