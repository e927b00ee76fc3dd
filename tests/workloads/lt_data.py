"""Datasets shared by the workloads and the in-process tests.

Kept importable by module name (no classes in ``__main__`` or in test modules) so that ``spawn``
and ``forkserver`` workers can unpickle them.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

KINDS = ("sleep", "cpu", "spin", "cheap", "hang", "exit", "raise", "store")


_BLOCK = bytes(1 << 16)


def burn_cpu(ms: float) -> None:
    """Use `ms` of this thread's CPU time (not wall time: contention-proof).

    The work is sha256 over 64 KiB blocks (~0.1 ms each), which releases the GIL like most real
    transforms (image decoding, torch ops): a pure-Python spin would hold the GIL and starve the
    worker's queue feeder thread, delaying finished batches in a way real loaders rarely do."""
    if ms <= 0:
        return
    end = time.thread_time() + ms / 1000.0
    while time.thread_time() < end:
        hashlib.sha256(_BLOCK).digest()


def spin_cpu(ms: float) -> None:
    """Use `ms` of CPU in pure Python, holding the GIL (a Python-heavy transform): the worker's
    queue feeder thread then gets the GIL only at the interpreter's switch interval."""
    end = time.thread_time() + ms / 1000.0
    n = 0
    while time.thread_time() < end:
        for _ in range(1000):
            n += 1


def _record_pid(piddir: str | None, seen: dict) -> None:
    """Write `<worker id>.<pid>` once per worker process, so a test knows the workers' pids."""
    if not piddir:
        return
    pid = os.getpid()
    if seen.get("pid") == pid:
        return
    seen["pid"] = pid
    info = get_worker_info()
    wid = info.id if info is not None else "main"
    path = os.path.join(piddir, f"{wid}.{pid}")
    with open(path + ".tmp", "w") as fh:
        fh.write(str(pid))
    os.replace(path + ".tmp", path)


class _FetchClock:
    """What the dataset itself measures in a worker: cumulative wall and CPU time spent in
    __getitem__, appended as one JSON line to `<dir>/t<worker id>.<pid>.jsonl` at most every 50 ms —
    the ground truth a test compares loadertop's fetch figures with (e.g. cpu_fraction on a busy
    machine). A history, not only the latest value, so that a test can take the truth over the very
    seconds a document covers: on a shared 2-core machine the CPU a worker gets changes from one
    second to the next, and two intervals a second apart can differ by 0.2."""

    def __init__(self) -> None:
        self.pid = -1

    def add(self, directory: str, wall_ns: int, cpu_ns: int) -> None:
        pid = os.getpid()
        if self.pid != pid:
            self.pid, self.wall, self.cpu, self.n, self.written = pid, 0, 0, 0, 0.0
            info = get_worker_info()
            self.path = os.path.join(directory, f"t{info.id if info else 'main'}.{pid}.jsonl")
        self.wall += wall_ns
        self.cpu += cpu_ns
        self.n += 1
        now = time.monotonic()
        if now - self.written >= 0.05:
            self.written = now
            # One short write in append mode: a reader sees whole lines, or a torn last one it skips.
            with open(self.path, "a") as fh:
                fh.write(f'{{"wall_ns": {self.wall}, "cpu_ns": {self.cpu}, "n": {self.n}, '
                         f'"t": {time.time()}}}\n')


def hang_forever() -> None:
    """Where a `hang` dataset blocks (the tests look for this function in the stack)."""
    while True:
        time.sleep(3600)


def seed_worker_rng(worker_id: int) -> None:
    """The fix for duplicate_rng: each worker's generator from its own torch seed."""
    import numpy as np

    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


