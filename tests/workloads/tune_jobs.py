"""Training jobs for `loadertop tune`'s tests and benchmark (CPU only, no code of loadertop's).

    python tests/workloads/tune_jobs.py knee --slots 3 --read-ms 10 [--workers 0]
    python tests/workloads/tune_jobs.py knee --fail-from 3          # fails with >= 3 workers
    python tests/workloads/tune_jobs.py knee --stall-from 3         # hangs with >= 3 workers
    python tests/workloads/tune_jobs.py duplicates --items 64       # a non-worker-aware iterable
    python tests/workloads/tune_jobs.py loaders --out FILE          # every loader kind, reported
    python tests/workloads/tune_jobs.py no-loader [--sleep]         # imports torch, no DataLoader

`knee`: a map-style dataset whose every read passes a `multiprocessing` semaphore of `--slots`
slots shared by the main process and the (fork) workers, and holds it `--read-ms` — storage that
serves K reads at a time. Samples/s rise with the workers up to K and stay flat after, and the
reads sleep (they cost no CPU), so the knee is at K on any machine with a core to spare for the
loop. It trains until killed (or `--seconds`).

`--piddir DIR`: the main process writes `main.<pid>`, each worker `worker.<pid>` (the tests check
that no process of a trial outlives it); with `--stall-from N` and N workers or more, the main
process builds its loader, writes `stalled.<pid>` and hangs before its first batch until killed
(a trial that provably runs: it cannot end by itself).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info


def _note_pid(piddir: str | None, kind: str) -> None:
    if piddir:
        with open(os.path.join(piddir, f"{kind}.{os.getpid()}"), "w") as fh:
            fh.write(str(os.getpid()))


class SlottedReads(Dataset):
    """Reads through a semaphore of `slots` slots, each holding it `read_ms`."""

    def __init__(self, slots: int, read_ms: float, piddir: str | None = None,
                 length: int = 10**7) -> None:
        self.slots = multiprocessing.get_context("fork").BoundedSemaphore(slots)
        self.read_s = read_ms / 1000.0
        self.piddir = piddir
        self.length = length
        self._noted = -1

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        if self.piddir and self._noted != os.getpid() and get_worker_info() is not None:
            self._noted = os.getpid()
            _note_pid(self.piddir, "worker")
        with self.slots:
            time.sleep(self.read_s)
        return torch.tensor([i])


class WholeRange(IterableDataset):
    """An IterableDataset that ignores get_worker_info(): every worker yields all of it."""

    def __init__(self, items: int) -> None:
        self.items = items

    def __iter__(self):
        for i in range(self.items):
            time.sleep(0.001)
            yield torch.tensor([i])


class SplitRange(IterableDataset):
    """An IterableDataset split by worker id (the right way)."""

    def __init__(self, items: int) -> None:
        self.items = items

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(torch.tensor([i]) for i in range(start, self.items, step))


class NamedLoader(DataLoader):
    """A subclass with its own __init__ (as Lightning's and HF's loaders have)."""

    def __init__(self, dataset, **kwargs) -> None:
        self.label = "named"
        super().__init__(dataset, **kwargs)


def knee(args) -> int:
    _note_pid(args.piddir, "main")
    torch.set_num_threads(1)
    data = SlottedReads(args.slots, args.read_ms, args.piddir)
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers)
    if args.stall_from and loader.num_workers >= args.stall_from:
        _note_pid(args.piddir, "stalled")
        while True:  # until a signal ends it
            signal.pause()
    end = time.monotonic() + args.seconds if args.seconds else None
    n = 0
    for _batch in loader:
        n += 1
        if args.fail_from and loader.num_workers >= args.fail_from and n >= 5:
            raise RuntimeError(f"simulated failure with {loader.num_workers} workers "
                               f"(think: out of shared memory)")
        time.sleep(args.step_ms / 1000.0)
        if end is not None and time.monotonic() >= end:
            break
    return 0


def duplicates(args) -> int:
    torch.set_num_threads(1)
    loader = DataLoader(WholeRange(args.items), batch_size=args.batch_size, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    while True:  # epochs, until killed
        for _batch in loader:
            time.sleep(args.step_ms / 1000.0)


def loaders(args) -> int:
    """Three loaders of different kinds and arguments, each iterated once: what each one ran
    with, and whether it delivered its data exactly once, goes to --out as JSON."""
    torch.set_num_threads(1)
    items = 24
    built = {
        # positional num_workers, worker-only arguments that torch refuses with 0 workers
        "map": DataLoader(SlotFree(items), 4, False, None, None, 2, persistent_workers=True,
                          prefetch_factor=4, multiprocessing_context="fork"),
        "iterable": DataLoader(SplitRange(items), batch_size=4),
        "subclass": NamedLoader(SlotFree(items), batch_size=4, num_workers=1),
    }
    report = {}
    for name, loader in built.items():
        seen = sorted(int(x) for batch in loader for x in batch.flatten())
        report[name] = {"num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
                        "persistent_workers": loader.persistent_workers,
                        "complete": seen == list(range(items))}
    with open(args.out, "w") as fh:
        json.dump(report, fh)
    return 0


class SlotFree(Dataset):
    def __init__(self, items: int) -> None:
        self.items = items

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        return torch.tensor([i])


def no_loader(args) -> int:
    torch.set_num_threads(1)
    if args.sleep:
        while True:
            time.sleep(1)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="job", required=True)
    k = sub.add_parser("knee")
    k.add_argument("--slots", type=int, default=3)
    k.add_argument("--read-ms", type=float, default=10.0)
    k.add_argument("--batch-size", type=int, default=4)
    k.add_argument("--step-ms", type=float, default=1.0)
    k.add_argument("--workers", type=int, default=0, help="the program's own setting")
    k.add_argument("--seconds", type=float, default=0.0, help="stop after S s (0: when killed)")
    k.add_argument("--fail-from", type=int, default=0, help="fail with this many workers or more")
    k.add_argument("--stall-from", type=int, default=0,
                   help="hang before the first batch with this many workers or more")
    k.add_argument("--piddir", default=None)
    d = sub.add_parser("duplicates")
    d.add_argument("--items", type=int, default=64)
    d.add_argument("--batch-size", type=int, default=4)
    d.add_argument("--step-ms", type=float, default=1.0)
    d.add_argument("--workers", type=int, default=1)
    lo = sub.add_parser("loaders")
    lo.add_argument("--out", required=True)
    n = sub.add_parser("no-loader")
    n.add_argument("--sleep", action="store_true")
    args = p.parse_args(argv)
    return {"knee": knee, "duplicates": duplicates, "loaders": loaders,
            "no-loader": no_loader}[args.job](args)


if __name__ == "__main__":
    sys.exit(main())
