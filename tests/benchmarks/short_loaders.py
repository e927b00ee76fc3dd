"""A program of many short-lived loaders, for `overhead.py` (run plain and under `loadertop run`).

    python tests/benchmarks/short_loaders.py [--loaders 30] [--batches 4] [--workers 2]

Builds --loaders DataLoaders one after another (a new loader object each time, 2 fork workers,
a TensorDataset), takes --batches batches from each and drops it: the shape of a program that
evaluates in many small passes, or re-creates its loader every epoch. Prints its own wall time
from the first loader to the end (`loaders_s=`), so a caller can tell that from the whole
process's (interpreter start and `import torch` included).

LT_SHORT_DETAIL=1 adds the median and total ms of each phase of a loader's life (iter(), first
batch, the other batches, shutdown when the iterator is dropped).

LT_SHORT_SUSPECT (measurements of one suspect at a time, only meaningful under `loadertop run`;
comma-separated):
    no_worker_hook  the worker-side hook does nothing (no fetch timing, no socket, no watchdog)
    no_sender       fetch timing runs, but its samples are not sent
    no_retention    dead loaders' records retire at once (publisher RETIRE_AFTER_S = 0)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def _apply_suspects() -> None:
    suspects = set(filter(None, os.environ.get("LT_SHORT_SUSPECT", "").split(",")))
    if not suspects:
        return
    from loadertop.probe import publisher, worker

    if "no_worker_hook" in suspects:
        def call(self, worker_id):
            if self.user_init_fn is not None:
                self.user_init_fn(worker_id)

        worker.WorkerHook.__call__ = call
    if "no_sender" in suspects:
        worker._Sender.send = lambda self, *args, **kwargs: None
    if "no_retention" in suspects:
        publisher.RETIRE_AFTER_S = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loaders", type=int, default=30)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _apply_suspects()
    data = TensorDataset(torch.arange(256, dtype=torch.float32).reshape(64, 4))
    clock = time.perf_counter
    t0 = clock()
    total = 0.0
    phases: list[list[float]] = []  # per loader: iter(), first batch, the other batches, shutdown
    for _ in range(args.loaders):
        loader = DataLoader(data, batch_size=4, num_workers=args.workers,
                            multiprocessing_context="fork")
        marks = [clock()]
        it = iter(loader)
        marks.append(clock())
        for k in range(args.batches):
            (x,) = next(it)
            total += float(x.sum())
            if k == 0:
                marks.append(clock())
        marks.append(clock())
        del it, loader
        marks.append(clock())
        phases.append([b - a for a, b in zip(marks, marks[1:])])
    line = f"loaders_s={clock() - t0:.4f} checksum={total:.0f}"
    if os.environ.get("LT_SHORT_DETAIL"):
        import resource
        import statistics

        own = resource.getrusage(resource.RUSAGE_SELF)
        workers = resource.getrusage(resource.RUSAGE_CHILDREN)
        line += (f" main_cpu_s={own.ru_utime + own.ru_stime:.3f}"
                 f" workers_cpu_s={workers.ru_utime + workers.ru_stime:.3f}")

        names = ("iter", "first", "rest", "shutdown")
        line += " " + " ".join(
            f"{n}_ms={statistics.median(col) * 1e3:.2f}/{sum(col) * 1e3:.0f}"
            for n, col in zip(names, zip(*phases)))
    print(line, flush=True)


if __name__ == "__main__":
    main()
