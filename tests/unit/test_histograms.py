"""Exact histograms (issue 13): the probe counts every wait, step and worker fetch in the fixed
buckets of `wire.HISTOGRAM_BOUNDS_NS`, the wire carries the cumulative counts (an additive field:
older probes send none), and the model turns them into the document's `*_histogram` figures.
A real loader's counts against its batches: tests/functional/test_e2e_histograms.py."""

from __future__ import annotations

import bisect

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadertop import wire
from loadertop.client.model import HISTOGRAM_LE_MS, Model, histogram_figures
from loadertop.probe.histograms import BucketCounts

from fakes import T0, loader_report, mutated_frame, raw_frame

BOUNDS = wire.HISTOGRAM_BOUNDS_NS
N_BUCKETS = len(BOUNDS) + 1


def test_bounds_span_50_us_to_60_s_in_order():
    assert BOUNDS[0] == 50_000 and BOUNDS[-1] == 60_000_000_000
    assert list(BOUNDS) == sorted(set(BOUNDS))
    assert N_BUCKETS <= wire.MAX_BUCKETS


def test_a_value_on_a_bound_is_in_that_bounds_bucket_as_prometheus_le():
    counts = BucketCounts()
    counts.add([0, 50_000, 50_001, 100_000, 60_000_000_000, 60_000_000_001, 10**15])
    assert counts.counts[0] == 2  # 0 and exactly 50 µs: le="5e-05"
    assert counts.counts[1] == 2  # just above 50 µs, and exactly 100 µs
    assert counts.counts[N_BUCKETS - 2] == 1  # exactly 60 s
    assert counts.counts[-1] == 2  # beyond the last bound: only +Inf holds them
    assert sum(counts.counts) == 7
    assert counts.sum_ns == sum([0, 50_000, 50_001, 100_000, 60_000_000_000, 60_000_000_001, 10**15])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 10**12), max_size=300), st.lists(st.integers(0, 10**11), max_size=10))
def test_the_sorted_path_and_the_one_by_one_path_count_alike(values, singles):
    """Long chunks are counted through one sort, short ones value by value: the same counts."""
    bulk, one_by_one = BucketCounts(), BucketCounts()
    bulk.add(values)
    for v in singles:
        bulk.add_one(v)
    for v in values + singles:
        one_by_one.counts[bisect.bisect_left(BOUNDS, v)] += 1
    assert bulk.counts == one_by_one.counts
    assert bulk.sum_ns == sum(values) + sum(singles)


def test_counts_accumulate_across_reports():
    counts = BucketCounts()
    counts.add([1_000_000] * 100)  # 1 ms
    first = counts.histogram()
    counts.add([1_000_000] * 50)
    second = counts.histogram()
    assert first.counts[bisect.bisect_left(BOUNDS, 1_000_000)] == 100
    assert second.counts[bisect.bisect_left(BOUNDS, 1_000_000)] == 150
    assert first.counts != second.counts  # each report gets its own copy


def test_histograms_round_trip_on_the_wire():
    h = wire.Histogram(counts=list(range(N_BUCKETS)), sum_ns=123_456)
    msg = loader_report(
        wait_histogram=h, step_histogram=wire.Histogram(counts=[0] * N_BUCKETS),
        workers=[wire.WorkerReport(id=0, pid=5, alive=True, fetch_histogram=h)])
    back = wire.decode(wire.encode(msg))
    assert msgspec.json.encode(back) == msgspec.json.encode(msg)
    assert back.wait_histogram.counts == tuple(h.counts) == back.workers[0].fetch_histogram.counts


def test_a_report_without_histograms_still_decodes():
    """An older probe sends no histogram fields: its reports stay valid, the figures None."""
    body = msgspec.to_builtins(loader_report())
    for key in ("wait_histogram", "step_histogram"):
        del body[key]
    for worker in body["workers"]:
        del worker["fetch_histogram"]
    msg = wire.decode(raw_frame(body))
    assert msg.wait_histogram is None and msg.workers[0].fetch_histogram is None
    model = Model()
    model.ingest(msg, T0)
    src = model.advance(T0).sources[0]
    assert src.wait_histogram is None and src.step_histogram is None
    assert all(w.fetch_histogram is None for w in src.workers)


@pytest.mark.parametrize("path, value", [
    (["wait_histogram"], [[-1] * N_BUCKETS, 0]),
    (["wait_histogram"], [[0] * (wire.MAX_BUCKETS + 1), 0]),
    (["wait_histogram"], [[0] * N_BUCKETS, -5]),
    (["step_histogram"], [["1"] * N_BUCKETS, 0]),
    (["step_histogram"], {"counts": [0]}),
    (["workers", 0, "fetch_histogram"], [[1.5] * N_BUCKETS, 0]),
])
def test_hostile_histograms_are_malformed(path, value):
    with pytest.raises(wire.WireError) as info:
        wire.decode(mutated_frame(path, value))
    assert info.value.reason == "malformed"


def test_histograms_of_other_buckets_are_not_guessed_at():
    """Valid on the wire (a probe with other bounds), but not this version's: None, never
    re-binned into bounds they were not counted in."""
    assert histogram_figures(wire.Histogram(counts=[1, 2, 3])) is None
    assert histogram_figures(wire.Histogram(counts=[1] * (N_BUCKETS + 1))) is None


def test_the_model_serves_the_latest_cumulative_counts():
    model = Model()
    counts = [0] * N_BUCKETS
    counts[4], counts[-1] = 30, 2
    worker_counts = [0] * N_BUCKETS
    worker_counts[9] = 7
    msg = loader_report(
        wait_histogram=wire.Histogram(counts=counts, sum_ns=2_500_000_000),
        step_histogram=wire.Histogram(counts=[0] * N_BUCKETS),
        workers=[wire.WorkerReport(id=0, pid=5, alive=True,
                                   fetch_histogram=wire.Histogram(counts=worker_counts,
                                                                  sum_ns=7_000_000))])
    model.ingest(msg, T0)
    doc = model.advance(T0)
    src = doc.sources[0]
    assert src.wait_histogram is not None and src.step_histogram is not None
    assert src.wait_histogram.le_ms == HISTOGRAM_LE_MS
    assert HISTOGRAM_LE_MS[0] == 0.05 and HISTOGRAM_LE_MS[-1] == 60_000.0
    assert src.wait_histogram.counts == tuple(counts)
    assert src.wait_histogram.count == 32 and src.wait_histogram.sum_ms == 2500.0
    assert src.step_histogram.count == 0
    fetch = src.workers[0].fetch_histogram
    assert fetch is not None and fetch.count == 7 and fetch.sum_ms == 7.0
    # The document keeps its contract: it decodes strictly, histograms included.
    from loadertop.client.document import decode_json, encode_json

    assert decode_json(encode_json(doc)) == doc
