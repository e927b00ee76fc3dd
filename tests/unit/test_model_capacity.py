"""The figures the advice rests on (issue 15), as the model builds them from real wire messages:
the training process's CPU in cores, the earlier settings of a re-created loader, and the
highest disk read rate of the run."""

from __future__ import annotations

import msgspec

from loadertop import wire
from loadertop.client import settings as settings_mod
from loadertop.client.model import Model

from fakes import loader_report, system_report

T0 = 1_700_000_000.0
CONFIG = dict(batch_size=4, prefetch_factor=2, pin_memory=False, persistent_workers=False,
              dataset="Store", worker_context="fork")


def config(workers: int, batch_size: int = 4) -> wire.LoaderConfig:
    return wire.LoaderConfig(num_workers=workers, **dict(CONFIG, batch_size=batch_size))


def report(seq: int, workers: int, *, batches: int, fetch_ms: float, cpu_share: float = 0.05,
           batch_size: int = 4, **overrides) -> wire.LoaderReport:
    """A 0.25 s report: `batches` received, each of the workers fetching its share."""
    per_worker = [batches // workers + (1 if i < batches % workers else 0) for i in range(workers)]
    fields = dict(
        seq=seq, sent_at=T0 + seq * 0.25, interval_s=0.25, config=config(workers, batch_size),
        batches=batches, wait_ns=int(0.2e9), wait_us=[20_000] * batches, step_us=[2_000] * batches,
        workers=[wire.WorkerReport(
            id=i, pid=200 + i, alive=True, exitcode=None, cpu_percent=5.0, rss_bytes=10**8,
            batches=n, fetch_us=[int(fetch_ms * 1000)] * n,
            fetch_wall_ns=int(n * fetch_ms * 1e6), fetch_cpu_ns=int(n * fetch_ms * 1e6 * cpu_share))
            for i, n in enumerate(per_worker)])
    fields.update(overrides)
    return loader_report(**fields)


def feed(model: Model, reports: list[wire.LoaderReport], start: float = T0) -> float:
    now = start
    for msg in reports:
        now = msg.sent_at
        model.ingest(msg, now)
    return now


def test_the_training_process_cpu_is_in_cores_over_the_window():
    model = Model(window_s=3.0)
    # 0.25 s reports with 50 ms of process CPU (0.2 of a core), 15 ms of it the loop's
    now = feed(model, [report(i, 2, batches=10, fetch_ms=40.0, process_cpu_ns=50_000_000,
                              loop_cpu_ns=15_000_000) for i in range(16)])
    src = model.advance(now).sources[0]
    assert src.process.cpu_cores == 0.2
    assert src.process.loop_cpu_cores == 0.06


def test_an_older_probe_or_too_little_time_gives_no_cpu_figure():
    model = Model(window_s=3.0)
    now = feed(model, [report(i, 2, batches=10, fetch_ms=40.0) for i in range(16)])
    src = model.advance(now).sources[0]
    assert src.process.cpu_cores is None and src.process.loop_cpu_cores is None
    # one report carrying it is under PROCESS_CPU_MIN_S: no figure rather than a noisy one
    now = feed(model, [report(16, 2, batches=10, fetch_ms=40.0, process_cpu_ns=1, loop_cpu_ns=1)])
    assert model.advance(now).sources[0].process.cpu_cores is None


def test_a_loader_recreated_with_more_workers_keeps_its_earlier_setting():
    model = Model(window_s=3.0)
    # 2 workers: a start-up report (no batch yet), then 5 s at 12 batches a report (48/s), 40 ms
    first = [report(0, 2, batches=0, fetch_ms=40.0)] + \
        [report(i, 2, batches=12, fetch_ms=40.0) for i in range(1, 21)]
    # then 6 workers: 50/s at 118 ms a batch
    second = [report(i, 6, batches=12 + (i % 2), fetch_ms=118.0) for i in range(21, 41)]
    now = feed(model, first)
    assert model.advance(now).sources[0].earlier_settings == ()  # the current one is not listed
    now = feed(model, second)
    src = model.advance(now).sources[0]
    assert src.config.num_workers == 6
    (earlier,) = src.earlier_settings
    assert (earlier.num_workers, earlier.batch_size) == (2, 4)
    # the first report with a batch is start-up too: 19 reports of 0.25 s count
    assert earlier.seconds == 4.75 and earlier.batches == 19 * 12
    assert earlier.batches_per_s == 48.0 and earlier.samples_per_s == 192.0
    assert earlier.fetch_ms == 40.0 and earlier.cpu_fraction == 0.05
    assert earlier.workers_rss_bytes == 2 * 10**8
    # and the document carries it, typed
    doc = msgspec.json.decode(msgspec.json.encode(model.document()))
    assert doc["sources"][0]["earlier_settings"][0]["num_workers"] == 2


def test_a_short_setting_is_not_kept_and_the_latest_of_each_setting_wins():
    history = settings_mod.SettingHistory()
    seq = 0

    def run(workers: int, reports: int, fetch_ms: float) -> None:
        nonlocal seq
        for _ in range(reports):
            msg = report(seq, workers, batches=8, fetch_ms=fetch_ms)
            history.add(msg, msg.sent_at)
            seq += 1

    run(2, 4, 40.0)  # 1 s: under MIN_S
    run(4, 12, 60.0)
    assert [s.num_workers for s in history.earlier()] == []  # 2 was too short; 4 is current
    run(2, 12, 45.0)
    run(4, 12, 70.0)
    assert [(s.num_workers, s.fetch_ms) for s in history.earlier()] == [(2, 45.0)]
    run(8, 12, 90.0)
    assert [(s.num_workers, s.fetch_ms) for s in history.earlier()] == [(2, 45.0), (4, 70.0)]


def test_the_disk_read_peak_is_the_highest_rate_of_the_run():
    model = Model()
    for i, rate in enumerate((10e6, 180e6, 50e6)):
        model.ingest(system_report(seq=i, disk_read_bytes_per_s=rate), T0 + i)
        model.ingest(report(i, 2, batches=10, fetch_ms=40.0), T0 + i)
    system = model.advance(T0 + 2).system
    assert system.disk_read_bytes_per_s == 50e6
    assert system.disk_read_peak_bytes_per_s == 180e6
