"""The publisher thread's drain: its bulk path (`split_stamps`, in C where it is built, and in
Python) gives the same figures as the per-stamp loop, for every shape of chunk the hot path makes:
epoch marks first, inside and last, an exception's 0, and a loop inside next() between drains;
the ring's own split (`StampRing.take_split`) equals take() then the split, and takes nothing
where it refuses; and the histogram counting and the report's decimation in C (`bucket_count`,
`decimate_micros`) give what the Python ones do."""

from __future__ import annotations

import random

import pytest
import torch
from gc_race import call_while_a_finalizer_runs
from torch.utils.data import DataLoader, TensorDataset

from loadertop import wire
from loadertop.probe import histograms, stamp_drain
from loadertop.probe import record as recmod

BASE = 10**12


def _record(name: str) -> recmod.LoaderRecord:
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=1, num_workers=0)
    rec = recmod.LoaderRecord(loader, name=name, source=f"test:{name}", host="test", rank=None,
                              command="", process_started_at=0.0)
    rec._keep = loader  # the record holds its loader weakly
    return rec


def _batches(start: int, n: int, wait: int = 700, step: int = 300) -> list[int]:
    out, t = [], start
    for _ in range(n):
        out += [t, -(t + wait)]
        t += wait + step
    return out


def _script():
    """Chunks (lists of stamps, or "epoch" for an iter()), each followed by a drain."""
    t = BASE
    first = _batches(t, 5)
    t += 10_000
    yield ["epoch", first]                        # a mark first, then batches
    yield [_batches(t, 3), "epoch", _batches(t + 5_000, 4)]   # a mark in the middle
    t += 20_000
    yield [_batches(t, 2), [t + 3_000]]           # a loop inside next() at the drain (odd)
    yield [[-(t + 3_900)], _batches(t + 4_200, 2)]  # ... which returns in the next chunk
    t += 10_000
    yield [_batches(t, 2), "epoch"]               # a mark last (odd length with pending)
    yield [_batches(t + 5_000, 3), [t + 9_000, 0]]  # an exception's exit: 0
    t += 20_000
    yield [[t], "epoch"]                          # inside next(), then a mark
    yield [_batches(t + 2_000, 6)]


def _feed(rec: recmod.LoaderRecord, items) -> None:
    for item in items:
        if item == "epoch":
            rec.attach(iter(rec._keep), BASE)
        else:
            rec.events.extend(item)


def _figures(rec: recmod.LoaderRecord) -> dict:
    return {"batches": rec.batches_total, "epoch": rec.epoch, "wait": rec._wait_ns,
            "step": rec._step_ns, "in_next": rec.in_next_since, "prev_t1": rec._prev_t1,
            "waits": list(rec._wait_samples), "steps": list(rec._step_samples),
            "wait_buckets": list(rec._wait_buckets.counts),
            "step_buckets": list(rec._step_buckets.counts)}


IMPLEMENTATIONS = ["python"] + (["c"] if stamp_drain._c_split_stamps is not None else [])


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request, monkeypatch):
    """The drain's C helpers, or (param "python") none: the probe then uses its Python ones."""
    if request.param == "python":
        monkeypatch.setattr(stamp_drain, "StampRing", None)  # the records' stamps in a deque
        monkeypatch.setattr(stamp_drain, "_c_split_stamps", None)
        monkeypatch.setattr(histograms, "_c_bucket_count", None)
        monkeypatch.setattr(histograms, "_c_decimate_micros", None)
    return request.param


def test_the_bulk_drain_equals_the_per_stamp_loop(monkeypatch, implementation):
    bulk, each = _record("bulk"), _record("each")
    # the reference: every stamp through the per-stamp loop (a deque has no take_split)
    each.events = stamp_drain.DequeStamps(maxlen=stamp_drain.EVENTS_MAXLEN)
    monkeypatch.setattr(each, "_drain_alternating", lambda chunk: False)
    calls = {"bulk": 0}
    original = recmod.LoaderRecord._drain_split

    def counted(self, parts):
        done = original(self, parts)
        calls["bulk"] += done
        return done

    monkeypatch.setattr(recmod.LoaderRecord, "_drain_split", counted)
    for items in _script():
        _feed(bulk, items)
        bulk.drain()
        _feed(each, items)
        each.drain()
        assert _figures(bulk) == _figures(each), items
    assert calls["bulk"] >= 2  # the bulk path did take the plain chunks
    assert bulk.epoch == 4 and bulk.batches_total > 20


