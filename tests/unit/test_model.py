"""The viewer model: figures from wire messages (no sockets), one `advance` per refresh, and a
`document()` that has no effects; the typed document is the contract's, fakes included."""

from __future__ import annotations

import json

import msgspec
import pytest

from loadertop import diagnosis, wire
from loadertop.client.document import Document, decode_json, encode_json
from loadertop.client.model import FORGET_AFTER_S, GONE_AFTER_S, Model

import fakes
from conftest import check_document
from fakes import T0, LoaderSim, MachineSim, Scenario, loader_report, system_report


def _report(seq: int, **worker) -> wire.LoaderReport:
    config = wire.LoaderConfig(num_workers=1, batch_size=4, prefetch_factor=2, pin_memory=False,
                               persistent_workers=False, dataset="DS", worker_context="fork")
    return wire.LoaderReport(
        source="h:1:train", seq=seq, host="h", pid=1, name="train", rank=None, command="python t.py",
        process_started_at=1.0, sent_at=100.0 + seq, interval_s=0.25, config=config, epoch=1,
        batches=5, batches_total=5 * (seq + 1), wait_ns=10**8, step_ns=10**8,
        wait_us=[20_000] * 5, step_us=[20_000] * 5, blocked_ms=None,
        queue=wire.QueueReport(capacity=2, ready=1, in_flight=1, samples=10, ready_sum=10,
                               in_flight_sum=10, waiting_samples=4, waiting_ready_samples=1,
                               waiting_cpu_ns=3 * 10**8, waiting_wall_ns=2 * 10**8),
        workers=[wire.WorkerReport(id=0, pid=2, alive=True, batches=5, fetch_us=[40_000] * 5,
                                   **worker)])


def test_cpu_fractions_are_capped_at_one():
    model = Model(window_s=3.0)
    # CPU time a hair (or, with decoding threads, far) above wall time: still "computes", 1.
    model.ingest(_report(0, fetch_wall_ns=200_000_000, fetch_cpu_ns=200_200_000), now=10.0)
    model.ingest(_report(1, fetch_wall_ns=200_000_000, fetch_cpu_ns=350_000_000), now=10.25)
    (src,) = model.advance(10.3).sources
    assert src.workers[0].cpu_fraction == 1.0
    assert src.queue.loop_cpu_when_waiting == 1.0
    assert src.wait_fraction is not None and 0 <= src.wait_fraction <= 1
    assert src.batches == 10 and src.batches_per_s == 20.0


def test_cpu_fraction_below_one_is_kept():
    model = Model(window_s=3.0)
    model.ingest(_report(0, fetch_wall_ns=200_000_000, fetch_cpu_ns=20_000_000), now=10.0)
    (src,) = model.advance(10.1).sources
    assert src.workers[0].cpu_fraction == 0.1


# --------------------------------------------------------------------------- a pure model


def test_document_before_the_first_advance_is_an_error():
    with pytest.raises(RuntimeError, match="advance"):
        Model().document()


def test_document_has_no_effects_however_often_it_is_asked():
    """The verdict stabilizer needs 3 refreshes to show a new category: only `advance` counts as
    one. Asking for the document in between, any number of times, changes nothing."""
    scenario = Scenario([LoaderSim()], [MachineSim()])
    scenario.run(T0 - 4, T0)
    model = scenario.model
    first = model.advance(T0)
    assert first.sources[0].diagnosis.category == diagnosis.COMPUTE_BOUND
    assert all(model.document() is first for _ in range(50))
    # The loop starts waiting for data: only the third refresh shows it.
    loader = scenario.loaders[0]
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.5, 20.0, 30.0
    shown = []
    for i in range(1, 4):
        scenario.run(T0 + 4 * (i - 1), T0 + 4 * i)
        doc = model.advance(T0 + 4 * i)
        for _ in range(20):
            assert model.document() == doc
        shown.append(doc.sources[0].diagnosis.category)
    assert shown == [diagnosis.COMPUTE_BOUND] * (diagnosis.STABLE_UPDATES - 1) + [diagnosis.INPUT_BOUND_CPU]


def test_a_held_verdict_quotes_todays_figures_and_names_the_change_it_holds_back():
    """Issue 50: `loadertop demo` a few seconds after its switch from healthy to I/O-bound. The
    hysteresis holds compute_bound for a few refreshes, but says it with today's figures (the
    loop waits 21 %, as the loader panel reads), and the document says which category waits:
    in the source's verdict, the top-level one and `snapshot --json` alike."""
    docs = fakes.held_verdict_history(diagnosis.STABLE_UPDATES)
    first = docs[0]
    (src,) = first.sources
    assert src.wait_fraction == 0.21
    for verdict in (src.diagnosis, first.diagnosis):
        assert verdict.category == diagnosis.COMPUTE_BOUND
        assert verdict.pending == diagnosis.INPUT_BOUND_IO
        assert verdict.summary == ("the loader keeps up (the loop waits 21 %): the training step "
                                   "is the limit")
        assert verdict.evidence[0] == "wait fraction 21 % (threshold 10 %)"
    raw = json.loads(encode_json(first))
    assert raw["diagnosis"]["pending"] == raw["sources"][0]["diagnosis"]["pending"] == "input_bound_io"
    # held until the change has persisted; then shown, nothing pending
    assert [d.diagnosis.pending for d in docs] == (
        [diagnosis.INPUT_BOUND_IO] * (diagnosis.STABLE_UPDATES - 1) + [None])
    assert docs[-1].diagnosis.category == diagnosis.INPUT_BOUND_IO
    assert json.loads(encode_json(docs[-1]))["diagnosis"]["pending"] is None


