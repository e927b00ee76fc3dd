"""A plain-torch training job for `loadertop attach`'s tests: it never imports loadertop.

    python tests/workloads/plain_train.py --workers 2 --context fork --stop FILE

Each epoch iterates `train_loader` (shuffled from torch's global RNG, seeded) and then a
`val_loader` made anew for that epoch (so after an attach there is a loader created after it,
and two loaders). Every batch prints one line on stdout:

    batch <loader> <epoch> <index> <checksum> <perf_counter_ns>

When FILE exists at the end of an epoch (after its validation) the job stops, prints
`rng <draws from torch, random and numpy's global RNGs>` and exits with `--exit-code`.
`reference(...)` computes, in the calling process, the lines a run without attach prints (with
one forked worker and no sleeps: the order and the batches do not depend on those).
`--hide-loadertop` drops every way of importing loadertop from sys.path first: a job whose
environment lacks it. `--ready FILE` is written once the first batch arrived.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    """Item i is (i, i*i mod 1009), after `sample_ms` of sleep (an I/O-like read)."""

    def __init__(self, n: int, sample_ms: float = 0.0) -> None:
        self.n = n
        self.sample_s = sample_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sample_s:
            time.sleep(self.sample_s)
        return torch.tensor([i, i * i % 1009], dtype=torch.int64)


def checksum(batch) -> int:
    ids = batch[:, 0].tolist()
    values = batch[:, 1].tolist()
    return sum((k + 1) * (a * 1009 + b) for k, (a, b) in enumerate(zip(ids, values)))


def make_train(args, reference: bool = False) -> DataLoader:
    # The reference: one forked worker, no sleeps. Torch's RNG draws happen in the main process
    # (the base seed when an iterator is made, the sampler's seed each epoch), so the order does
    # not depend on the workers; persistence does (one base seed for all epochs): it is kept.
    kwargs: dict = {}
    if args.workers:
        kwargs = dict(multiprocessing_context="fork" if reference else args.context,
                      persistent_workers=args.persistent)
    return DataLoader(Items(args.items, 0.0 if reference else args.sample_ms),
                      batch_size=args.batch_size, shuffle=True,
                      num_workers=(1 if reference else args.workers) if args.workers else 0,
                      **kwargs)


def make_val(args) -> DataLoader:
    return DataLoader(Items(args.val_items), batch_size=args.batch_size, num_workers=0)


def rng_line() -> str:
    import numpy as np

    return f"rng {torch.rand(1).item():.12f} {random.random():.12f} {np.random.random():.12f}"


def seed_all(seed: int) -> None:
    import numpy as np

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def reference(argv: list[str], epochs: int) -> list[str]:
    """The `batch` lines (without their time stamps) and the `rng` line of `epochs` epochs."""
    args = parse(argv)
    seed_all(args.seed)
    train_loader = make_train(args, reference=True)
    lines = []
    for epoch in range(epochs):
        for i, batch in enumerate(train_loader):
            lines.append(f"batch train {epoch} {i} {checksum(batch)}")
        val_loader = make_val(args)
        for i, batch in enumerate(val_loader):
            lines.append(f"batch val {epoch} {i} {checksum(batch)}")
    lines.append(rng_line())
    return lines


def hide_loadertop() -> None:
    import importlib.util

    def has_it(entry: str) -> bool:
        return os.path.exists(os.path.join(entry or os.curdir, "loadertop", "__init__.py"))

    sys.path[:] = [p for p in sys.path if not has_it(p)]
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(getattr(f, "__module__", ""))]
    sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in str(getattr(h, "__module__", ""))]
    sys.path_importer_cache.clear()
    assert importlib.util.find_spec("loadertop") is None


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--items", type=int, default=200)
    p.add_argument("--val-items", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-ms", type=float, default=4.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--max-epochs", type=int, default=100)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--exit-code", type=int, default=7)
    p.add_argument("--stop", default=None)
    p.add_argument("--ready", default=None)
    p.add_argument("--hide-loadertop", action="store_true")
    return p.parse_args(argv)


def main() -> int:
    args = parse()
    if args.hide_loadertop:
        hide_loadertop()
    seed_all(args.seed)
    train_loader = make_train(args)
    out = sys.stdout
    for epoch in range(args.max_epochs):
        for i, batch in enumerate(train_loader):
            out.write(f"batch train {epoch} {i} {checksum(batch)} {time.perf_counter_ns()}\n")
            out.flush()
            if args.ready and not os.path.exists(args.ready):
                open(args.ready, "w").close()
            time.sleep(args.step_ms / 1000.0)
        val_loader = make_val(args)
        for i, batch in enumerate(val_loader):
            out.write(f"batch val {epoch} {i} {checksum(batch)} {time.perf_counter_ns()}\n")
        out.flush()
        if args.stop and os.path.exists(args.stop):
            break
    print(rng_line(), flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
