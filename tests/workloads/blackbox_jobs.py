"""Jobs that end badly with no viewer, for the black box's readers (issue 39).

    python tests/workloads/blackbox_jobs.py oom

oom: iterates an instrumented DataLoader (num_workers=0), a batch every 0.1 s, for 2.5 s (the
black box has flushed its first reports by then), then keeps 16 MiB of touched memory per batch
until the kernel's OOM killer takes the process (run it inside a memory cgroup with a limit).
"""

from __future__ import annotations

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import loadertop


class Small(Dataset):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(4)


def main(argv: list[str]) -> int:
    if argv[:1] != ["oom"]:
        print("usage: blackbox_jobs.py oom", file=sys.stderr)
        return 2
    kept = []
    started = time.monotonic()
    for _ in loadertop.instrument(DataLoader(Small(), batch_size=8), name="train"):
        time.sleep(0.1)
        if time.monotonic() - started < 2.5:
            continue
        block = bytearray(16 * 1024 * 1024)
        for i in range(0, len(block), 4096):  # touch every page: charged to the cgroup
            block[i] = 1
        kept.append(block)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
