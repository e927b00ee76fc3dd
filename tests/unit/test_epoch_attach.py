"""What `LoaderRecord.attach` does right after torch forks an epoch's workers, and what it leaves
to the publisher thread (`_resolve_epochs`): real 2-worker fork loaders, real worker processes."""

from __future__ import annotations

import threading
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from loadertop import wire
from loadertop.probe import record as recmod
from loadertop.probe import torch_internals


def _loader(**kwargs) -> DataLoader:
    kwargs.setdefault("num_workers", 2)
    return DataLoader(TensorDataset(torch.arange(64)), batch_size=4,
                      multiprocessing_context="fork", **kwargs)


def _record(loader) -> recmod.LoaderRecord:
    return recmod.LoaderRecord(loader, name="t", source="test:t", host="test", rank=None,
                               command="", process_started_at=0.0)


def _on_another_thread(fn) -> None:
    done = threading.Thread(target=fn)
    done.start()
    done.join(10)
    assert not done.is_alive()


def test_the_workers_pids_are_read_on_the_publisher_thread_not_at_attach(monkeypatch):
    reads: list[int] = []
    real = torch_internals.worker_pids_in

    def counted(workers):
        reads.append(threading.get_ident())
        return real(workers)

    monkeypatch.setattr(torch_internals, "worker_pids_in", counted)
    loader = _loader()
    record = _record(loader)
    it = iter(loader)
    try:
        record.attach(it, time.perf_counter_ns())
        assert reads == []  # nothing of the workers read on the loop's thread
        assert record._worker_procs == []
        publisher = []
        _on_another_thread(lambda: (publisher.append(threading.get_ident()), record.drain()))
        assert reads == publisher
        pids = [w.pid for w in it._workers]
        assert [pid for _, pid, _ in record._worker_procs] == pids
        record.drain()
        assert len(reads) == 1  # once per epoch
        pairing = record._pairing
        assert pairing is not None and pairing.pids == pids and pairing.unpaired is None
        assert pairing.workers is None  # torch's list is not held past the read
        assert all(record._recent_pairings[(pid, 0)] is pairing for pid in pids)
    finally:
        del it


def test_workers_gone_with_their_iterator_before_the_read_are_still_named_and_reported_ended():
    # A worker that dies in an epoch's first moments takes the iterator with it (torch raises in
    # the loop, which drops it): the Process objects attach kept still name the workers.
    loader = _loader()
    record = _record(loader)
    it = iter(loader)
    pids = [w.pid for w in it._workers]
    record.attach(it, time.perf_counter_ns())
    del it  # torch shuts the workers down and joins them
    assert record.iterator is None
    record.sample_workers()
    assert [pid for _, pid, _ in record._worker_procs] == pids
    assert [(status[0], status[1]) for status in record._worker_status.values()] == \
        [(pid, False) for pid in pids]


def test_a_workers_end_of_data_notice_finds_an_epoch_no_drain_has_reached():
    loader = _loader()
    record = _record(loader)
    it = iter(loader)
    try:
        record.attach(it, time.perf_counter_ns())
        pid = it._workers[1].pid
        record.add_worker_sample(wire.WorkerSample(
            source="test:t", worker_id=1, pid=pid, generation=0, seq=3, fetch_ns=0,
            collate_ns=0, cpu_ns=0, done_ns=0, ended=True))
        # the iterable case: task 3 * 2 + 1 = 7 is the first this epoch can no longer name
        assert record._recent_pairings[(pid, 0)].limit == 7
    finally:
        del it


def test_unhooked_workers_outrank_in_order_false_and_a_short_list_reads_unreadable():
    loader = _loader(in_order=False)
    record = _record(loader)
    it = iter(loader)
    try:
        record.attach(it, None)
        record.drain()
        assert record._pairing.unpaired == "in_order_false"
        record.unhooked_pids.add(it._workers[0].pid)  # as `loadertop attach` marks them
        record.attach(it, None)
        record.drain()
        assert record._pairing.unpaired == "workers_unhooked"
    finally:
        del it
    loader = _loader()
    record = _record(loader)
    it = iter(loader)
    try:
        workers = it._workers
        it._workers = workers[:1]  # one of two: the tasks cannot be named
        record.attach(it, None)
        it._workers = workers
        record.drain()
        assert record._pairing.unpaired == "unreadable"
    finally:
        del it


def test_the_settings_are_read_again_only_when_they_changed():
    loader = _loader()
    record = _record(loader)
    first = record.config
    record.refresh_config(loader)
    assert record.config is first  # nothing changed: not read again
    loader.num_workers = 3
    loader.pin_memory = True
    record.refresh_config(loader)
    assert record.config is not first
    assert (record.config.num_workers, record.config.pin_memory) == (3, True)
    loader.num_workers = 0
    record.refresh_config(loader)
    assert (record.config.num_workers, record.config.prefetch_factor) == (0, None)


def test_an_instrumented_loader_whose_num_workers_changes_reports_the_new_setting():
    import loadertop

    loader = loadertop.instrument(_loader(), name="changes")
    record = loader._lt_record
    assert [len(batch[0]) for batch in loader] == [4] * 16
    assert record.config.num_workers == 2
    loader.num_workers = 0
    assert [len(batch[0]) for batch in loader] == [4] * 16
    assert record.config.num_workers == 0
    record.drain()
    assert record._pairing is None  # a num_workers=0 epoch pairs nothing
