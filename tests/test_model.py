"""The viewer model's figures from hand-made reports (no sockets): fractions stay in 0..1."""

from loadertop import wire
from loadertop.viewer.model import Model


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
    model = Model()
    # CPU time a hair (or, with decoding threads, far) above wall time: still "computes", 1.
    model.ingest(_report(0, fetch_wall_ns=200_000_000, fetch_cpu_ns=200_200_000), now=10.0)
    model.ingest(_report(1, fetch_wall_ns=200_000_000, fetch_cpu_ns=350_000_000), now=10.25)
    (src,) = model.document(now=10.3, window_s=3.0)["sources"]
    assert src["workers"][0]["cpu_fraction"] == 1.0
    assert src["queue"]["loop_cpu_when_waiting"] == 1.0
    assert 0 <= src["wait_fraction"] <= 1
    assert src["batches"] == 10 and src["batches_per_s"] == 20.0


def test_cpu_fraction_below_one_is_kept():
    model = Model()
    model.ingest(_report(0, fetch_wall_ns=200_000_000, fetch_cpu_ns=20_000_000), now=10.0)
    (src,) = model.document(now=10.1, window_s=3.0)["sources"]
    assert src["workers"][0]["cpu_fraction"] == 0.1
