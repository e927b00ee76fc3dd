"""What `%loadertop on` / `off` ask of `run`'s patch (probe/autoinstrument.py): `off` leaves a
loader not measured yet alone while the measured ones go on; and, in a notebook, a loader that
takes the name of a dead one continues its source wherever it is iterated (a cell re-run rebinds
the variable; the training cell, edited since, is a new call site). In this process, with its own
publisher; the same in a real kernel: tests/functional/test_notebook.py."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.utils.data.dataloader as dataloader_module
from torch.utils.data import DataLoader, TensorDataset

from loadertop.probe import autoinstrument


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)


def _record(loader):
    entry = autoinstrument._records.get(loader)
    return None if entry is None or entry is autoinstrument._SKIP else entry[1]


@pytest.fixture
def patched():
    assert autoinstrument.patch(dataloader_module)
    try:
        yield
    finally:
        autoinstrument.unpatch(dataloader_module)
        autoinstrument.instrument_new_loaders(True)
        autoinstrument.continue_sources_by_name(False)


def test_off_leaves_new_loaders_alone_and_keeps_measuring_the_others(patched):
    measured_before_off = _loader()
    assert type(iter(measured_before_off)).__name__ == "_SingleProcessIterator"
    autoinstrument.instrument_new_loaders(False)
    left_alone = _loader()
    assert type(iter(left_alone)).__name__ == "_SingleProcessDataLoaderIter"  # torch's own
    assert _record(left_alone) is None
    assert type(iter(measured_before_off)).__name__ == "_SingleProcessIterator"
    autoinstrument.instrument_new_loaders(True)
    assert type(iter(left_alone)).__name__ == "_SingleProcessIterator"
    assert _record(left_alone).name == "left_alone"


def test_a_rebound_loader_continues_the_dead_ones_source_where_its_name_says_so(patched):
    autoinstrument.continue_sources_by_name(True)
    rebound_loader = _loader()
    list(rebound_loader)
    first = _record(rebound_loader)
    assert first.name == "rebound_loader"
    rebound_loader = _loader()  # the old loader dies here (refcount), its iterator long gone
    gc.collect()
    for _ in rebound_loader:  # another call site
        pass
    assert _record(rebound_loader) is first


def test_without_it_a_new_call_site_makes_a_new_source_as_under_run(patched):
    run_loader = _loader()
    list(run_loader)
    first = _record(run_loader)
    run_loader = _loader()
    gc.collect()
    for _ in run_loader:
        pass
    second = _record(run_loader)
    assert second is not first and second.name == "run_loader-2"


def test_a_live_loader_keeps_its_source_and_the_new_one_gets_its_own(patched):
    autoinstrument.continue_sources_by_name(True)
    kept_loader = _loader()
    list(kept_loader)
    first = _record(kept_loader)
    held = kept_loader  # still alive: its source is not given away
    kept_loader = _loader()
    list(kept_loader)
    assert _record(kept_loader) is not first and _record(kept_loader).name == "kept_loader-2"
    assert _record(held) is first