def test_a_chunk_with_epoch_marks_is_drained_in_bulk_between_them(monkeypatch, implementation):
    rec = _record("marks")
    each: list[list] = []
    original = recmod.LoaderRecord._drain_each

    def spy(self, chunk):
        each.append(list(chunk))
        original(self, chunk)

    monkeypatch.setattr(recmod.LoaderRecord, "_drain_each", spy)
    _feed(rec, [_batches(BASE, 4), "epoch", _batches(BASE + 10_000, 3), "epoch", "epoch",
                _batches(BASE + 20_000, 2) + [BASE + 30_000, 0], _batches(BASE + 40_000, 1)])
    rec.drain()
    # only the marks, and the stretch holding an exception's 0, went stamp by stamp
    assert each == [[None], [None], [None],
                    _batches(BASE + 20_000, 2) + [BASE + 30_000, 0] + _batches(BASE + 40_000, 1)]
    assert rec.epoch == 3 and rec.batches_total == 4 + 3 + 2 + 1


def test_each_ended_epoch_is_reported_with_its_start_apart_from_the_rest(implementation):
    """An epoch's EpochReport once the next iter() ends it: from its iter() to its first batch
    (the first next() of it apart), from there to its last batch, and the wait of the batches
    after the first — whether the marks come alone or inside a chunk, drained in bulk or not."""
    rec = _record("epochs")
    us = 1_000

    def batches(start: int, n: int) -> list[int]:
        return _batches(start, n, wait=700 * us, step=300 * us)

    # epoch 1: iter() at BASE, the first next() from 1 ms to 5 ms, then three batches waiting
    # 0.7 ms each, the last received at 8 ms
    rec.attach(iter(rec._keep), BASE)
    rec.events.extend([BASE + 1_000 * us, -(BASE + 5_000 * us), *batches(BASE + 5_300 * us, 3)])
    rec.drain()
    assert not rec._epochs  # not ended yet
    # epoch 2 begins (and with it epoch 1 ends); epoch 3's mark comes inside one chunk (_feed's
    # iter() starts at BASE)
    _feed(rec, ["epoch", batches(BASE + 20_000 * us, 2), "epoch", batches(BASE + 40_000 * us, 1)])
    rec.attach(iter(rec._keep), BASE + 50_000 * us)  # ends epoch 3
    rec.drain()
    assert list(rec._epochs) == [
        wire.EpochReport(epoch=1, start_ms=5.0, first_wait_ms=4.0, run_ms=3.0, run_wait_ms=2.1),
        wire.EpochReport(epoch=2, start_ms=20.7, first_wait_ms=0.7, run_ms=1.0, run_wait_ms=0.7),
        wire.EpochReport(epoch=3, start_ms=40.7, first_wait_ms=0.7, run_ms=0.0, run_wait_ms=0.0)]
    report = rec.report(BASE + 60_000 * us, 1.0, None)
    assert report.epochs == tuple(rec._epochs)
    assert wire.decode(wire.encode(report)).epochs == report.epochs  # valid on the wire


