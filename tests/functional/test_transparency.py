"""`loadertop.instrument(loader)` behaves exactly like `loader` (docs/contract.md §1; issue 2).

Real DataLoaders with real worker processes, iterated in this process next to a plain twin built
the same way: same batches in the same order (torch.equal), same len(), same attributes, same
exceptions, the user's loader object left as it was. Spawn/forkserver cases are few (each worker
start re-imports torch: ~2 s here).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import traceback
import warnings

import pytest
import torch
from torch.utils.data import DataLoader
from workloads.lt_data import RangeIterable, SquareDataset, pair_collate, set_tag

import loadertop
from loadertop.probe import publisher

from conftest import clean_env


# --------------------------------------------------------------------------- helpers
def assert_same(a, b, where="batch") -> None:
    """Deep equality of batches: tensors by torch.equal (and dtype), containers element-wise."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, \
            f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: {a} != {b}"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_epochs(loader, epochs: int = 1, break_at: int | None = None) -> list[list]:
    out = []
    for _ in range(epochs):
        batches = []
        for i, batch in enumerate(loader):
            batches.append(batch)
            if break_at is not None and i == break_at:
                break
        out.append(batches)
    return out


def assert_same_epochs(plain: list[list], inst: list[list]) -> None:
    assert [len(e) for e in plain] == [len(e) for e in inst], "batch counts per epoch differ"
    assert sum(len(e) for e in plain) > 0
    for n, (ep_plain, ep_inst) in enumerate(zip(plain, inst)):
        for i, (a, b) in enumerate(zip(ep_plain, ep_inst)):
            assert_same(a, b, f"epoch {n} batch {i}")


def map_ds():
    return SquareDataset(37)


def iter_ds():
    return RangeIterable(41)


CASES = {
    "map-w0": dict(ds=map_ds, batch_size=4),
    "map-w2-fork": dict(ds=map_ds, batch_size=4, num_workers=2, multiprocessing_context="fork"),
    "iterable-w0": dict(ds=iter_ds, batch_size=5),
    "iterable-w2-fork": dict(ds=iter_ds, batch_size=5, num_workers=2, multiprocessing_context="fork"),
    "map-w2-persistent": dict(ds=map_ds, batch_size=4, num_workers=2, persistent_workers=True),
    "map-w2-pin_memory": dict(ds=map_ds, batch_size=4, num_workers=2, pin_memory=True),
    "map-w0-pin_memory": dict(ds=map_ds, batch_size=4, pin_memory=True),
    "map-w2-drop_last-prefetch4": dict(ds=map_ds, batch_size=5, num_workers=2, drop_last=True,
                                       prefetch_factor=4),
    "map-w2-no_batching": dict(ds=map_ds, batch_size=None, num_workers=2),
    "map-w2-collate-init_fn": dict(ds=map_ds, batch_size=4, num_workers=2, collate_fn=pair_collate,
                                   worker_init_fn=set_tag),
    # spawn: the plain twin uses fork (same batches, a quarter of the cost)
    "map-w2-spawn-persistent": dict(ds=map_ds, batch_size=4, num_workers=2, persistent_workers=True,
                                    multiprocessing_context="spawn"),
    "iterable-w1-forkserver-persistent": dict(ds=iter_ds, batch_size=5, num_workers=1,
                                              persistent_workers=True,
                                              multiprocessing_context="forkserver"),
}
SLOW_CASES = {"map-w2-spawn-persistent", "iterable-w1-forkserver-persistent"}


def make(case: str, *, plain: bool = False) -> DataLoader:
    kwargs = dict(CASES[case])
    ds = kwargs.pop("ds")()
    if plain and kwargs.get("multiprocessing_context") in ("spawn", "forkserver"):
        kwargs["multiprocessing_context"] = "fork"
    return DataLoader(ds, **kwargs)


def _params():
    for case in CASES:
        marks = [pytest.mark.slow] if case in SLOW_CASES else []
        yield pytest.param(case, id=case, marks=marks)


