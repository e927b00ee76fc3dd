"""The in-process publisher: loaders that die stop being reported; the loop's CPU while waiting."""

import gc
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import loadertop
from loadertop.probe import publisher as publisher_mod


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_garbage_collected_loader_is_retired(monkeypatch):
    monkeypatch.setattr(publisher_mod, "RETIRE_AFTER_S", 0.0)
    loader = loadertop.instrument(DataLoader(TensorDataset(torch.arange(8)), batch_size=2),
                                  name="short-lived")
    assert [b for (b,) in loader][0].tolist() == [0, 1]
    pub = publisher_mod.get_publisher()
    record = loader._lt_record
    assert record in pub.records
    kept = loadertop.instrument(DataLoader(TensorDataset(torch.arange(4))), name="kept")
    del loader
    gc.collect()
    assert _wait_for(lambda: record not in pub.records), "a dead loader is still reported"
    assert kept._lt_record in pub.records  # a live loader stays, iterated or not


def test_loop_cpu_while_blocked_is_low():
    # A dataset that sleeps 60 ms per batch: the loop's thread is blocked (off-CPU) inside
    # next(), and the publisher thread measures that through the loop thread's CPU clock.
    class Sleepy(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            time.sleep(0.06)
            return i

    loader = loadertop.instrument(DataLoader(Sleepy(), batch_size=1), name="sleepy")
    record = loader._lt_record
    for _ in loader:
        pass
    assert record._q_waiting_wall == 0  # num_workers=0: no queue sampling, nothing measured

    record._loop_cpu_clock = None
    from loadertop.probe.record import _thread_cpu_clock

    record.attach(object())  # a stand-in iterator; attach reads this thread's CPU clock
    assert record._loop_cpu_clock is not None
    record.events.append(time.perf_counter_ns())  # the loop enters next() ...
    record.drain()
    record._sample_loop_cpu()
    time.sleep(0.15)  # ... and is blocked there (sleeping is exactly what is measured)
    record._sample_loop_cpu()
    assert record._q_waiting_wall >= 100_000_000
    assert record._q_waiting_cpu / record._q_waiting_wall < 0.2
    assert _thread_cpu_clock() is not None


def test_a_new_epochs_workers_are_reported_alive_at_once():
    # torch starts the workers in the iterator's __init__; the first report after it tells their
    # liveness and pids, without waiting for the publisher's 1 Hz psutil sample.
    loader = loadertop.instrument(
        DataLoader(TensorDataset(torch.arange(64)), batch_size=4, num_workers=2), name="fresh")
    record = loader._lt_record
    next(iter(loader))  # a first epoch: the publisher runs (its first 1 Hz sample is behind it)
    it = iter(loader)  # the second epoch's new workers: attach() cleared the first epoch's status
    next(it)
    report = record.report(time.perf_counter_ns(), time.time(), None)
    assert [(w.id, w.alive) for w in report.workers] == [(0, True), (1, True)], report.workers
    assert all(w.pid and w.exitcode is None for w in report.workers), report.workers
    del it
