"""The hot path, C (`loadertop.probe._hotpath.Stamper`) and pure Python (`loader._PyStamper`):
the same stamps, batches and exceptions from both (issue 9: the C one is the cheaper hot path)."""

from __future__ import annotations

import collections
import gc
import itertools
import os
import sys
import time
import types

import pytest
from gc_race import call_while_a_finalizer_runs

from loadertop.probe import loader

STAMPERS = {"python": loader._PyStamper}
if loader._hotpath is not None:
    STAMPERS["c"] = loader._hotpath.Stamper


def test_ci_builds_the_c_hot_path():
    # setup.py builds it on Linux; it is optional so that an install without a compiler works,
    # which must not hide a broken build where the tests run
    if sys.platform.startswith("linux") and os.environ.get("LOADERTOP_CI"):
        assert loader.HOT_PATH == "c" and loader._InstrumentedIterator.__mro__[1] is \
            loader._hotpath.Stamper
    if loader._hotpath is None:
        pytest.skip("the C hot path is not built here")


class Inner:
    """An iterator like torch's: a Python __next__, batches that are fresh objects, then an end
    or an exception of the test's choosing."""

    def __init__(self, n: int, end: BaseException | None = None) -> None:
        self.n, self.i, self.end = n, 0, end
        self.given: list[object] = []

    def __next__(self):
        if self.i >= self.n:
            raise self.end if self.end is not None else StopIteration
        self.i += 1
        batch = object()
        self.given.append(batch)
        return batch


def _stamper(kind: str, inner: Inner, events: collections.deque, errors: list, sampling=False):
    return STAMPERS[kind](inner.__next__, events.append, errors.append, sampling)


@pytest.fixture(params=sorted(STAMPERS))
def kind(request) -> str:
    return request.param


def test_batches_are_the_inner_ones_and_each_is_stamped_in_and_out(kind):
    inner, events, errors = Inner(3), collections.deque(), []
    before = time.perf_counter_ns()
    got = list(_stamper(kind, inner, events, errors))
    after = time.perf_counter_ns()
    assert len(got) == 3 and all(a is b for a, b in zip(got, inner.given))
    stamps = list(events)
    assert len(stamps) == 8 and stamps[-1] == 0  # t0, -t1 per batch; t0, 0 for the end
    entries, exits = stamps[0::2], stamps[1::2]
    # the clock is perf_counter_ns's (stamps are compared with the workers' and the publisher's)
    assert all(before <= t <= after for t in entries)
    assert all(before <= -t <= after for t in exits[:-1])
    times = [abs(t) for t in stamps[:-1]]
    assert times == sorted(times)
    assert errors == []  # StopIteration is the end, not an error


def test_an_exception_is_the_same_object_noted_once_and_stamped_zero(kind):
    boom = KeyError("shard 7")
    inner, events, errors = Inner(1, end=boom), collections.deque(), []
    it = _stamper(kind, inner, events, errors)
    assert next(it) is inner.given[0]
    with pytest.raises(KeyError) as caught:
        next(it)
    assert caught.value is boom and errors == [boom]
    assert list(events)[-1] == 0 and list(events)[-2] > 0
    # the traceback still leads to where the loader raised
    assert caught.traceback[-1].name == "__next__" and "Inner" in repr(caught.traceback[-1].locals)


def test_a_stop_iteration_raised_by_the_loader_is_passed_on_untouched(kind):
    stop = StopIteration("epoch over")
    inner, events, errors = Inner(0, end=stop), collections.deque(), []
    it = _stamper(kind, inner, events, errors)
    with pytest.raises(StopIteration) as caught:
        next(it)
    assert caught.value is stop and errors == [] and list(events)[-1] == 0


def test_keyboard_interrupt_inside_next_passes_through(kind):
    inner, events, errors = Inner(0, end=KeyboardInterrupt()), collections.deque(), []
    with pytest.raises(KeyboardInterrupt):
        next(_stamper(kind, inner, events, errors))
    assert len(errors) == 1 and isinstance(errors[0], KeyboardInterrupt)


