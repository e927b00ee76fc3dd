"""Instrumenting a training loop: a small classifier on synthetic images, CPU only, offline.

    python examples/train.py                          # then, in another terminal: loadertop
    python examples/train.py --epochs 1 --steps 20    # a quick run
    LOADERTOP_ENDPOINT=tcp://127.0.0.1:5591 python examples/train.py    # for: loadertop 127.0.0.1:5591

Everything here is an ordinary PyTorch loop; loadertop adds one call, `loadertop.instrument(...)`
around each DataLoader. The wrapped loaders iterate exactly like the originals.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import loadertop

CLASSES = 10
NOISE = 6.0  # enough that the classes overlap: accuracy climbs over epochs instead of starting at 100 %


class SyntheticImages(Dataset):
    """Noisy 1×16×16 images of CLASSES fixed patterns, made per index (as decoding a file would
    be), the same in any worker: the sample's own seed, not the worker's RNG, decides it."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self.patterns = torch.randn(CLASSES, 1, 16, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        rng = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(CLASSES, (1,), generator=rng))
        return self.patterns[label] + NOISE * torch.randn(1, 16, 16, generator=rng), label


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps", type=int, default=0, help="training steps per epoch (0: the whole set)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    # The DataLoader workers need the cores too; a model this small gains nothing from more
    # threads, and on a busy CPU their spin-waiting costs far more than it saves.
    torch.set_num_threads(1)
    workers = {"num_workers": args.workers, "persistent_workers": args.workers > 0}
    train = loadertop.instrument(DataLoader(SyntheticImages(50_000, seed=1), batch_size=args.batch_size,
                                            shuffle=True, **workers), name="train")
    val = loadertop.instrument(DataLoader(SyntheticImages(5_000, seed=2), batch_size=256, **workers),
                               name="val")
    model = nn.Sequential(nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        for step, (images, labels) in enumerate(train, 1):
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step == args.steps:
                break
        model.eval()
        correct = seen = 0
        with torch.no_grad():
            for images, labels in val:
                correct += int((model(images).argmax(1) == labels).sum())
                seen += len(labels)
        print(f"epoch {epoch}: train loss {loss.item():.3f}, val accuracy {correct / seen:.1%}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
