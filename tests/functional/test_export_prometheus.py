"""`loadertop export` scraped by a real Prometheus server (issue 13, docs/contract.md §8).

A real instrumented job (tests/workloads/train.py), the real `loadertop export` watching its
discovery directory, and the Debian package's `prometheus` started here on loopback with a 1 s
scrape interval; the assertions are PromQL through Prometheus's HTTP API, against what the job
itself counted and what `loadertop snapshot --json` says:

- `rate(loadertop_batches_total[10s])` is the job's own batches/s over the same 10 s within 10 %;
- `histogram_quantile(0.95, rate(loadertop_wait_seconds_bucket[10s]))` is the snapshot's p95 wait
  within the width of the bucket it falls in;
- the `loadertop_bottleneck` series at 1 names the snapshot's category;
- the source is 36 series (docs/prometheus.md's count), every rule of
  examples/grafana/loadertop-rules.yml evaluates and records the job, and every query of the
  Grafana dashboard shows it.

One Prometheus, one job, one exporter for the whole module (~20 s). Without `prometheus` on PATH
a local run skips with that reason; under CI (`LOADERTOP_CI` set: `.ci/run` installs the package)
it fails.
"""

from __future__ import annotations

import bisect
import json
import os
import shutil
import subprocess
import time

import pytest

from loadertop.exporter.aggregate import EXPORTED_LE_MS

from conftest import (
    ALIVE_S,
    REPO,
    SnapshotRun,
    Workload,
    clean_env,
    kill_group,
    loadertop_cmd,
    short_tmpdir,
    source_of,
    wait_for,
)
from prometheus_server import PROMETHEUS, Prometheus, free_port, http_get

pytestmark = pytest.mark.slow

RATE_WINDOW_S = 10
LEAD_S = 2  # scraped this long before the rate window too
RULES = REPO / "examples" / "grafana" / "loadertop-rules.yml"
# docs/prometheus.md's share of time in a category (the bottleneck's one series, counted)
CATEGORY_SHARE = (f'count_over_time(loadertop_bottleneck{{category="compute_bound"}}[{RATE_WINDOW_S}s])'
                  f' / ignoring (category) count_over_time(loadertop_source_up[{RATE_WINDOW_S}s])')


@pytest.fixture(scope="module")
def scraped():
    """A compute-bound job (test_e2e_diagnosis's "compute": cheap items, a 50 ms step, ~20
    batches/s, the loop hardly waits) exported and scraped until Prometheus holds a whole rate
    window; then one query round at one instant, beside the job's own count around it and a
    snapshot of the same job.

    Compute-bound, because the verdict must not depend on the machine: a loop that waits reads
    `cpu_saturated` on two cores as soon as another process takes one (a Python starting up, a
    neighbour's tests), and the exporter, whose verdict holds a change for three refreshes, and
    a snapshot could then judge different seconds differently. The snapshot runs while the
    window fills, so its own start-up is over before the window the queries read."""
    if PROMETHEUS is None:
        if os.environ.get("LOADERTOP_CI"):
            pytest.fail("prometheus is not installed: .ci/run installs the Debian package")
        pytest.skip("prometheus is not installed (apt-get install prometheus); CI runs this test")
    workdir = short_tmpdir()
    job = Workload("--kind", "cheap", "--workers", 2, "--batch-size", 4, "--step-ms", 50,
                   "--duration", ALIVE_S, directory=workdir)  # killed when done
    exporter = prometheus = None
    try:
        port = free_port()
        exporter = subprocess.Popen(loadertop_cmd("export", "--listen", f"127.0.0.1:{port}"),
                                    env=clean_env(workdir), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=REPO,
                                    start_new_session=True)
        prometheus = Prometheus(workdir, f"127.0.0.1:{port}", rule_files=[RULES])
        job.wait_discovery()
        prometheus.wait_ready()

        def serving():
            if exporter.poll() is not None:
                raise AssertionError(f"export exited {exporter.returncode}: "
                                     f"{exporter.stderr.read().decode(errors='replace')}")
            body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
            return body is not None and b"loadertop_source_up{" in body
        wait_for(serving, 60.0, "the exporter to serve the job", interval=0.1)
        snap = SnapshotRun(workdir, seconds=3.0)
        # The job's own count, sampled while Prometheus fills a whole rate window.
        counted: list[tuple[float, int]] = []

        def window_full():
            st = job.status()
            if st.get("t") and st.get("batches"):
                counted.append((st["t"], st["batches"]))
            # Samples from before the rate window began: rate() extrapolates a series that starts
            # inside its window only half an interval back, and would read ~10 % low.
            got = prometheus.query(
                f"count_over_time(loadertop_batches_total[{RATE_WINDOW_S + LEAD_S}s])", time.time())
            return got and float(got[0]["value"][1]) >= RATE_WINDOW_S + LEAD_S - 1
        wait_for(window_full, 40.0, "a full rate window in prometheus", interval=0.2)
        at = time.time()
        results = {
            "rate": prometheus.query(f"rate(loadertop_batches_total[{RATE_WINDOW_S}s])", at),
            "p95": prometheus.query("histogram_quantile(0.95, rate(loadertop_wait_seconds_bucket"
                                    f"[{RATE_WINDOW_S}s]))", at),
            "bottleneck": prometheus.query("loadertop_bottleneck == 1", at),
            "category_share": prometheus.query(CATEGORY_SHARE, at),
            "source_up": prometheus.query("loadertop_source_up", at),
            "workers_up": prometheus.query("sum(loadertop_worker_up)", at),
            # the source's series but its findings' (which come and go)
            "series": prometheus.query('count by (host, pid, rank, loader) ({__name__=~"loadertop_.+"'
                                       ', __name__!="loadertop_finding", loader!=""})', at),
            "rules": prometheus.rules(),
        }
        results["recorded"] = {rule["name"]: prometheus.query(rule["name"], at)
                               for rule in results["rules"] if rule["type"] == "recording"}
        results["dashboard"] = {title: prometheus.query(expr, at) for title, expr in _dashboard()}
        doc = snap.document()
        yield {"job": job, "at": at, "counted": counted, "results": results, "doc": doc}
    finally:
        if prometheus is not None:
            prometheus.stop()
        if exporter is not None:
            kill_group(exporter)
        job.kill()
        shutil.rmtree(workdir, ignore_errors=True)