def test_sampling_hands_batches_from_next_sample_on_to_sampled_next(kind):
    base = STAMPERS[kind]

    class Sampling(base):
        __slots__ = ("sampled",)

        def _sampled_next(self, t0):
            self.sampled.append(t0)
            batch = self._next()
            self._append(-time.perf_counter_ns())
            self.next_sample = 1 << 62
            return batch

    inner, events = Inner(3), collections.deque()
    it = Sampling(inner.__next__, events.append, [].append, True)
    it.sampled = []
    assert it.next_sample == 0  # the first batch is a sampled one
    got = list(it)
    assert got == inner.given and len(it.sampled) == 1 and it.sampled[0] == events[0]
    # without sampling the method is never called
    plain = Sampling(Inner(2).__next__, collections.deque().append, [].append)
    plain.sampled = []
    assert len(list(plain)) == 2 and plain.sampled == []


def test_the_num_workers_0_iterator_measures_a_sampled_batch(kind, monkeypatch):
    """One batch measured per LOOP_CPU_SAMPLE_NS, read at each sampled batch: the interval is set
    here (an hour: only the first batch; 0: every one), as the 10 ms of the real one can pass
    between two batches of a loaded machine."""
    multi, single = loader.PY_ITERATORS if kind == "python" else loader.C_ITERATORS
    hour = 3600 * 10**9
    for interval, sampled in ((hour, 1), (0, 4)):
        monkeypatch.setattr(loader, "LOOP_CPU_SAMPLE_NS", interval)
        record = types.SimpleNamespace(events=collections.deque(), note_error=[].append,
                                       loop_samples=collections.deque())
        inner = Inner(4)
        it = single(inner, record)
        got = list(it)
        assert got == inner.given and len(record.loop_samples) == sampled
        wall, cpu, fetch, collate, produced = record.loop_samples[0]
        assert wall > 0 and cpu >= 0 and fetch is None  # no torch fetcher: no stages
        stamps = list(record.events)
        assert len(stamps) == 10
        last_sampled_exit = -stamps[2 * sampled - 1]  # each exit is stamped -t1
        assert it.next_sample == last_sampled_exit + interval
    assert it.n == 4  # attributes come from the wrapped iterator
    assert type(multi(Inner(1), record)).__mro__[1] is STAMPERS[kind]


@pytest.mark.skipif("c" not in STAMPERS, reason="the C hot path is not built here")
def test_c_the_shims_own_failure_never_reaches_the_loop():
    def broken_append(_stamp):
        raise MemoryError("the deque could not grow")

    def broken_note(_exc):
        raise RuntimeError("noting failed")

    inner = Inner(1, end=ValueError("bad item"))
    it = loader._hotpath.Stamper(inner.__next__, broken_append, broken_note)
    assert next(it) is inner.given[0]  # the batch comes, the shim's MemoryError is dropped
    with pytest.raises(ValueError, match="bad item"):  # the loader's own, not the note's
        next(it)


@pytest.mark.skipif("c" not in STAMPERS, reason="the C hot path is not built here")
def test_c_holds_no_references_it_does_not_own_and_frees_cycles():
    inner = Inner(1000)
    events = collections.deque(maxlen=16)
    token = object()
    base = sys.getrefcount(token)
    it = loader._hotpath.Stamper(lambda: token, events.append, [].append)
    for _ in range(1000):
        assert next(it) is token
    del it
    assert sys.getrefcount(token) == base  # no leaked batch references
    freed = []

    class Holder:
        def __call__(self, exc):
            pass

        def __del__(self):
            freed.append(True)

    holder = Holder()
    cyclic = loader.C_ITERATORS[0](inner, types.SimpleNamespace(events=events, note_error=holder))
    holder.it = cyclic  # a cycle through the C fields: only tp_traverse lets the GC see it
    del holder, cyclic
    gc.collect()
    assert freed == [True]


@pytest.mark.skipif("c" not in STAMPERS, reason="the C hot path is not built here")
def test_c_before_init_says_so():
    class Lazy(loader._hotpath.Stamper):
        def __init__(self):
            pass

    with pytest.raises(RuntimeError, match="before __init__"):
        next(Lazy())


# --------------------------------------------------------------------------- the stamps' ring
needs_c = pytest.mark.skipif("c" not in STAMPERS, reason="the C hot path is not built here")