# --------------------------------------------------------------------------- same batches
@pytest.mark.parametrize("case", _params())
def test_same_batches_over_three_epochs(case):
    plain = make(case, plain=True)
    loader = make(case)
    inst = loadertop.instrument(loader, name=f"t-{case}")
    assert inst is not loader
    with warnings.catch_warnings(record=True) as plain_warnings:
        warnings.simplefilter("always")
        expected = run_epochs(plain, 3)
    with warnings.catch_warnings(record=True) as inst_warnings:
        warnings.simplefilter("always")
        got = run_epochs(inst, 3)
    assert_same_epochs(expected, got)
    # the shim adds no warning of its own (pin_memory without an accelerator warns in both)
    assert sorted({str(w.message) for w in inst_warnings}) == sorted({str(w.message) for w in plain_warnings})
    # len(), attribute pass-through, isinstance
    if not isinstance(loader.dataset, torch.utils.data.IterableDataset):
        assert len(inst) == len(plain) == len(loader)
    for attr in ("dataset", "batch_size", "sampler", "batch_sampler", "num_workers", "collate_fn",
                 "pin_memory", "drop_last", "persistent_workers", "worker_init_fn", "generator"):
        assert getattr(inst, attr) is getattr(loader, attr), attr
    assert isinstance(inst, DataLoader)
    assert inst.prefetch_factor == loader.prefetch_factor


def test_shuffle_with_global_seed_gives_the_same_order():
    """The shim must not consume torch's global RNG (the sampler's and the workers' seeds)."""
    def build():
        return DataLoader(SquareDataset(50), batch_size=4, shuffle=True, num_workers=2)

    plain, inst = build(), loadertop.instrument(build(), name="shuffle")
    torch.manual_seed(1234)
    expected = run_epochs(plain, 2)
    torch.manual_seed(1234)
    got = run_epochs(inst, 2)
    assert_same_epochs(expected, got)
    assert not all(torch.equal(a["x"], b["x"]) for a, b in zip(expected[0], expected[1]))


def test_seeded_generator_shuffle_same_order():
    def build():
        return DataLoader(SquareDataset(50), batch_size=3, shuffle=True, num_workers=2,
                          generator=torch.Generator().manual_seed(7))

    assert_same_epochs(run_epochs(build(), 2), run_epochs(loadertop.instrument(build()), 2))


@pytest.mark.parametrize("kwargs", [
    pytest.param(dict(num_workers=0), id="w0"),
    pytest.param(dict(num_workers=2), id="w2"),
    pytest.param(dict(num_workers=2, persistent_workers=True), id="w2-persistent"),
])
def test_break_mid_epoch_then_full_epochs(kwargs):
    def build():
        return DataLoader(SquareDataset(40), batch_size=4, **kwargs)

    def script(loader):
        out = run_epochs(loader, 1, break_at=2)      # break mid-epoch
        out += run_epochs(loader, 1)                 # then a full epoch
        out += run_epochs(loader, 1, break_at=0)     # break right after the first batch
        out += run_epochs(loader, 1)
        return out

    expected, got = script(build()), script(loadertop.instrument(build(), name="brk"))
    assert [len(e) for e in got] == [3, 10, 1, 10]
    assert_same_epochs(expected, got)


def test_interleaved_iterators_of_one_loader():
    """Two live iterators of the same instrumented loader do not disturb each other."""
    def build():
        return DataLoader(SquareDataset(20), batch_size=4, num_workers=1)

    plain, inst = build(), loadertop.instrument(build(), name="interleave")
    pa, pb, ia, ib = iter(plain), iter(plain), iter(inst), iter(inst)
    for _ in range(5):
        assert_same(next(pa), next(ia))
        assert_same(next(pb), next(ib))
    for it in (pa, pb, ia, ib):
        with pytest.raises(StopIteration):
            next(it)


def test_two_loaders_in_one_process():
    """train + val, several epochs, interleaved, as a training script does."""
    def build():
        train = DataLoader(SquareDataset(30), batch_size=4, num_workers=2)
        val = DataLoader(RangeIterable(17), batch_size=3, num_workers=1)
        return train, val

    def script(train, val):
        out = []
        for _ in range(2):
            out += run_epochs(train, 1)
            out += run_epochs(val, 1)
        return out

    plain = script(*build())
    train, val = build()
    itrain = loadertop.instrument(train, name="train")
    ival = loadertop.instrument(val, name="val")
    assert itrain.loadertop_source != ival.loadertop_source
    assert itrain.loadertop_source.endswith(":train")
    assert_same_epochs(plain, script(itrain, ival))
    # the same name twice in one process still gives two distinct sources
    again = loadertop.instrument(DataLoader(SquareDataset(3)), name="train")
    assert again.loadertop_source != itrain.loadertop_source


