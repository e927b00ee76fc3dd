"""How `loadertop run` names a loader (probe/naming.py) and reads its batch size, in-process.

A library's frames are real frames of code compiled under a `site-packages` path (what makes a
frame a library's); the loaders are real DataLoaders, and accelerate's batch samplers are its own.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
import torch
import torch.utils.data.dataloader as dataloader_module
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

from loadertop.probe import autoinstrument, naming, torch_internals

from recorded import needed

# A library that wraps loaders as accelerate 1.x and transformers 5.x do: a wrapper whose own
# __iter__ iterates the loader it keeps in `base_dataloader`, a trainer whose epoch holds the
# wrapper in `train_dataloader`, a parameter named `dataloader`, and a fetcher two wrappers out.
LIBRARY = textwrap.dedent('''
    import sys

    class Wrapper:
        def __init__(self, loader):
            self.base_dataloader = loader

        def __iter__(self):
            return iter(self.base_dataloader)

    class Fetcher:
        def __init__(self, wrapper):
            self.combined = wrapper

        def __iter__(self):
            return iter(self.combined)

    def run_epoch(train_dataloader):
        return first(iter(train_dataloader))

    def evaluation_loop(dataloader):
        return first(iter(dataloader))

    def fetch(loader):
        data_fetcher = Fetcher(Wrapper(loader))
        return first(iter(data_fetcher))

    def first(it):
        return next(it)
''')


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "site-packages" / "fakelib" / "loops.py"
    path.parent.mkdir(parents=True)
    path.write_text(LIBRARY)
    namespace: dict = {"__name__": "fakelib.loops"}
    exec(compile(LIBRARY, str(path), "exec"), namespace)
    assert naming.frame_kind(str(path)) == naming.LIBRARY
    return namespace


@pytest.fixture
def named():
    """The names of the loaders the patched DataLoader.__iter__ registers meanwhile, in order."""
    names: list[str | None] = []
    original = naming.name_and_site

    def spy(loader, frame):
        found = original(loader, frame)
        names.append(found[0])
        return found

    naming.name_and_site = spy
    assert autoinstrument.patch(dataloader_module)
    try:
        yield names
    finally:
        autoinstrument.unpatch(dataloader_module)
        naming.name_and_site = original
    assert "_loadertop_maker" not in vars(DataLoader.__init__)


def _made():
    return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)


def test_a_library_s_own_name_for_the_wrapper_it_iterates(library, named):
    library["run_epoch"](library["Wrapper"](_made()))  # no frame of the program holds it
    # accelerate's attribute `base_dataloader` loses to the trainer's `train_dataloader`
    assert named == ["train_dataloader"]


def test_generic_library_names_and_far_wrappers_name_nothing_the_wrapper_attribute_is_last(
        library, named):
    library["evaluation_loop"](library["Wrapper"](_made()))
    library["fetch"](_made())
    # `dataloader` is any loader's name in a library; `data_fetcher` holds a wrapper's wrapper
    assert named == ["base_dataloader", "base_dataloader"]


def test_the_program_s_own_frames_come_first(library, named):
    val_loader = _made()
    library["run_epoch"](library["Wrapper"](val_loader))
    assert named == ["val_loader"]


def test_a_loader_made_by_a_function_named_for_it_is_named_after_it(library, named):
    class Module:  # Lightning's hooks: the module makes the loader and never keeps it
        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)

        def helper(self):
            return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)

        def make_loader(self, split):  # a factory: it makes several
            return DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)

    library["fetch"](Module().val_dataloader())
    library["fetch"](Module().helper())
    library["fetch"](Module().make_loader("train"))
    # `helper` says nothing of loaders, `make_loader(split)` makes more than one
    assert named == ["val_dataloader", "base_dataloader", "base_dataloader"]


def test_a_batch_sampler_s_batch_size_is_the_loader_s():
    sampler = BatchSampler(SequentialSampler(range(64)), batch_size=8, drop_last=False)
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_sampler=sampler)
    assert loader.batch_size is None  # torch 2.13, given a batch sampler
    assert torch_internals.loader_config(loader)["batch_size"] == 8
    assert torch_internals.batch_size(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=None)) is None


def test_accelerate_s_loaders_batch_size():
    needed(importlib.util.find_spec("accelerate"), "accelerate is not installed")
    from accelerate.data_loader import BatchSamplerShard, prepare_data_loader

    plain = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8)
    prepared = prepare_data_loader(plain, put_on_device=False)  # one process: torch's sampler
    assert prepared.base_dataloader.batch_size is None
    assert torch_internals.loader_config(prepared.base_dataloader)["batch_size"] == 8
    for split, size in ((False, 8), (True, 4)):  # rank 0 of 2: split batches are halves
        shard = BatchSamplerShard(plain.batch_sampler, num_processes=2, process_index=0,
                                  split_batches=split)
        loader = DataLoader(plain.dataset, batch_sampler=shard)
        assert torch_internals.loader_config(loader)["batch_size"] == size
        assert {len(batch[0]) for batch in loader} == {size}


def test_frames_of_torch_and_loadertop_are_ours_and_code_without_a_file_the_program_s():
    assert naming.frame_kind(dataloader_module.__file__) == naming.OURS
    assert naming.frame_kind(autoinstrument.__file__) == naming.OURS
    assert naming.frame_kind("<string>") == naming.PROGRAM
    assert naming.frame_kind(textwrap.__file__) == naming.LIBRARY  # the standard library
    assert naming.frame_kind(__file__) == naming.PROGRAM
    assert sys.modules["torch"] is torch


def test_a_loader_made_after_its_predecessor_s_epoch_continues_its_source_not_loaders_made_together():
    kept = []  # what accelerate does with every loader it prepares: keeps it

    def evaluate():
        loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
        kept.append(loader)
        for _ in loader:
            pass

    assert autoinstrument.patch(dataloader_module)
    try:
        evaluate()
        evaluate()  # made after the first one's epoch began; the first has no iterator left
        together = [DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4) for _ in range(2)]
        for dl in together:
            for _ in dl:
                pass
        records = [autoinstrument._records[loader][1] for loader in kept + together]
    finally:
        autoinstrument.unpatch(dataloader_module)
    assert records[0] is records[1] and records[0].name.startswith("loader")
    assert records[2] is not records[3]