class WorkloadDataset(Dataset):
    """Map-style; per sample: sleep (I/O-like), burn CPU, nothing, or misbehave at `bad_index`.

    kind: sleep | cpu | cheap (per-sample cost `ms`), hang (sleep forever from `bad_index` on),
    exit (``os._exit(exit_code)`` in the worker that fetches `bad_index`), raise (ValueError from
    `bad_index` on), store (a storage that serves `store_slots` reads at once: each item holds one
    slot of a semaphore shared by every worker for `ms` — samples/s rises with the workers up to
    `store_slots` of them and stays flat after).
    """

    def __init__(self, kind: str = "cheap", ms: float = 0.0, length: int = 10**7,
                 bad_index: int | None = None, exit_code: int = 3, piddir: str | None = None,
                 payload: int = 1, slow_worker_ms: float = 0.0, rng: str = "none",
                 store_slots: int = 2) -> None:
        assert kind in KINDS, kind
        self.store = None
        if kind == "store":
            import multiprocessing

            # made in the main process before the workers start: fork inherits it, spawn and
            # forkserver receive it pickled with the dataset while the worker is being started
            self.store = multiprocessing.Semaphore(store_slots)
        assert rng in ("none", "init", "per-worker"), rng
        self.kind, self.ms, self.length = kind, ms, length
        self.bad_index, self.exit_code, self.piddir = bad_index, exit_code, piddir
        self.payload = payload
        self.slow_worker_ms = slow_worker_ms  # worker 0 sleeps this much more per item
        # "init": a generator made here, copied into every worker with the same state (the
        # duplicate_rng pitfall); "per-worker": `seed_worker_rng` (worker_init_fn) replaces it.
        self.rng = None
        if rng != "none":
            import numpy as np

            self.rng = np.random.default_rng(0)
        self._seen: dict = {}
        self._clock = _FetchClock()

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        w0, c0 = time.perf_counter_ns(), time.process_time_ns()
        item = self._getitem(i)
        if self.piddir:
            self._clock.add(self.piddir, time.perf_counter_ns() - w0, time.process_time_ns() - c0)
        return item

    def _getitem(self, i: int):
        _record_pid(self.piddir, self._seen)
        bad = self.bad_index is not None and i >= self.bad_index
        if self.kind == "sleep" or (self.kind in ("hang", "exit", "raise") and self.ms > 0):
            time.sleep(self.ms / 1000.0)
        elif self.store is not None:
            with self.store:
                time.sleep(self.ms / 1000.0)
        elif self.kind == "cpu":
            burn_cpu(self.ms)
        elif self.kind == "spin":
            spin_cpu(self.ms)
        if bad and self.kind == "hang":
            hang_forever()
        if self.kind == "exit" and i == self.bad_index:  # only the worker that fetches this one
            # let the loop receive this worker's previous batch first: exiting while the main
            # process still fetches its tensor's fd from us makes torch raise ConnectionResetError
            # instead of its "worker exited unexpectedly" RuntimeError
            time.sleep(0.5)
            os._exit(self.exit_code)
        if bad and self.kind == "raise":
            raise ValueError(f"bad sample {i}")
        if self.slow_worker_ms:
            info = get_worker_info()
            if info is not None and info.id == 0:
                time.sleep(self.slow_worker_ms / 1000.0)
        if self.rng is not None:  # an "augmentation": the item and one draw
            return torch.tensor([i, int(self.rng.integers(1 << 30))])
        if self.payload == 1:
            return torch.tensor([i])
        return torch.full((self.payload,), i, dtype=torch.int64)


class SquareDataset(Dataset):
    """Deterministic map-style data; `tag` is returned so a worker_init_fn effect is visible."""

    def __init__(self, n: int = 37, fail_at: int | None = None, exc_type: type = ValueError) -> None:
        self.n, self.fail_at, self.exc_type = n, fail_at, exc_type
        self.tag = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.fail_at is not None and i == self.fail_at:
            raise self.exc_type(f"sample {i} is broken")
        return {"x": torch.tensor([i, i * i], dtype=torch.float32), "y": i % 3, "tag": self.tag}


class RangeIterable(IterableDataset):
    """Iterable data split across workers by worker id (so the batches are deterministic)."""

    def __init__(self, n: int = 41, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            if self.fail_at is not None and i == self.fail_at:
                raise KeyError(f"sample {i} is missing")
            yield torch.tensor([i, -i])


def set_tag(worker_id: int) -> None:
    """A user worker_init_fn with a visible effect: every sample this worker returns is tagged."""
    info = get_worker_info()
    info.dataset.tag = 100 + worker_id


def pair_collate(batch):
    """A custom collate_fn: (stacked x, list of y, sum of tags)."""
    xs = torch.stack([b["x"] for b in batch])
    return xs, [b["y"] for b in batch], sum(b["tag"] for b in batch)


class SleepCollate:
    """`default_collate` after sleeping `ms`: a collate_fn with a known cost (picklable)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, items):
        from torch.utils.data import default_collate

        time.sleep(self.ms / 1000.0)
        return default_collate(items)


def list_collate(items):
    """No stacking: a batch is a list of the items' own small tensors (each crosses processes on
    its own: the classic many-small-tensors handoff)."""
    return list(items)


class CountingCollate:
    """`default_collate` that appends one line per call to `<directory>/collate.<pid>`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, items):
        from torch.utils.data import default_collate

        with open(os.path.join(self.directory, f"collate.{os.getpid()}"), "a") as fh:
            fh.write("1\n")
        return default_collate(items)


class CountingInit:
    """A worker_init_fn that appends one line per call to `<directory>/init.<pid>`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, worker_id: int) -> None:
        with open(os.path.join(self.directory, f"init.{os.getpid()}"), "a") as fh:
            fh.write(f"{worker_id}\n")
