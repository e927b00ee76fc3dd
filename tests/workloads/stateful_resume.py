"""torchdata's StatefulDataLoader, checkpointed mid-epoch and resumed, as a job that restarts
from a checkpoint does; prints one JSON line: every batch's sample indices (first epoch up to the
checkpoint, then the resumed loader's rest of that epoch and one more epoch), the state_dict's
keys, how often a subclass's own `__iter__` body ran, whether `isinstance` still holds, and the
type of the iterator the loop got (loadertop's wrapper under `loadertop run`).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Indices(Dataset):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int):
        return torch.tensor([i])


class Counted(StatefulDataLoader):
    """A program's own subclass on top of torchdata's: its body must run once per epoch."""

    calls = 0

    def __iter__(self):
        Counted.calls += 1
        return super().__iter__()


def make(args) -> Counted:
    return Counted(Indices(), batch_size=4, shuffle=True, num_workers=args.workers,
                   persistent_workers=args.persistent and args.workers > 0,
                   generator=torch.Generator().manual_seed(7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()
    loader = make(args)
    it = iter(loader)
    iterator_type = type(it).__name__
    before = [next(it).flatten().tolist() for _ in range(5)]
    state = loader.state_dict()
    del it, loader
    resumed = make(args)
    resumed.load_state_dict(state)
    after = [[b.flatten().tolist() for b in resumed] for _ in range(2)]
    print(json.dumps({"before": before, "after": after, "state_keys": sorted(state),
                      "iter_calls": Counted.calls, "isinstance": isinstance(resumed, StatefulDataLoader),
                      "iterator": iterator_type}), flush=True)


if __name__ == "__main__":
    main()
