"""A plain training loop whose whole loadertop integration is one line:
`wandb.log({**loadertop.metrics(), "loss": loss})`, W&B offline.

    WANDB_MODE=offline python tests/workloads/wandb_loop.py DIR [--logged N]

Iterates an instrumented loader (batch 8, 2 workers, a sample sleeps 2 ms) and logs every step,
until N steps have carried loadertop's figures (60 s cap); prints `done <steps> <steps with figures>`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import wandb
from torch.utils.data import DataLoader, Dataset

import loadertop


class Items(Dataset):
    def __len__(self) -> int:
        return 100000

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return torch.tensor([float(i)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--logged", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    train = loadertop.instrument(DataLoader(Items(), batch_size=8, num_workers=2), name="train")
    run = wandb.init(project="loadertop-tests", dir=args.dir, mode="offline")
    steps = with_figures = 0
    deadline = time.monotonic() + 60
    for batch in train:
        loss = float(batch.mean())
        figures = loadertop.metrics()
        wandb.log({**figures, "loss": loss})
        steps += 1
        with_figures += bool(figures)
        if with_figures >= args.logged or time.monotonic() > deadline:
            break
    run.finish()
    print(f"done {steps} {with_figures}", flush=True)


if __name__ == "__main__":
    main()
