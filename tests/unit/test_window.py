"""The window's walk, C (`client/_figures.c`) and pure Python (`window.python_walk`): the same sums
of the same reports, for a recorded fleet's every source and refresh and for the reports that the
C walk must leave to Python."""

from __future__ import annotations

from collections import deque

import msgspec
import pytest
from test_model_documents import documents

from loadertop import wire
from loadertop.client import window
from loadertop.client.model import Model

import fakes
from fakes import LoaderSim

C_WALK = window._c_walk
needs_c = pytest.mark.skipif(C_WALK is None, reason="the C walk is not built here")


def same(reports: deque, since: float) -> tuple:
    want = window.python_walk(reports, since)
    got = C_WALK(reports, since)  # type: ignore[misc]
    assert got is not None
    assert repr(got) == repr(want)  # repr: an empty window's int 0 is not 0.0
    return got


@needs_c
def test_every_window_of_a_recorded_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet of test_model_documents (workers re-made with new pids, workers without one, a
    0-worker loader, a crash, lost reports, a clock that steps back): each source's window at
    every refresh, and the same window cut at each of its reports' times."""
    walked = []

    def check(reports: deque, since: float) -> tuple | None:
        got = same(reports, since)
        for received, _ in list(reports)[-16:]:
            same(reports, received)
        walked.append(got)
        return got

    monkeypatch.setattr(window, "_c_walk", check)
    documents()
    assert len(walked) > 400 and any(not w[19] for w in walked) and any(w[19] for w in walked)


def _reports(n: int, **kw: object) -> deque:
    """n reports of a simulated loader, as a viewer holds them: through the wire (tuples)."""
    sim = LoaderSim(**kw)
    end = fakes.T0 + n * fakes.REPORT_S
    return deque((fakes.T0 + i * fakes.REPORT_S,
                  wire.decode(wire.encode(sim.report(fakes.T0 + i * fakes.REPORT_S, end))))
                 for i in range(n))


@needs_c
def test_an_empty_window_covers_the_int_0() -> None:
    got = same(_reports(6), fakes.T0 + 100.0)
    assert got[1] == 0 and type(got[1]) is int and got[19] == {}
    assert same(deque(), 0.0)[1] == 0


@needs_c
def test_workers_in_another_order_and_without_pids_are_summed_alike() -> None:
    reports = _reports(8)
    shuffled = deque()
    for i, (at, m) in enumerate(reports):
        workers = tuple(m.workers[::-1]) if i % 2 else m.workers
        if i % 3 == 0:
            workers = tuple(msgspec.structs.replace(w, pid=None) for w in workers)
        shuffled.append((at, msgspec.structs.replace(m, workers=workers)))
    got = same(shuffled, 0.0)
    assert any(pid is None for _, pid in got[19]) and any(pid is not None for _, pid in got[19])


@needs_c
def test_what_the_c_walk_cannot_sum_natively_it_leaves_to_python() -> None:
    reports = _reports(4)
    at, m = reports[-1]
    past_64_bits = deque([*list(reports)[:-1], (at, msgspec.structs.replace(m, wait_ns=2**64))])
    assert C_WALK(past_64_bits, 0.0) is None
    w = msgspec.structs.replace(m.workers[0], fetch_cpu_ns=2**63)
    big_worker = deque([*reports, (at + 1, msgspec.structs.replace(m, workers=(w, w)))])
    assert C_WALK(big_worker, 0.0) is None

    class Later(wire.LoaderReport, frozen=True, gc=False, tag="later"):
        pass  # another type: its fields may lie elsewhere

    other = deque([(at, Later(**msgspec.structs.asdict(m)))])
    assert C_WALK(other, 0.0) is None
    # ... and the window the model shows is Python's sums all the same
    model = Model()
    for received, msg in past_64_bits:
        model.ingest(msg, received)
    (src,) = model.advance(at + 0.1).sources
    assert src.wait_fraction == 1.0


@needs_c
def test_a_report_without_process_cpu_or_stages_is_left_out_of_those_sums_only() -> None:
    reports = deque()
    for i, (at, m) in enumerate(_reports(8)):
        if i % 2:
            m = msgspec.structs.replace(m, process_cpu_ns=None, loop_cpu_ns=None, stages=None)
        else:
            m = msgspec.structs.replace(m, process_cpu_ns=10**8 + i, loop_cpu_ns=10**7 + i)
        reports.append((at, m))
    got = same(reports, 0.0)
    assert 0 < got[13] < got[1] and got[12] == 4 * 10**8 + 12  # half the window's time and CPU
    assert len(got[18]) == 4  # the stages of the reports that carry them