def test_an_epoch_with_lost_stamps_is_not_reported(implementation):
    rec = _record("lost epoch")
    rec.attach(iter(rec._keep), BASE)
    rec.drain()
    rec.events.extend(_batches(BASE + 1_000, stamp_drain.EVENTS_MAXLEN // 2 + 5))
    rec.drain()
    assert rec.dropped == 1 and rec.epoch == 1
    rec.attach(iter(rec._keep), BASE + 10**10)
    rec.events.extend(_batches(BASE + 10**10 + 1_000, 3))
    rec.attach(iter(rec._keep), BASE + 2 * 10**10)
    rec.drain()
    assert [e.epoch for e in rec._epochs] == [2]  # the first, short of stamps, is left out


@pytest.mark.parametrize("chunk", [[None], [BASE, None], [BASE, -(BASE + 5), None],
                                   [None, BASE, -(BASE + 5)], [BASE, 0], [0],
                                   [BASE, -(BASE + 5), BASE + 9, 0]])
def test_the_bulk_path_refuses_marks_and_exceptions_without_consuming(chunk, implementation):
    rec = _record("refuse")
    before = _figures(rec)
    assert rec._drain_alternating(list(chunk)) is False
    assert _figures(rec) == before


def _chunks(rng: random.Random):
    """(pending, chunk, prev_t1) of every shape: alternating runs of any length, with or without a
    pending t0 and a trailing one, equal and extreme stamps, and out-of-place ones."""
    yield None, [], None
    yield BASE, [], None
    yield BASE, [], BASE - 5
    yield None, [BASE], BASE + 10  # a trailing t0 before prev_t1: no step from it
    yield BASE, [-(BASE + 3)], BASE - 2
    yield BASE, [-BASE], BASE  # zero wait, zero step
    yield None, [2**63 - 1, -(2**63 - 1)], None  # int64's edges
    yield None, [1, -1, 1, -1], 1
    for _ in range(300):
        t = rng.randrange(1, 10**15)
        out = []
        for _ in range(rng.randrange(0, 40)):
            out += [t, -(t + rng.randrange(0, 10**6))]
            t = -out[-1] + rng.randrange(0, 10**6)
        if rng.random() < 0.3:
            out.append(t)
        pending = None
        if out and rng.random() < 0.3:
            pending, out = out[0], out[1:]
        if out and rng.random() < 0.2:  # something out of place
            out[rng.randrange(len(out))] = rng.choice([0, None, -5, 5])
        yield pending, out, rng.choice([None, t, rng.randrange(1, 10**15)])


@pytest.mark.skipif(stamp_drain._c_split_stamps is None, reason="the C drain is not built here")
def test_the_c_split_equals_the_python_one():
    rng = random.Random(9)
    seen = {"split": 0, "declined": 0}
    for pending, chunk, prev in _chunks(rng):
        for want in (False, True):
            c = stamp_drain._c_split_stamps(pending, list(chunk), prev, want)
            py = stamp_drain.py_split_stamps(pending, list(chunk), prev, want)
            py = None if py is None else tuple(py)
            assert c == py, (pending, chunk, prev, want)
            seen["split" if c is not None else "declined"] += 1
    assert seen["split"] > 300 and seen["declined"] > 50


@pytest.mark.skipif(stamp_drain._c_split_stamps is None, reason="the C drain is not built here")
@pytest.mark.parametrize("pending, chunk", [(None, [BASE, -(BASE + 1), 2**63]),
                                            (2**64, [-(2**64 + 1)]),
                                            (None, [BASE, -(2**63)]),
                                            (None, [BASE, True]),
                                            (None, [BASE, -(BASE + 0.5)])])
def test_the_c_split_declines_what_is_not_an_int64(pending, chunk, monkeypatch):
    """Outside int64 (no stamp of a real clock) the C split declines; the per-stamp loop still
    gives the drain's figures."""
    assert stamp_drain._c_split_stamps(pending, chunk, None, True) is None
    rec, each = _record("wide"), _record("wide-each")
    monkeypatch.setattr(each, "_drain_alternating", lambda chunk: False)
    each._interval_start_ns = rec._interval_start_ns  # a wait's part before it is left out
    for r in (rec, each):
        r.events = stamp_drain.DequeStamps(maxlen=stamp_drain.EVENTS_MAXLEN)  # a StampRing: int64 only
        r.in_next_since = pending
        r.events.extend(chunk)
        r.drain()
    assert _figures(rec) == _figures(each)


def test_bucket_counts_put_a_value_equal_to_a_bound_in_its_bucket(implementation):
    bounds = wire.HISTOGRAM_BOUNDS_NS
    counts = histograms.BucketCounts()
    values = [-1, 0, bounds[0], bounds[0] + 1, bounds[3], bounds[-1], bounds[-1] + 1, 10**17]
    assert counts.add(values) == sum(values)
    expected = [0] * (len(bounds) + 1)
    expected[0] = 3
    expected[1] = 1
    expected[3] = 1
    expected[len(bounds) - 1] = 1
    expected[len(bounds)] = 2
    assert counts.counts == expected
    assert counts.add([]) == 0 and counts.counts == expected


@pytest.mark.skipif(histograms._c_bucket_count is None, reason="the C drain is not built here")
def test_the_c_bucket_count_equals_the_python_one():
    bounds = wire.HISTOGRAM_BOUNDS_NS
    rng = random.Random(3)
    c_counts = [0] * (len(bounds) + 1)
    py_counts = list(c_counts)
    for n in (0, 1, 5, 63, 64, 65, 1000, 20_000):  # both sides of the Python's SORT_FROM
        values = [rng.choice([rng.randrange(-10, 10**11), rng.choice(bounds),
                              rng.choice(bounds) + rng.choice((-1, 1))]) for _ in range(n)]
        assert histograms._c_bucket_count(bounds, c_counts, values) == \
            histograms.py_bucket_count(bounds, py_counts, values)
        assert c_counts == py_counts
    assert sum(c_counts) == 21_198
    # Beyond int64, or a sum that would leave it: declined, nothing counted; Python counts it.
    for values in ([1, 2**63], [2**62, 2**62], [1, 2.5]):
        before = list(c_counts)
        assert histograms._c_bucket_count(bounds, c_counts, values) is None
        assert c_counts == before
    wide = histograms.BucketCounts()
    assert wide.add([1, 2**63]) == 2**63 + 1 and sum(wide.counts) == 2


def test_lost_stamps_are_counted_and_nothing_is_paired_across_the_gap(implementation):
    rec = _record("lost")
    rec._interval_start_ns = 0  # every wait lies inside the interval
    rec.in_next_since = BASE - 50  # a pending entry: its exit may be among the lost stamps
    # 11 stamps too many: what is kept starts with an exit whose entry was lost, and ends with
    # an entry (the ring keeps exactly the newest EVENTS_MAXLEN; a deque that filled up keeps
    # the same, and is treated as having lost some)
    stamps = _batches(BASE, stamp_drain.EVENTS_MAXLEN // 2 + 5) + [BASE + 10**9]
    rec.events.extend(stamps)
    rec.drain()
    assert rec.dropped == 1
    assert rec.batches_total == stamp_drain.EVENTS_MAXLEN // 2 - 1
    assert rec._wait_ns == 700 * rec.batches_total  # the stale entry paired with nothing
    assert rec.in_next_since == BASE + 10**9
    rec.events.extend([-(BASE + 10**9 + 700), *_batches(BASE + 10**10, 3)])
    rec.drain()
    assert rec.dropped == 1 and rec.batches_total == stamp_drain.EVENTS_MAXLEN // 2 + 3


needs_ring = pytest.mark.skipif(stamp_drain.StampRing is None, reason="the C drain is not built here")


@needs_ring
def test_the_rings_split_equals_take_then_split():
    rng = random.Random(11)
    seen = {"split": 0, "declined": 0}
    for pending, chunk, prev in _chunks(rng):
        if any(s is not None and not -2**63 < s < 2**63 for s in [pending, *chunk]):
            continue
        for want in (False, True):
            ring, other = stamp_drain.StampRing(1 << 12), stamp_drain.StampRing(1 << 12)
            ring.extend(chunk)
            other.extend(chunk)
            got = ring.take_split(pending, prev, want)
            taken, lost = other.take()
            expected = stamp_drain._c_split_stamps(pending, taken, prev, want)
            assert got == expected and lost == 0, (pending, chunk, prev, want)
            if got is None:  # refused: nothing taken
                seen["declined"] += 1
                assert ring.take() == (taken, 0)
            else:
                seen["split"] += 1
                assert len(ring) == 0 and ring.take() == ([], 0)
    assert seen["split"] > 300 and seen["declined"] > 50


@needs_ring
@pytest.mark.parametrize("pending, prev", [(True, None), (2**63, None), (1.5, None),
                                           (None, 2**64), (None, "x")])
def test_the_rings_split_declines_a_pending_or_last_exit_that_is_not_an_int64(pending, prev):
    ring = stamp_drain.StampRing(16)
    ring.extend([BASE, -(BASE + 5)])
    assert ring.take_split(pending, prev, True) is None
    assert ring.take() == ([BASE, -(BASE + 5)], 0)


@needs_ring
def test_the_rings_split_leaves_lost_stamps_to_take():
    ring = stamp_drain.StampRing(8)
    ring.extend(_batches(BASE, 5))  # 10 stamps into 8: 2 lost
    assert ring.take_split(None, None, False) is None
    stamps, lost = ring.take()
    assert lost == 2 and stamps == _batches(BASE, 5)[2:]
    ring.extend(_batches(BASE, 2))
    assert ring.take_split(None, None, False)[0] == [700, 700]  # the loss was reported once


@needs_ring
def test_a_stamp_pushed_while_the_rings_split_allocates_stays_for_the_next_drain():
    """As for take() (test_hotpath): making the result can run a collection whose finalizer
    pushes, as the training thread could while the GIL is released."""
    def make():
        ring = stamp_drain.StampRing(1 << 10)
        ring.extend(_batches(BASE, 3))
        return (lambda: ring.append(BASE + 10_000)), \
            (lambda: ring.take_split(None, None, True)), ring

    parts, ring = call_while_a_finalizer_runs(make)
    assert parts[0] == [700, 700, 700] and parts[6] == [BASE, BASE + 1000, BASE + 2000]
    assert ring.take() == ([BASE + 10_000], 0)


def test_a_records_drain_through_the_rings_split_gives_the_figures_of_take(monkeypatch):
    """The drain's figures are the same whichever way its steady stamps go: the ring's split,
    or take() and the split of the list."""
    if stamp_drain.StampRing is None:
        pytest.skip("the C drain is not built here")
    split, taken = _record("split"), _record("taken")
    taken.events = stamp_drain.DequeStamps(maxlen=stamp_drain.EVENTS_MAXLEN)
    took = {"split": 0, "taken": 0}
    original = recmod.LoaderRecord._drain_taken

    def spy(self, chunk, lost):
        took[self.name] += 1
        original(self, chunk, lost)

    monkeypatch.setattr(recmod.LoaderRecord, "_drain_taken", spy)
    drains = 0
    for items in _script():
        for rec in (split, taken):
            _feed(rec, items)
            rec.drain()
        drains += 1
        assert _figures(split) == _figures(taken), items
    assert split.batches_total == taken.batches_total > 20
    assert took["taken"] == drains and 0 < took["split"] <= drains - 3  # 3 drains were steady


@pytest.mark.skipif(histograms._c_decimate_micros is None, reason="the C drain is not built here")
def test_the_c_decimation_equals_the_python_one():
    rng = random.Random(5)
    limit = wire.MAX_SAMPLES
    for n in (0, 1, 999, limit - 1, limit, limit + 1, 2 * limit + 7, 13_000, 100_003):
        samples = [rng.randrange(-10**7, 10**12) for _ in range(n)]
        samples[:4] = [-1, -1000, -1001, 999][:n]  # floor division of negatives, as Python's
        assert histograms._c_decimate_micros(samples, limit) == histograms.py_decimated_micros(samples)
    for samples in ([1, 2.5], [2**63], [True]):
        assert histograms._c_decimate_micros(samples, limit) is None
        assert histograms.decimated_micros(samples) == histograms.py_decimated_micros(samples)
