"""The random states a worker starts with, as the main process gets them (probe/rng.py), with real
fork and spawn workers: read wherever the program could have changed them since torch seeded the
worker (its worker_init_fn, an iterable dataset's `__iter__`), and named by the worker's seed
where it could not; the generators a dataset holds found by the parent before a fork, by the
worker itself after a spawn."""

from __future__ import annotations

import pickle
import random
import subprocess
import sys
import time

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from workloads.lt_data import WorkloadDataset

import loadertop
from loadertop.probe import rng, worker

pytestmark = pytest.mark.slow


def _starts(loader, timeout_s: float = 20.0) -> tuple[dict[int, dict[str, str]], list]:
    """One epoch: (worker id -> the digests its start message carried, the items)."""
    record = loader._lt_record
    it = iter(loader)
    pids = {w.pid for w in it._workers}
    items = list(it)
    del it  # the workers exit: a worker with one task sends what it held then
    deadline = time.monotonic() + timeout_s
    while not pids <= set(record._rng) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids <= set(record._rng), (pids, record._rng)
    return {wid: digests for pid, (wid, digests) in record._rng.items() if pid in pids}, items


class _Seeds(Dataset):
    """Map-style: item i is (the worker that made it, that worker's seed)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return info.id, info.seed


class _ReseedingIterable(IterableDataset):
    """Re-seeds `random` and numpy alike in every worker as its iterator is made: torch 2.13
    calls `iter(dataset)` in the worker after worker_init_fn, before the first fetch."""

    def __iter__(self):  # not a generator function: this body runs at iter(), not at next()
        random.seed(0)
        np.random.seed(0)
        info = get_worker_info()
        return iter([(info.id, info.seed)])


def _reseed_alike(worker_id: int) -> None:
    random.seed(0)
    np.random.seed(0)


def _by_seed(seed: int) -> str:
    return rng._digest((seed,))


def test_states_left_as_torch_seeded_them_are_named_by_each_workers_seed():
    loader = loadertop.instrument(
        DataLoader(_Seeds(), batch_size=None, num_workers=2, multiprocessing_context="fork"),
        name="rng-untouched")
    starts, items = _starts(loader)
    seeds = dict(items)
    assert sorted(starts) == sorted(seeds) == [0, 1], (starts, seeds)
    for wid, digests in starts.items():
        # not read: named by the seed torch gave this worker, so no two workers can match
        assert digests["random"] == digests["numpy global"] == _by_seed(seeds[wid]), digests
        assert digests["torch"] == _by_seed(seeds[wid])
    assert starts[0]["random"] != starts[1]["random"]


def test_a_worker_init_fn_that_reseeds_alike_is_read_and_found_shared():
    loader = loadertop.instrument(
        DataLoader(_Seeds(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                   worker_init_fn=_reseed_alike), name="rng-init")
    starts, items = _starts(loader)
    seeds = dict(items)
    for state in ("random", "numpy global"):
        assert starts[0][state] == starts[1][state], (state, starts)
        assert starts[0][state] != _by_seed(seeds[0])


def test_an_iterable_datasets_iter_that_reseeds_alike_is_read_and_found_shared():
    loader = loadertop.instrument(
        DataLoader(_ReseedingIterable(), batch_size=None, num_workers=2,
                   multiprocessing_context="fork"), name="rng-iterable")
    starts, items = _starts(loader)
    assert sorted(wid for wid, _ in items) == [0, 1], items
    for state in ("random", "numpy global"):
        assert starts[0][state] == starts[1][state], (state, starts)
        assert starts[0][state] != _by_seed(dict(items)[0])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_generator_the_dataset_holds_is_found_shared(context):
    # fork: found by the parent before it forks (the same object in every worker); spawn: the
    # hook is pickled without it, and each worker walks its own unpickled dataset.
    loader = loadertop.instrument(
        DataLoader(WorkloadDataset("cheap", length=8, rng="init"), batch_size=4, num_workers=2,
                   multiprocessing_context=context), name=f"rng-held-{context}")
    starts, _ = _starts(loader, timeout_s=60.0)
    name = "dataset.rng (numpy Generator)"
    assert name in starts[0] and starts[0][name] == starts[1][name], starts
    assert starts[0]["random"] != starts[1]["random"]


def test_the_hook_travels_to_spawned_workers_without_the_parents_generators():
    hook = worker.WorkerHook(None, "h:1:x", "/tmp/x.sock", None, [("dataset.g", object())])
    assert pickle.loads(pickle.dumps(hook)).generators is None
    assert hook.generators is not None  # the parent's own hook keeps them


WALK_IN_PARENT = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset
import loadertop
assert "numpy" in sys.modules and "numpy.random" not in sys.modules  # torch 2.13 leaves it
loader = loadertop.instrument(DataLoader(TensorDataset(torch.arange(8)), batch_size=4,
                                         num_workers=2, multiprocessing_context="fork"))
for _ in loader:
    pass
print("numpy.random" in sys.modules)
"""


def test_looking_for_generators_never_imports_numpy_random_in_the_main_process(lt_dir):
    # numpy 2's module __getattr__ imports numpy.random at the first `np.random`; a worker
    # imports it anyway (torch seeds it there), the program's own process must not.
    out = subprocess.run([sys.executable, "-c", WALK_IN_PARENT], capture_output=True, text=True,
                         timeout=120, env={"LOADERTOP_DIR": str(lt_dir), "PATH": "/usr/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout


def test_the_parent_walks_only_when_this_iter_forks_hooked_workers(monkeypatch):
    walks = []
    real = rng.find_generators
    monkeypatch.setattr(rng, "find_generators", lambda dataset: walks.append(1) or real(dataset))
    persistent = loadertop.instrument(
        DataLoader(_Seeds(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                   persistent_workers=True), name="rng-persistent")
    for _ in range(3):  # torch 2.13 resets the same workers at the 2nd and 3rd iter()
        assert len(list(persistent)) == 8
    assert len(walks) == 1
    spawned = loadertop.instrument(
        DataLoader(WorkloadDataset("cheap", length=4, rng="init"), batch_size=2, num_workers=1,
                   multiprocessing_context="spawn"), name="rng-spawned")
    assert len(list(spawned)) == 2
    assert len(walks) == 1  # spawned workers walk their own copy: nothing found here for them