# --------------------------------------------------------------------------- the user's objects
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_user_worker_init_fn_runs_and_loader_is_unchanged(persistent):
    loader = DataLoader(SquareDataset(16), batch_size=4, num_workers=2, worker_init_fn=set_tag,
                        persistent_workers=persistent)
    inst = loadertop.instrument(loader, name="init")
    for _ in range(2):
        tags = {int(t) for batch in inst for t in batch["tag"]}
        assert tags == {100, 101}  # set_tag ran in both workers, every epoch
        assert loader.worker_init_fn is set_tag  # the user's loader object is as it was
    assert inst.worker_init_fn is set_tag


def test_loader_without_worker_init_fn_keeps_none():
    loader = DataLoader(SquareDataset(8), batch_size=2, num_workers=2)
    inst = loadertop.instrument(loader)
    assert sum(len(b["y"]) for b in inst) == 8
    assert loader.worker_init_fn is None


def test_user_worker_init_fn_set_after_instrument_is_honoured():
    """Frameworks (Lightning) set worker_init_fn on the loader after wrapping: chained lazily."""
    loader = DataLoader(SquareDataset(8), batch_size=4, num_workers=2)
    inst = loadertop.instrument(loader, name="late")
    loader.worker_init_fn = set_tag
    assert {int(t) for b in inst for t in b["tag"]} == {100, 101}
    assert loader.worker_init_fn is set_tag


def test_attribute_setting_passes_through_with_the_same_errors():
    loader = DataLoader(SquareDataset(8), batch_size=4)
    inst = loadertop.instrument(loader)
    inst.custom_attribute = 42
    assert loader.custom_attribute == 42 and inst.custom_attribute == 42
    with pytest.raises(ValueError) as plain_err:
        DataLoader(SquareDataset(8), batch_size=4).batch_size = 3
    with pytest.raises(ValueError) as inst_err:
        inst.batch_size = 3
    assert str(inst_err.value) == str(plain_err.value)
    with pytest.raises(AttributeError):
        inst.no_such_attribute  # noqa: B018


def test_len_of_unsized_iterable_raises_like_the_plain_loader():
    from torch.utils.data import IterableDataset

    class Unsized(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    plain = DataLoader(Unsized())
    inst = loadertop.instrument(DataLoader(Unsized()))
    with pytest.raises(TypeError) as plain_err:
        len(plain)
    with pytest.raises(TypeError) as inst_err:
        len(inst)
    assert str(inst_err.value) == str(plain_err.value)


def test_instrumenting_twice_returns_the_same_wrapper():
    inst = loadertop.instrument(DataLoader(SquareDataset(4)))
    assert loadertop.instrument(inst) is inst


def test_disabled_returns_the_very_same_object(monkeypatch):
    loader = DataLoader(SquareDataset(4))
    monkeypatch.setenv("LOADERTOP_DISABLE", "1")
    assert loadertop.instrument(loader, name="off") is loader
    monkeypatch.setenv("LOADERTOP_DISABLE", "0")
    assert loadertop.instrument(loader, name="on") is not loader


def test_non_dataloader_iterables_still_iterate():
    """A loader-like that is not a DataLoader (a list of batches) is wrapped transparently."""
    batches = [torch.tensor([1, 2]), torch.tensor([3])]
    inst = loadertop.instrument(batches, name="list")
    assert len(inst) == 2
    assert_same(list(inst), batches)
    assert_same(list(inst), batches)


# --------------------------------------------------------------------------- exceptions
def _first_and_last_line(exc: BaseException) -> tuple[str, str]:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0], lines[-1]


def _raised(loader):
    """(exception, batches before it, names of the traceback's frames).

    The traceback is cut before returning: kept, it holds the frames and so the iterator and its
    workers in a reference cycle, and torch's iterator finalised by the cyclic GC waits 5 s per
    worker for workers that never get their stop signal (a torch/multiprocessing quirk)."""
    got = []
    try:
        for batch in loader:
            got.append(batch)
    except Exception as exc:
        frames = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        exc.__traceback__ = exc.__context__ = exc.__cause__ = None
        return exc, got, frames
    raise AssertionError("the loader raised nothing")