def test_a_held_verdict_with_nothing_true_left_to_say_gives_way_at_once():
    """An input-bound loop that stops iterating (no batch in the window): its held category has
    no figures to be said with, so idle shows at the first refresh instead of a wait fraction
    of the past."""
    scenario = Scenario([LoaderSim(wait_fraction=0.4, wait_p50_ms=20.0, wait_p95_ms=30.0)],
                        [MachineSim()])
    scenario.run(T0 - 4, T0)
    assert scenario.document(T0).diagnosis.category == diagnosis.INPUT_BOUND_CPU
    scenario.loaders[0].idle = True
    scenario.run(T0, T0 + 4)
    top = scenario.document(T0 + 4).diagnosis
    assert top.category == diagnosis.IDLE and top.pending is None


def test_sources_are_forgotten_by_advance_only():
    model = Model()
    model.ingest(loader_report(), now=T0)
    doc = model.advance(T0 + GONE_AFTER_S + 1)
    assert [s.state for s in doc.sources] == ["gone"]
    later = T0 + FORGET_AFTER_S + 1
    assert model.document() is doc  # nothing changed since: still listed
    assert model.advance(later).sources == ()
    assert model.sources == {}


def test_a_machine_report_out_of_the_documents_range_is_counted_and_dropped():
    """The wire checks types and sizes; the document's ranges catch the rest at ingest (a GPU
    at 300 % util), never at refresh time."""
    model = Model()
    bad_gpu = wire.GpuReport(index=0, name="G", util_percent=300.0)
    model.ingest(system_report(gpus=[bad_gpu]), now=T0)
    model.ingest(system_report(cpu_percent=-1.0), now=T0)
    model.ingest(loader_report(), now=T0)
    doc = model.advance(T0)
    assert doc.system is None
    assert doc.viewer.bad_messages == 2
    model.ingest(system_report(), now=T0 + 0.5)
    assert model.advance(T0 + 0.5).system is not None


def test_snapshot_json_is_one_encode_of_the_document():
    doc = fakes.io_bound_doc()
    raw = encode_json(doc)
    assert decode_json(raw) == doc
    assert json.loads(raw) == json.loads(msgspec.json.encode(doc))
    assert raw.startswith(b'{\n  "schema": "loadertop.snapshot/1"')


# --------------------------------------------------------------------------- fakes = the contract

SCENARIOS = [fakes.healthy_doc, fakes.gpu_doc, fakes.no_gpu_doc, fakes.io_bound_doc,
             fakes.dead_worker_doc, fakes.waiting_doc, fakes.empty_doc, fakes.waiting_for_system_doc,
             fakes.disconnected_doc, fakes.stale_doc, fakes.same_name_doc, fakes.multi_source_doc,
             fakes.main_process_doc, fakes.bad_frames_doc, fakes.main_process_bound_doc,
             fakes.unpaired_doc, fakes.straggler_doc,
             lambda: fakes.margin_history()[-1],
             lambda: fakes.workers_doc((20.0, 50.0, 60.0, 99.0), (1, 9, 2, 3))]


@pytest.mark.parametrize("build", SCENARIOS, ids=lambda f: getattr(f, "__name__", "workers_doc"))
def test_fake_documents_are_contract_documents(build):
    """The documents the TUI tests see pass the same strict check as `snapshot --json`'s, and
    are deterministic."""
    doc = build()
    assert isinstance(doc, Document)
    typed = check_document(json.loads(encode_json(doc)), system_required=False, recent=False)
    assert typed == doc
    assert build() == doc


def test_the_fakes_show_the_states_and_verdicts_they_are_named_after():
    def verdicts(doc: Document) -> list[tuple[str, str]]:
        return [(s.state, s.diagnosis.category) for s in doc.sources]

    assert verdicts(fakes.healthy_doc()) == [("running", "compute_bound")]
    assert verdicts(fakes.io_bound_doc()) == [("waiting", "input_bound_io")]
    assert verdicts(fakes.dead_worker_doc()) == [("stalled", "stalled")]
    assert verdicts(fakes.disconnected_doc()) == [("gone", "idle")]
    assert fakes.disconnected_doc().viewer.connected is False
    stale = fakes.stale_doc(age_s=7.4)
    assert stale.viewer.connected is True and stale.sources[0].age_s == 7.4
    multi = fakes.multi_source_doc()
    assert multi.diagnosis.category == "input_bound_cpu"
    assert multi.ranks.straggler == multi.diagnosis.source == "gpu-node-2:50200:train"
    assert verdicts(fakes.main_process_doc()) == [("waiting", "input_bound_cpu")]
    assert verdicts(fakes.main_process_bound_doc()) == [("running", "main_process_bound")]
    assert fakes.waiting_doc("ipc:///x.sock").viewer.endpoints == ("ipc:///x.sock",)
    assert fakes.waiting_for_system_doc().system is None
    bad = fakes.bad_frames_doc(malformed=3, wrong_version=1).viewer
    assert (bad.bad_messages, bad.wrong_version) == (3, 1)
    held = fakes.margin_history()
    assert held[0].sources[0].diagnosis.category == "input_bound_cpu"
    last = held[-1].sources[0]
    assert last.wait_fraction is not None and 0.07 <= last.wait_fraction < 0.10
    assert last.diagnosis.category == "input_bound_cpu"  # held by the margin
    assert "held until below 7 %" in last.diagnosis.evidence[0]


