"""Persistent-worker loaders built, iterated once and dropped, as a program that makes one per
phase or per evaluation does; prints one JSON line: how many of each loader's workers were still
alive after `del` + `gc.collect()` + `join(5)`, and how many of all its workers are alive at the
end. Plain torch unless `--instrument` (then `loadertop.instrument`); `loadertop run` and
`loadertop attach` are applied from outside.

`--wait-for FILE`: the first loader's loop waits at each batch until FILE exists, printing `up`
once (so `loadertop attach` can adopt the running iterator, found through this frame's locals).
`--stateful`: torchdata's StatefulDataLoader instead of DataLoader.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return torch.tensor([i])


def one_loader(args, wait_for: str | None) -> tuple[int, list[int]]:
    cls = DataLoader
    if args.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as cls
    loader = cls(Items(), batch_size=4, num_workers=2, persistent_workers=True,
                 multiprocessing_context=args.context)
    if args.instrument:
        import loadertop

        loader = loadertop.instrument(loader)
    it = iter(loader)
    said = False
    for _batch in it:
        while wait_for and not os.path.exists(wait_for):
            if not said:
                print("up", flush=True)
                said = True
            time.sleep(0.01)
    workers = list(loader._iterator._workers)
    pids = [w.pid for w in workers]
    del it, loader, _batch
    gc.collect()
    for w in workers:
        w.join(5)
    return sum(w.is_alive() for w in workers), pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", default="fork")
    parser.add_argument("--loaders", type=int, default=1)
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument("--stateful", action="store_true")
    parser.add_argument("--wait-for")
    args = parser.parse_args()
    after_each, pids = [], []
    for n in range(args.loaders):
        left, made = one_loader(args, args.wait_for if n == 0 else None)
        after_each.append(left)
        pids += made
    print(json.dumps({"alive_after_each": after_each, "workers": len(pids),
                      "alive_at_end": sum(alive(p) for p in pids)}), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