@pytest.mark.parametrize("kind, num_workers", [
    ("map", 0), ("map", 2), ("iterable", 0), ("iterable", 2),
])
def test_dataset_exceptions_reach_the_loop_unchanged(kind, num_workers):
    def build():
        ds = SquareDataset(20, fail_at=9) if kind == "map" else RangeIterable(20, fail_at=9)
        return DataLoader(ds, batch_size=2, num_workers=num_workers)

    plain_exc, plain_batches, _ = _raised(build())
    loader = build()
    inst = loadertop.instrument(loader, name=f"exc-{kind}-{num_workers}")
    inst_exc, inst_batches, frames = _raised(inst)
    assert type(inst_exc) is type(plain_exc)
    assert_same(inst_batches, plain_batches)
    if num_workers == 0:
        # the dataset's own exception object, message untouched, raised from the dataset's frame
        assert str(inst_exc) == str(plain_exc)
        assert inst_exc.args == plain_exc.args
        assert frames[-1] in ("__getitem__", "__iter__")
    else:
        # torch re-raises in the loop as the same type with the worker's traceback as text: the
        # header and the original error line are the same (the traceback text in between may show
        # the shim's timing frame)
        assert _first_and_last_line(inst_exc) == _first_and_last_line(plain_exc)
    # the loader still works after the error (a new epoch starts cleanly)
    assert_same(run_epochs(inst, 1, break_at=1), run_epochs(build(), 1, break_at=1))


def test_exception_in_collate_fn_reaches_the_loop():
    def bad_collate(batch):
        raise RuntimeError("collate failed")

    for workers in (0, 1):
        inst = loadertop.instrument(DataLoader(SquareDataset(4), batch_size=2, num_workers=workers,
                                               collate_fn=bad_collate))
        exc, got, _ = _raised(inst)
        assert type(exc) is RuntimeError and "collate failed" in str(exc) and got == []


def test_stop_iteration_and_empty_dataset():
    inst = loadertop.instrument(DataLoader(SquareDataset(0), batch_size=2, num_workers=1))
    assert list(inst) == []
    it = iter(loadertop.instrument(DataLoader(SquareDataset(2), batch_size=2)))
    next(it)
    with pytest.raises(StopIteration):
        next(it)


# --------------------------------------------------------------------------- workers' signals
def test_a_forked_worker_keeps_torchs_answer_to_its_parents_sigterm():
    """torch's workers exit 0 when their parent sends SIGTERM (the C handler `_worker_loop`
    installs before any worker_init_fn): multiprocessing's atexit terminates the daemonic workers
    of an iterator still alive at exit, and torch's SIGCHLD handler in the parent would otherwise
    raise "DataLoader worker (pid N) is killed by signal: Terminated". The parent here has
    loadertop's SIGTERM cleanup installed, whose Python handler a forked worker inherits by name."""
    # What `loadertop run` and instrument() install in a program that has no SIGTERM handler of
    # its own (pytest's may differ), set here for the test's duration.
    saved = signal.signal(signal.SIGTERM, publisher._on_sigterm)
    try:
        for instrumented in (False, True):
            loader = DataLoader(SquareDataset(64), batch_size=4, num_workers=2,
                                multiprocessing_context="fork")
            it = iter(loadertop.instrument(loader) if instrumented else loader)
            next(it)
            workers = list(it._workers)
            for worker in workers:
                worker._popen.terminate()  # what multiprocessing's _exit_function does
            for worker in workers:
                worker.join(30)
            assert [w.exitcode for w in workers] == [0, 0], \
                f"instrumented={instrumented}: {[w.exitcode for w in workers]}"
            del it
    finally:
        signal.signal(signal.SIGTERM, saved)


EXITS_WITH_A_LIVE_ITERATOR = """
import torch
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=2,
                    multiprocessing_context="fork")
it = iter(loader)
print(int(next(it)[0].sum()))
"""


def test_a_program_exiting_with_a_live_iterator_prints_nothing_more_under_run(tmp_path, lt_dir):
    """The user-visible side of the test above, under `loadertop run`: same output, nothing on
    stderr (torch's atexit message came in 12 of 20 such runs before the fix, never plain)."""
    script = tmp_path / "live_iterator.py"
    script.write_text(EXITS_WITH_A_LIVE_ITERATOR)
    env = clean_env(lt_dir)
    out = subprocess.run([sys.executable, "-m", "loadertop", "run", "-q", "--", sys.executable,
                          str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "6\n", "")
