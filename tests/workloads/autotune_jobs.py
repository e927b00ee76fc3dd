"""A plain torch job (no loadertop import) for `run --autotune`'s tests and benchmark: its storage
serves SLOTS reads at once (a multiprocessing semaphore made before the loader, shared with forked
workers; each read sleeps READ_MS while holding a slot), so samples/s grow with num_workers up to
SLOTS and stay flat after.

    python autotune_jobs.py --epochs N [--workers 2] [--slots 4] [--samples 400] [--read-ms 5]
        [--batch-size 8] [--step-ms 0] [--prefetch 2] [--slow-every K [--slow-ms 200]]
        [--worker-ballast-mib M] [--persistent] [--spawn] [--iterable] [--instrument]
        [--out FILE]
    python autotune_jobs.py --compare [--stateful [--snapshot-every N]] [--out-of-order] ...

Every epoch writes one JSON line to --out: the sample indices it yielded, in order, a digest of
every batch's content, the loader's num_workers at its end, and its seconds. Spawned workers get
the semaphore through the dataset (multiprocessing pickles it for a child it starts). With
--shuffle the sampler draws from the global generator (seeded 0), and each epoch also writes a
number drawn from it after the epoch: the program's own random stream.

--compare runs the job twice in this process, the same loader built afresh each time from the
same seed: as written (`"run": "plain"`), then under `loadertop.instrument(loader,
autotune=True)` (`"run": "tuned"`; LOADERTOP_AUTOTUNE_SCHEDULE forces its switches). With
--stateful the loader is torchdata's StatefulDataLoader: the tuned run takes a state_dict after
every batch of the first epoch, and each one is loaded into the program as written (a fresh loader
of --workers, no loadertop), whose rest of that epoch is written as a line `"run": "resumed"`,
`"at"` the batches before it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

_ballast: list[bytes] = []


def fill_cgroup(share: float, lock) -> None:
    """Hold memory until this process's (v1) memory cgroup is `share` full: once, under `lock`
    so that two workers do not both fill it. Pages written (a bytes of ones), so charged."""
    if _ballast:
        return
    path = open("/proc/self/cgroup").read().split("memory:", 1)[1].splitlines()[0]
    group = "/sys/fs/cgroup/memory" + path
    with lock:
        limit = int(open(f"{group}/memory.limit_in_bytes").read())
        used = int(open(f"{group}/memory.usage_in_bytes").read())
        _ballast.append(b"\x01" * max(0, int(limit * share) - used))


class SlotStore(Dataset):
    def __init__(self, n: int, slots, read_s: float, fill=None, slow=None,
                 ballast_mib: int = 0) -> None:
        self.n = n
        self.slots = slots
        self.read_s = read_s
        self.fill = fill  # (from worker id, share, lock): workers from that id fill the cgroup
        self.slow = slow  # (every, seconds): one item in `every`, by a hash of its index, reads long
        self.ballast_mib = ballast_mib  # each worker holds this much private memory from its 1st item

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = get_worker_info()
        if self.fill is not None and info is not None and info.id >= self.fill[0]:
            fill_cgroup(self.fill[1], self.fill[2])
        if self.ballast_mib and info is not None and not _ballast:
            _ballast.append(b"\x01" * (self.ballast_mib << 20))  # written: private, charged
        read_s = self.read_s
        if self.slow is not None and (i * 2654435761) % self.slow[0] == 0:
            read_s = self.slow[1]
        with self.slots:
            time.sleep(read_s)
        return torch.tensor(i)


class SlotStream(IterableDataset):
    def __init__(self, n: int, slots, read_s: float) -> None:
        self.n = n
        self.slots = slots
        self.read_s = read_s

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(start, self.n, step):
            with self.slots:
                time.sleep(self.read_s)
            yield torch.tensor(i)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--read-ms", type=float, default=5.0)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--spawn", action="store_true")
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--instrument", action="store_true",
                   help="loadertop.instrument(loader, autotune=True), for a run without `run`")
    p.add_argument("--fill-cgroup-from-worker", type=int,
                   help="workers from this id on fill the process's v1 memory cgroup to 93 %%")
    p.add_argument("--step-ms", type=float, default=0.0, help="the training step, after each batch")
    p.add_argument("--prefetch", type=int, help="the loader's prefetch_factor (torch's default 2)")
    p.add_argument("--slow-every", type=int, help="one item in this many reads --slow-ms")
    p.add_argument("--slow-ms", type=float, default=200.0)
    p.add_argument("--worker-ballast-mib", type=int, default=0,
                   help="each worker holds this much private memory from its first item")
    p.add_argument("--compare", action="store_true", help="as written, then tuned (see above)")
    p.add_argument("--stateful", action="store_true", help="torchdata's StatefulDataLoader")
    p.add_argument("--snapshot-every", type=int, default=1)
    p.add_argument("--out-of-order", action="store_true", help="in_order=False")
    p.add_argument("--out")
    a = p.parse_args()
    context = multiprocessing.get_context("spawn" if a.spawn else "fork")
    slots = context.Semaphore(a.slots)
    fill = None
    if a.fill_cgroup_from_worker is not None:
        fill = (a.fill_cgroup_from_worker, 0.93, context.Lock())
    out = open(a.out, "w") if a.out else None
    started = time.perf_counter()
    if not a.compare:
        loader = make_loader(a, context, slots, fill)
        if a.instrument:
            import loadertop

            loader = loadertop.instrument(loader, autotune=True)
        total = run_epochs(loader, a, out, "run")
    else:
        total = run_epochs(make_loader(a, context, slots, fill), a, out, "plain")
        import loadertop

        tuned = loadertop.instrument(make_loader(a, context, slots, fill), autotune=True)
        states: list[dict] = []
        total += run_epochs(tuned, a, out, "tuned", states if a.stateful else None)
        for at, state in enumerate(states, start=1):
            resumed = make_loader(a, context, slots, fill, seed=False)
            resumed.load_state_dict(state)
            rest = epoch_lines(resumed, a)
            if out is not None:
                out.write(json.dumps({"run": "resumed", "at": at, **rest}) + "\n")
    elapsed = time.perf_counter() - started
    print(json.dumps({"samples": total, "seconds": elapsed, "samples_per_s": total / elapsed}))


def make_loader(a, context, slots, fill, seed: bool = True):
    """The program's loader, as written; the global generator seeded first (the shuffle draws
    from it, as does the program): `seed=False` for one that resumes a state_dict."""
    if seed:
        torch.manual_seed(0)
    slow = (a.slow_every, a.slow_ms / 1000) if a.slow_every else None
    dataset = (SlotStream(a.samples, slots, a.read_ms / 1000) if a.iterable
               else SlotStore(a.samples, slots, a.read_ms / 1000, fill, slow,
                              a.worker_ballast_mib))
    options = dict(batch_size=a.batch_size, num_workers=a.workers,
                   shuffle=a.shuffle and not a.iterable, persistent_workers=a.persistent,
                   multiprocessing_context=context if a.workers else None)
    if a.out_of_order:
        options["in_order"] = False
    if a.prefetch and a.workers:
        options["prefetch_factor"] = a.prefetch
    if a.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset, snapshot_every_n_steps=a.snapshot_every, **options)
    return DataLoader(dataset, **options)


def epoch_lines(loader, a, states: list | None = None) -> dict:
    """One epoch: its indices, a digest of its batches' content in order, its seconds."""
    t0 = time.perf_counter()
    seen: list[int] = []
    digest = hashlib.sha256()
    for batch in loader:
        seen.extend(int(x) for x in batch)
        digest.update(batch.numpy().tobytes())
        if states is not None:
            states.append(loader.state_dict())
        if a.step_ms:
            time.sleep(a.step_ms / 1000)
    return {"indices": seen, "digest": digest.hexdigest(), "seconds": time.perf_counter() - t0}


def run_epochs(loader, a, out, run: str, states: list | None = None) -> int:
    total = 0
    for epoch in range(a.epochs):
        line = epoch_lines(loader, a, states if epoch == 0 else None)
        total += len(line["indices"])
        if out is not None:  # the tuner sets the count at iter() (and inside long epochs)
            out.write(json.dumps({"run": run, **line, "num_workers": loader.num_workers,
                                  "program_random": torch.rand(1).item()}) + "\n")
            out.flush()
    return total


if __name__ == "__main__":
    main()