def _staged(seq: int, stages: wire.StageReport | None, **worker) -> wire.LoaderReport:
    return msgspec.structs.replace(_report(seq, **worker), stages=stages)


def test_stages_from_the_workers_and_the_paired_batches():
    model = Model(window_s=3.0)
    for seq in range(4):
        model.ingest(_staged(seq, wire.StageReport(
            paired=5, producing_ns=3 * 10**7, handoff_ns=10**7, handoff_us=[2_000] * 5,
            batch_tensors=3, batch_bytes=96), collate_us=[8_000] * 5), now=10.0 + seq * 0.25)
    (src,) = model.advance(11.0).sources
    st = src.stages
    assert st.fetch_ms is not None and st.fetch_ms.p50 == 40.0  # the items, from the workers
    assert st.collate_ms is not None and st.collate_ms.p50 == 8.0
    assert src.workers[0].collate_ms is not None and src.workers[0].collate_ms.p50 == 8.0
    assert st.handoff_ms is not None and st.handoff_ms.p50 == 2.0
    assert st.wait_split is not None
    assert (st.wait_split.producing, st.wait_split.handoff) == (0.75, 0.25)
    assert (st.batches_paired, st.unpaired) == (20, None)
    assert (st.tensors_per_batch, st.bytes_per_batch) == (3, 96)


def test_stages_unknown_are_null_with_their_reason():
    model = Model(window_s=3.0)
    model.ingest(_staged(0, wire.StageReport(unpaired="in_order_false")), now=10.0)
    model.ingest(_staged(1, None), now=10.25)  # a probe without stages says nothing
    (src,) = model.advance(10.5).sources
    st = src.stages
    assert st.handoff_ms is None and st.wait_split is None and st.batches_paired == 0
    assert st.unpaired == "in_order_false"
    assert st.collate_ms is None  # no collate samples: unknown, not 0


def test_a_split_needs_a_few_paired_batches():
    model = Model(window_s=3.0)
    model.ingest(_staged(0, wire.StageReport(paired=2, producing_ns=10, handoff_ns=10,
                                             handoff_us=[1, 1])), now=10.0)
    (src,) = model.advance(10.1).sources
    assert src.stages.wait_split is None and src.stages.handoff_ms is not None


def test_stats_of_whole_microseconds_are_numpys_percentiles_of_the_milliseconds():
    """`stats_of_us` sorts ints and turns only its five figures into ms: the percentiles are the
    same floats as interpolating the ms values (numpy's default), the mean within a rounding."""
    import random

    from loadertop.client.distributions import percentile, stats_of_us

    rng = random.Random(7)
    for _ in range(3000):
        n = rng.choice([1, 2, 3, 4, 7, 34, 135, 1000])
        us = [rng.randint(0, rng.choice([10, 1000, 10**5, 10**8])) for _ in range(n)]
        ms = sorted(v / 1000.0 for v in us)
        stats = stats_of_us(list(us))
        assert stats is not None
        for q, got in ((50, stats.p50), (95, stats.p95), (99, stats.p99), (100, stats.max)):
            assert got == round(percentile(ms, q), 3), (us, q)
        assert abs(stats.mean - sum(ms) / n) <= 0.0005 + 1e-9
    assert stats_of_us([]) is None


def test_a_workers_figures_are_its_own_process_s_and_the_stages_every_process_s():
    """A worker id re-made in a new epoch is another process: its row sums only the reports of
    the pid it has now; the stages' fetch times take every process the window saw."""
    model = Model()
    old = loader_report(seq=0, workers=[wire.WorkerReport(
        id=0, pid=501, alive=True, batches=2, fetch_us=(1000, 1000), fetch_wall_ns=2_000_000)])
    new = loader_report(seq=1, workers=[wire.WorkerReport(
        id=0, pid=502, alive=True, batches=1, fetch_us=(7000,), fetch_wall_ns=7_000_000)])
    model.ingest(old, T0)
    model.ingest(new, T0 + 0.25)
    (source,) = model.advance(T0 + 0.5).sources
    (worker,) = source.workers
    assert (worker.pid, worker.batches, worker.fetch_ms.max) == (502, 1, 7.0)
    assert source.stages.fetch_ms.max == 7.0 and source.stages.fetch_ms.p50 == 1.0