@needs_c
def test_a_stamp_ring_gives_back_its_stamps_in_order_with_marks_as_none():
    ring = loader._hotpath.StampRing(1 << 16)
    assert len(ring) == 0 and ring.take() == ([], 0)
    stamps = [5, -6, None, 7, 0, 2**63 - 1, -(2**63 - 1)]
    ring.extend(stamps[:3])
    for s in stamps[3:]:
        ring.append(s)
    assert len(ring) == 7 and ring
    assert ring.take() == (stamps, 0)
    assert len(ring) == 0 and not ring and ring.take() == ([], 0)
    # growing past its first block keeps every stamp, in order
    many = list(range(1, 5 * loader._hotpath.RING_START))
    ring.extend(many)
    assert ring.take() == (many, 0)


@needs_c
def test_a_full_stamp_ring_keeps_the_newest_and_counts_the_lost_exactly():
    ring = loader._hotpath.StampRing(8)
    ring.extend(range(1, 21))
    assert len(ring) == 8 and ring.capacity == 8
    assert ring.take() == (list(range(13, 21)), 12)
    ring.extend([1, 2])
    assert ring.take() == ([1, 2], 0)


@needs_c
@pytest.mark.parametrize("bad, error", [(2**63, OverflowError), (-(2**63), OverflowError),
                                        ("7", TypeError), (1.5, TypeError)])
def test_a_stamp_ring_refuses_what_is_not_a_stamp(bad, error):
    ring = loader._hotpath.StampRing(16)
    with pytest.raises(error):
        ring.append(bad)
    with pytest.raises(error):
        ring.extend([1, bad])
    assert ring.take() == ([1], 0)  # what came before the bad one
    for capacity in (0, 3, -8):
        with pytest.raises(ValueError):
            loader._hotpath.StampRing(capacity)


def test_stampers_push_into_a_ring_the_stamps_they_append_to_a_deque(kind):
    if "c" not in STAMPERS:
        pytest.skip("the C hot path is not built here")
    ring, events = loader._hotpath.StampRing(1 << 10), collections.deque()
    boom = ValueError("bad item")
    for sink in (ring.append, events.append):
        it = STAMPERS[kind](Inner(3, end=boom).__next__, sink, [].append)
        assert len(list(itertools.islice(it, 3))) == 3
        with pytest.raises(ValueError):
            next(it)
    stamps, lost = ring.take()
    assert lost == 0 and len(stamps) == len(events) == 8
    assert [s > 0 for s in stamps] == [s > 0 for s in events] == [True, False] * 3 + [True, False]
    assert stamps[-1] == events[-1] == 0 and all(s < 0 for s in stamps[1:-1:2])


@needs_c
def test_c_a_stamper_keeps_its_ring_alive():
    ring = loader._hotpath.StampRing(16)
    it = loader._hotpath.Stamper(Inner(2).__next__, ring.append, [].append)
    del ring
    gc.collect()
    assert len(list(it)) == 2
    stamps, lost = it._append.__self__.take()
    assert len(stamps) == 6 and lost == 0 and stamps[-1] == 0


@needs_c
def test_a_stamp_pushed_while_take_allocates_is_neither_lost_nor_taken_twice():
    """take()'s list allocation can run a garbage collection, and a finalizer then runs Python
    code: here it pushes a stamp, as the training thread could while the GIL is released."""
    def make():
        ring = loader._hotpath.StampRing(1 << 10)
        ring.extend([1, -2, 3])
        return (lambda: ring.append(-4)), ring.take, ring

    (first, lost), ring = call_while_a_finalizer_runs(make)
    second, _ = ring.take()
    assert lost == 0
    assert first + second == [1, -2, 3, -4]  # each stamp once, in order


@needs_c
def test_a_stamp_ring_never_initialised_counts_stamps_as_lost():
    ring = loader._hotpath.StampRing.__new__(loader._hotpath.StampRing)
    it = loader._hotpath.Stamper(Inner(1).__next__, ring.append, [].append)
    assert len(list(it)) == 1  # the batch still comes
    ring.append(7)
    assert len(ring) == 0 and ring.take() == ([], 5)