DASHBOARD = REPO / "examples" / "grafana" / "loadertop.json"


def _dashboard() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the Grafana dashboard, with Grafana's variables
    as a Grafana showing every host and loader would fill them in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"].replace("$__rate_interval", f"{RATE_WINDOW_S}s")
             .replace("$host", ".*").replace("$loader", ".*"))
            for p in panels for t in p["targets"]]


def _only(result: list[dict]) -> tuple[dict, float]:
    assert len(result) == 1, result
    return result[0]["metric"], float(result[0]["value"][1])


def test_the_batch_rate_is_the_jobs_own(scraped):
    labels, rate = _only(scraped["results"]["rate"])
    job = scraped["job"]
    assert labels["pid"] == str(job.pid) and labels["loader"] == "train"
    assert labels["job"] == "loadertop"  # Prometheus's own labels beside ours
    at, counted = scraped["at"], scraped["counted"]
    start = min(counted, key=lambda c: abs(c[0] - (at - RATE_WINDOW_S)))
    end = min(counted, key=lambda c: abs(c[0] - at))
    assert end[0] - start[0] >= RATE_WINDOW_S - 1.5, (start, end)
    own = (end[1] - start[1]) / (end[0] - start[0])
    assert own > 10, own  # the job runs (~20 batches/s)
    assert abs(rate - own) <= 0.10 * own, f"prometheus {rate:.1f}/s, the job {own:.1f}/s"


def _bucket_width_ms(value_ms: float) -> float:
    bounds = [0.0, *EXPORTED_LE_MS]
    i = bisect.bisect_left(bounds, value_ms)
    i = min(max(i, 1), len(bounds) - 1)
    return bounds[i] - bounds[i - 1]


def test_the_p95_wait_from_the_histograms_is_the_snapshots(scraped):
    _labels, p95_s = _only(scraped["results"]["p95"])
    src = source_of(scraped["doc"], scraped["job"].pid)
    snapshot_p95 = src["wait_ms"]["p95"]
    promql_p95 = p95_s * 1000.0
    width = max(_bucket_width_ms(snapshot_p95), _bucket_width_ms(promql_p95))
    assert abs(promql_p95 - snapshot_p95) <= width, \
        f"histogram_quantile {promql_p95:.3f} ms, snapshot {snapshot_p95:.3f} ms (bucket {width} ms)"


def test_the_bottleneck_series_names_the_snapshots_category(scraped):
    labels, value = _only(scraped["results"]["bottleneck"])
    src = source_of(scraped["doc"], scraped["job"].pid)
    assert value == 1.0
    assert labels["category"] == src["diagnosis"]["category"] == "compute_bound"


def test_the_share_of_time_in_a_category_counts_the_bottlenecks_one_series(scraped):
    labels, share = _only(scraped["results"]["category_share"])
    assert labels["pid"] == str(scraped["job"].pid)
    assert 0.0 < share <= 1.0


def test_the_source_and_its_workers_are_up(scraped):
    _labels, up = _only(scraped["results"]["source_up"])
    assert up == 1.0
    _labels, workers = _only(scraped["results"]["workers_up"])
    assert workers == 2.0


def test_every_dashboard_query_is_valid_and_shows_the_job(scraped):
    answers = scraped["results"]["dashboard"]
    assert len(answers) >= 8
    # findings: none for a healthy job; every other panel shows it
    empty = [title for title, result in answers.items() if not result and title != "Findings"]
    assert not empty, f"panels without data: {empty}"
    (bottleneck,) = answers["Current bottleneck"]
    assert bottleneck["metric"]["category"] == "compute_bound"


def test_the_source_is_36_series_and_at_most_50_with_findings(scraped):
    """docs/prometheus.md's count for a loader with workers: 36 series, one more per finding kind
    listed (test_export's crowded source: 47 with every kind at once, whatever its workers)."""
    labels, count = _only(scraped["results"]["series"])
    assert labels["pid"] == str(scraped["job"].pid)
    assert count == 36


def test_every_rule_of_the_example_rules_evaluates_and_records_the_job(scraped):
    rules = scraped["results"]["rules"]
    assert {rule["type"] for rule in rules} == {"recording", "alerting"}
    unhealthy = [(rule["name"], rule.get("lastError")) for rule in rules if rule["health"] != "ok"]
    assert not unhealthy, unhealthy
    assert not [r["name"] for r in rules if r["type"] == "alerting" and r["state"] != "inactive"]
    recorded = scraped["results"]["recorded"]
    assert len(recorded) >= 4
    for name, result in recorded.items():
        labels, _ = _only(result)
        assert labels["pid"] == str(scraped["job"].pid), name
    # the loop hardly waits (compute-bound): the share from the counters says so too
    _, share = _only(recorded["loader:loadertop_wait_share:rate5m"])
    assert 0.0 <= share < 0.3
