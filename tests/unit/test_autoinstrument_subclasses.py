"""`run`'s class-level patch reaches DataLoader subclasses that override `__iter__`, defined before
or after the patch; each `__iter__` body runs once; unpatching restores every class."""

from __future__ import annotations

import torch
import torch.utils.data.dataloader as dataloader_module
from torch.utils.data import DataLoader, TensorDataset

from loadertop.probe import autoinstrument


def _dataset():
    return TensorDataset(torch.arange(8.0))


class _Before(DataLoader):
    calls = 0

    def __iter__(self):
        type(self).calls += 1
        return super().__iter__()


def test_subclasses_are_wrapped_once_and_unwrapped():
    assert autoinstrument.patch(dataloader_module)
    try:
        class After(DataLoader[int]):  # Generic's own __init_subclass__ still runs
            calls = 0

            def __iter__(self):
                After.calls += 1
                return super().__iter__()

        class Yielding(DataLoader):
            def __iter__(self):
                yield from super().__iter__()

        assert After.__parameters__ == ()
        for cls in (_Before, After):
            assert getattr(cls.__dict__["__iter__"], "_loadertop_original", None) is not None
        assert "_loadertop_original" not in vars(Yielding.__dict__["__iter__"])
        for cls, iterator in ((_Before, "_SingleProcessIterator"), (After, "_SingleProcessIterator"),
                              (Yielding, "generator")):  # a generator's body reaches DataLoader's
            loader = cls(_dataset(), batch_size=4)
            it = iter(loader)
            assert type(it).__name__ == iterator
            assert [b[0].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert _Before.calls == 1 and After.calls == 1
    finally:
        autoinstrument.unpatch(dataloader_module)
    assert "_loadertop_original" not in vars(_Before.__dict__["__iter__"])
    assert "_loadertop_original" not in vars(After.__dict__["__iter__"])
    assert "__init_subclass__" not in DataLoader.__dict__
