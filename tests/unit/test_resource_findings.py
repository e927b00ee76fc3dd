"""The slow readings' findings (copy_on_read, memory_growth, fd_low, threads_oversubscribed,
shm_low), the memory trends they read (warm-up included), and the probe's sampler of them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import msgspec
import pytest
from test_diagnosis import make_source, make_system, worker

from loadertop import environment, findings, wire
from loadertop.client import resources as vr
from loadertop.client.document import MemoryTrend, ShmFigures, SourceFigures, WorkerFigures
from loadertop.client.resources import ResourceHistory, memory_trend
from loadertop.findings import _common, _trends, copy_on_read, fd_low, memory_growth, threads_oversubscribed
from loadertop.probe import resources as pr
from loadertop.system.host import shm_figures

#: The kinds read from the probe's slow readings (memory trends, file descriptors, threads).
RESOURCE_KINDS = (copy_on_read, memory_growth, fd_low, threads_oversubscribed)


def detect_resources(source, system):
    """What the slow readings of one source show (the other kinds are their own tests')."""
    return [found for kind in RESOURCE_KINDS for found in kind.detect(source, system)]


MIB = 1024 * 1024
GIB = 1024 * MIB
T0 = 1764437000.0


def trend(first: float, last: float, *, over_s: float = 60.0, samples: int = 12,
          rising: float = 1.0) -> dict[str, Any]:
    """A MemoryTrend (as a dict) rising in a straight line from `first` to `last` bytes."""
    return {"over_s": over_s, "first_bytes": int(first), "last_bytes": int(last),
            "slope_bytes_per_s": (last - first) / over_s, "rising_share": rising,
            "samples": samples}


def readings(**overrides: Any) -> dict[str, Any]:
    """make_source overrides: the training process's slow readings, fresh and unremarkable."""
    process = {"rss_bytes": 2 * GIB, "uss_bytes": 2 * GIB, "fds": 40, "fd_limit": 1024,
               "threads": 12, "rss_trend": trend(2 * GIB, 2 * GIB, rising=0.0),
               "uss_trend": trend(2 * GIB, 2 * GIB, rising=0.0), "age_s": 1.0}
    process.update(overrides)
    return {"process": process}


def slow_worker(i: int, **overrides: Any) -> dict[str, Any]:
    """A worker with healthy slow readings (flat memory, few fds, its own threads only)."""
    fields: dict[str, Any] = {"uss_bytes": 60 * MIB, "pss_bytes": 200 * MIB, "fds": 30,
                              "threads": 5, "uss_trend": trend(60 * MIB, 60 * MIB, rising=0.0),
                              "rss_trend": trend(500 * MIB, 500 * MIB, rising=0.0)}
    fields.update(overrides)
    return worker(i, **fields)


def source(workers: list[dict[str, Any]] | None = None, **overrides: Any) -> SourceFigures:
    base: dict[str, Any] = readings()
    base["workers"] = workers if workers is not None else [slow_worker(i) for i in range(4)]
    base.update(overrides)
    return make_source(**base)


def kinds(found) -> list[str]:
    return [f.kind for f in found]


def assert_readable(f) -> None:
    assert f.severity == "warning"
    assert f.summary and "\n" not in f.summary
    assert f.evidence and f.advice
    assert any("threshold" in line for line in f.evidence), f.evidence


# ---------------------------------------------------------------------------------------------
# healthy: nothing
# ---------------------------------------------------------------------------------------------

def test_a_healthy_source_has_no_resource_finding():
    assert detect_resources(source(), make_system()) == []
    shm = ShmFigures(path="/dev/shm", total_bytes=8 * GIB, free_bytes=8 * GIB)
    assert findings.machine(msgspec.structs.replace(make_system(), shm=shm)) == []


def test_unknown_readings_are_no_evidence():
    bare = make_source()  # no slow readings at all (no viewer yet, or an older probe)
    assert detect_resources(bare, make_system()) == []
    assert detect_resources(source(), None) == []
    assert findings.machine(make_system()) == []  # no shm figures


def test_stale_or_ended_sources_are_not_judged():
    low = dict(fds=1000, fd_limit=1024)
    assert kinds(detect_resources(source(**readings(**low)), make_system())) == ["fd_low"]
    stale = source(**readings(**low, age_s=_common.READINGS_STALE_S + 1))
    assert detect_resources(stale, make_system()) == []
    for state in ("finished", "gone"):
        assert detect_resources(source(**readings(**low), state=state), make_system()) == []


# ---------------------------------------------------------------------------------------------
# copy_on_read
# ---------------------------------------------------------------------------------------------

def cow_worker(i: int, uss_growth: float = 200 * MIB, rss_growth: float = 0.0,
               **trend_kw: Any) -> dict[str, Any]:
    return slow_worker(i, uss_bytes=int(60 * MIB + uss_growth),
                       uss_trend=trend(60 * MIB, 60 * MIB + uss_growth, **trend_kw),
                       rss_trend=trend(900 * MIB, 900 * MIB + rss_growth,
                                       rising=0.3 if rss_growth else 0.0))


def test_copy_on_read_uss_grows_while_rss_stays_flat():
    found = detect_resources(source([cow_worker(0), cow_worker(1), slow_worker(2)]), make_system())
    assert kinds(found) == ["copy_on_read"]
    f = found[0]
    assert_readable(f)
    assert f.worker is None and "workers 0, 1" in f.summary
    assert "numpy" in f.advice[0] and "pytorch#13246" in f.advice[0]
    assert any("worker 0 USS 60 MiB → 260 MiB" in line for line in f.evidence), f.evidence


def test_copy_on_read_names_the_one_worker():
    found = detect_resources(source([cow_worker(0), slow_worker(1)]), make_system())
    assert [(f.kind, f.worker) for f in found] == [("copy_on_read", 0)]


def test_copy_on_read_thresholds():
    def cow(**kw: Any) -> bool:
        return copy_on_read.copies_on_read(msgspec.convert(cow_worker(0, **kw), WorkerFigures))

    at = copy_on_read.COW_MIN_GROWTH_BYTES
    assert cow(uss_growth=at) and not cow(uss_growth=at - MIB)
    # RSS "flat": at most a quarter of the USS growth; above it, memory is really added
    assert cow(uss_growth=100 * MIB, rss_growth=25 * MIB)
    assert not cow(uss_growth=100 * MIB, rss_growth=26 * MIB)
    # steadily: enough readings, rising in most of them
    assert not cow(samples=_trends.TREND_MIN_SAMPLES - 1) and cow(samples=_trends.TREND_MIN_SAMPLES)
    assert not cow(rising=_trends.RISING_SHARE_MIN - 0.01) and cow(rising=_trends.RISING_SHARE_MIN)
    # no RSS trend: no contrast to judge by
    w = msgspec.convert(slow_worker(0, uss_trend=trend(0, GIB), rss_trend=None), WorkerFigures)
    assert not copy_on_read.copies_on_read(w)


def test_a_dead_worker_is_not_judged():
    dead = {**cow_worker(0), "alive": False, "exitcode": -9}
    assert detect_resources(source([dead]), make_system()) == []


def test_the_main_process_uss_rising_back_is_not_copy_on_read():
    """After fork the main process's pages are shared; as workers copy them they become the
    main's own again: its USS rises with a flat RSS. Not a finding (nor memory growth)."""
    s = source(**readings(uss_trend=trend(200 * MIB, 2 * GIB), rss_trend=trend(2 * GIB, 2 * GIB,
                                                                                rising=0.0)))
    assert detect_resources(s, make_system()) == []


# ---------------------------------------------------------------------------------------------
# memory_growth
# ---------------------------------------------------------------------------------------------

def test_memory_growth_of_the_training_process():
    s = source(**readings(rss_trend=trend(2 * GIB, 3 * GIB, over_s=600, samples=120, rising=0.8)))
    found = detect_resources(s, make_system())
    assert kinds(found) == ["memory_growth"]
    f = found[0]
    assert_readable(f)
    assert f.worker is None and "training process" in f.summary
    assert any("loss.item()" in line for line in f.advice)
    assert any("+102 MiB/min" in line for line in f.evidence), f.evidence


def test_memory_growth_of_one_worker():
    w = slow_worker(2, rss_trend=trend(500 * MIB, 800 * MIB, over_s=300, samples=60))
    found = detect_resources(source([slow_worker(0), w]), make_system())
    assert [(f.kind, f.worker) for f in found] == [("memory_growth", 2)]
    assert any("lru_cache" in line for line in found[0].advice)


def test_memory_growth_thresholds():
    def grows(first: float, last: float, **kw: Any) -> bool:
        kw.setdefault("over_s", 300.0)
        return memory_growth.grows(msgspec.convert(trend(first, last, **kw), MemoryTrend))

    assert grows(500 * MIB, 500 * MIB + memory_growth.GROWTH_MIN_BYTES)
    assert not grows(500 * MIB, 500 * MIB + memory_growth.GROWTH_MIN_BYTES - MIB)
    # relative: a big process must grow by a tenth of itself
    assert not grows(10 * GIB, 10 * GIB + 900 * MIB) and grows(10 * GIB, 11 * GIB)
    # over minutes, not seconds
    assert not grows(GIB, 2 * GIB, over_s=memory_growth.GROWTH_MIN_S - 1)
    assert grows(GIB, 2 * GIB, over_s=memory_growth.GROWTH_MIN_S)
    # steadily
    assert not grows(GIB, 2 * GIB, rising=0.5)
    assert not grows(2 * GIB, GIB)


# ---------------------------------------------------------------------------------------------
# fd_low
# ---------------------------------------------------------------------------------------------

def test_fd_low_at_the_threshold_and_not_below():
    limit = 250
    at = int(fd_low.FD_USED_SHARE * limit)  # 200
    found = detect_resources(source(**readings(fds=at, fd_limit=limit)), make_system())
    assert kinds(found) == ["fd_low"]
    f = found[0]
    assert_readable(f)
    assert f.evidence[0] == "training process: fds 200 of limit 250 (threshold 80 %)"
    assert "set_sharing_strategy('file_system')" in f.advice[0]
    assert any("ulimit -n" in line for line in f.advice)
    assert detect_resources(source(**readings(fds=at - 1, fd_limit=limit)), make_system()) == []


def test_fd_low_in_a_worker_uses_the_inherited_limit():
    s = source([slow_worker(0), slow_worker(1, fds=900)], **readings(fd_limit=1024))
    found = detect_resources(s, make_system())
    assert [(f.kind, f.worker) for f in found] == [("fd_low", 1)]
    assert "worker 1 is close" in found[0].summary


def test_fd_low_needs_a_limit():
    assert detect_resources(source(**readings(fds=10**6, fd_limit=None)), make_system()) == []


# ---------------------------------------------------------------------------------------------
# threads_oversubscribed
# ---------------------------------------------------------------------------------------------

def test_threads_oversubscribed_by_pools_in_every_worker():
    # 4 workers, each its own 6 threads plus an 8-thread pool, on 8 cores: 36 computing threads
    s = source([slow_worker(i, threads=threads_oversubscribed.WORKER_OWN_THREADS + 8) for i in range(4)])
    found = detect_resources(s, make_system())
    assert kinds(found) == ["threads_oversubscribed"]
    f = found[0]
    assert_readable(f)
    assert "36 computing threads on 8 cores" in f.summary
    assert "cv2.setNumThreads(0)" in f.advice[0] and "OMP_NUM_THREADS=1" in f.advice[0]


def test_threads_thresholds():
    def found(threads: int, workers: int = 4, cores: float = 8.0) -> bool:
        s = source([slow_worker(i, threads=threads) for i in range(workers)])
        return kinds(detect_resources(s, make_system(cores_available=cores))) == ["threads_oversubscribed"]

    own = threads_oversubscribed.WORKER_OWN_THREADS
    # many plain workers are not oversubscribed by threads: no pool anywhere
    assert not found(own, workers=64, cores=2.0)
    # a pool below POOL_MIN_THREADS does not count
    assert not found(own + threads_oversubscribed.POOL_MIN_THREADS - 1, workers=16, cores=2.0)
    # 4 workers × (1 + 3) = 16 computing threads: 2 per core on 8 cores, not on 9
    assert found(own + 3, workers=4, cores=8.0)
    assert not found(own + 3, workers=4, cores=8.5)
    # no cores figure: no judgement
    s = source([slow_worker(i, threads=100) for i in range(4)])
    assert detect_resources(s, make_system(cores_available=None)) == []


# ---------------------------------------------------------------------------------------------
# shm_low
# ---------------------------------------------------------------------------------------------

def shm_system(total: int, free: int):
    return msgspec.structs.replace(make_system(), shm=ShmFigures(path="/dev/shm",
                                                                 total_bytes=total,
                                                                 free_bytes=free))


def test_shm_low_below_a_tenth_free():
    found = findings.machine(shm_system(8 * GIB, 800 * MIB))
    assert kinds(found) == ["shm_low"]
    f = found[0]
    assert_readable(f)
    assert f.source is None and f.worker is None
    assert "--shm-size" in f.advice[0]
    assert findings.machine(shm_system(8 * GIB, 820 * MIB)) == []  # 10.0 %: not low


def test_shm_low_below_the_absolute_floor():
    # Docker's default 64 MiB, half used: 32 MiB is the floor
    assert findings.machine(shm_system(64 * MIB, 32 * MIB)) == []
    assert kinds(findings.machine(shm_system(64 * MIB, 32 * MIB - 1))) == ["shm_low"]
    assert findings.machine(shm_system(0, 0)) == []


# ---------------------------------------------------------------------------------------------
# the trends (viewer.resources)
# ---------------------------------------------------------------------------------------------

def report(at: float, rss: int | None = GIB, uss: int | None = GIB,
           workers: list[wire.WorkerResources] | None = None, **kw: Any) -> wire.ResourceReport:
    return wire.ResourceReport(sampled_at=at, rss_bytes=rss, uss_bytes=uss, fds=kw.get("fds", 30),
                               fd_limit=kw.get("fd_limit", 1024), threads=kw.get("threads", 8),
                               workers=workers or [])


def wres(wid: int, pid: int, uss: int | None, rss: int | None = 900 * MIB,
         **kw: Any) -> wire.WorkerResources:
    return wire.WorkerResources(id=wid, pid=pid, uss_bytes=uss, pss_bytes=kw.get("pss", uss),
                                rss_bytes=rss, fds=kw.get("fds", 20), threads=kw.get("threads", 5))


def test_trend_is_least_squares_over_the_samples_after_warm_up():
    points = [(T0 + 5 * i, 1000 * i) for i in range(20)]  # +200 B/s, every reading rising
    t = memory_trend(points, T0)
    assert t is not None
    # warm-up: the first WARMUP_SAMPLES and the first half of the 95 s watched
    assert t.samples == 10 and t.first_bytes == 10000 and t.last_bytes == 19000
    assert t.over_s == 45.0 and t.slope_bytes_per_s == pytest.approx(200.0)
    assert t.rising_share == 1.0
    assert memory_trend(points[:2], T0) is None  # nothing left after the warm-up
    assert memory_trend([], T0) is None


def test_a_cache_filling_at_the_start_drops_out_of_the_trend():
    """Memory that rises for two minutes and then stays (a cache filled) is a rising trend only
    while the rise makes up the later half of what was watched; a leak stays one."""
    cache = [(T0 + 5 * i, GIB + min(i, 24) * 20 * MIB) for i in range(200)]  # 2 min up, then flat
    early = memory_trend(cache[:30], T0)
    late = memory_trend(cache, T0)
    assert early is not None and late is not None
    assert late.slope_bytes_per_s == 0 and late.rising_share == 0
    assert not memory_growth.grows(late)
    leak = [(T0 + 5 * i, GIB + i * 2 * MIB) for i in range(200)]
    assert memory_growth.grows(memory_trend(leak, T0))


def test_warm_up_excludes_the_start_up_jump():
    # the first readings jump (imports, the first batches), then stay flat: no trend of growth
    start = [(T0, 100 * MIB), (T0 + 5, 400 * MIB)]
    flat = [(T0 + 5 * i, 400 * MIB) for i in range(2, 12)]
    t = memory_trend(start + flat, T0)
    assert t is not None and t.slope_bytes_per_s == 0 and t.first_bytes == 400 * MIB


def test_history_builds_process_and_worker_figures():
    h = ResourceHistory()
    for i in range(12):
        h.add(report(T0 + 5 * i, rss=GIB, uss=GIB + i * MIB,
                     workers=[wres(0, 700, 60 * MIB + i * 10 * MIB), wres(1, 701, 60 * MIB)]),
              received_at=T0 + 5 * i + 0.01)
    p = h.process(now=T0 + 57)
    assert p.rss_bytes == GIB and p.fds == 30 and p.fd_limit == 1024 and p.threads == 8
    assert p.uss_bytes == GIB + 11 * MIB
    assert p.age_s == pytest.approx(2.0, abs=0.02)
    assert p.rss_trend is not None and p.rss_trend.slope_bytes_per_s == 0
    assert p.uss_trend is not None and p.uss_trend.slope_bytes_per_s == pytest.approx(MIB / 5)
    w0 = h.worker(0, 700)
    assert w0.uss_bytes == 170 * MIB and w0.fds == 20 and w0.threads == 5
    assert w0.uss_trend is not None and w0.uss_trend.rising_share == 1.0
    assert w0.rss_trend is not None and w0.rss_trend.rising_share == 0.0
    assert h.worker(1, 701).uss_trend.slope_bytes_per_s == 0  # type: ignore[union-attr]
    assert h.worker(0, None) == w0  # pid unknown: that worker id's newest process
    assert h.worker(5, 705) == vr.NO_WORKER_RESOURCES


def test_a_new_pid_is_a_new_process_with_a_fresh_history():
    h = ResourceHistory()
    for i in range(10):
        h.add(report(T0 + 5 * i, workers=[wres(0, 700, 60 * MIB + i * 10 * MIB)]), T0 + 5 * i)
    for i in range(10, 13):  # worker 0 re-created (a new epoch without persistent workers)
        h.add(report(T0 + 5 * i, workers=[wres(0, 800, 60 * MIB)]), T0 + 5 * i)
    assert h.worker(0, 800).uss_trend is None  # 3 readings: all warm-up or too few
    assert h.worker(0, 700).uss_trend is not None  # the ended one is still answerable
    # ... until it has not been seen for ENDED_KEEP_S
    h.add(report(T0 + 65 + vr.ENDED_KEEP_S, workers=[wres(0, 800, 60 * MIB)]),
          T0 + 65 + vr.ENDED_KEEP_S)
    assert h.worker(0, 700) == vr.NO_WORKER_RESOURCES


def test_uss_not_read_every_round_keeps_the_last_known_figures():
    h = ResourceHistory()
    h.add(report(T0, uss=GIB, workers=[wres(0, 700, 70 * MIB, pss=90 * MIB)]), T0)
    h.add(report(T0 + 5, uss=None, workers=[wres(0, 700, None, fds=25)]), T0 + 5)
    assert h.process(T0 + 5).uss_bytes == GIB
    w = h.worker(0, 700)
    assert (w.uss_bytes, w.pss_bytes, w.fds) == (70 * MIB, 90 * MIB, 25)


def test_history_is_bounded_against_a_flooding_sender():
    h = ResourceHistory()
    for i in range(5000):  # every 0.1 s: faster than any probe samples
        h.add(report(T0 + i / 10), T0 + i / 10)
    assert h.main is not None and len(h.main.samples) <= 5000 / 10 / vr.MIN_GAP_S + 1
    h2 = ResourceHistory()
    for i in range(vr.MAX_SAMPLES + 50):
        h2.add(report(T0 + i), T0 + i)
    assert h2.main is not None and len(h2.main.samples) == vr.MAX_SAMPLES
    h3 = ResourceHistory()
    for i in range(vr.MAX_PROCESSES + 40):  # a new pid every sample
        h3.add(report(T0 + i, workers=[wres(0, 1000 + i, MIB)]), T0 + i)
    assert len(h3.workers) <= vr.MAX_PROCESSES


def test_history_drops_samples_older_than_history_s():
    h = ResourceHistory()
    step = vr.HISTORY_S / (vr.MAX_SAMPLES / 2)
    for i in range(vr.MAX_SAMPLES):
        h.add(report(T0 + i * step), T0 + i * step)
    assert h.main is not None
    assert h.main.samples[-1][0] - h.main.samples[0][0] <= vr.HISTORY_S


# ---------------------------------------------------------------------------------------------
# the probe's side: the sampler, /dev/shm
# ---------------------------------------------------------------------------------------------

def test_sampler_reads_this_process_and_a_child(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        wait = time.monotonic() + 10
        s = pr.ResourceSampler(uss_cpu_share=0.0, main_uss_s=0.0)
        r = s.sample([(0, child.pid), (1, 2**22 + 12345)])  # the second pid does not exist
        while r.workers[0].threads is None and time.monotonic() < wait:
            r = s.sample([(0, child.pid)])
        assert r.rss_bytes and r.uss_bytes and r.fds and r.threads
        assert r.fd_limit is None or r.fd_limit > 0
        w0 = r.workers[0]
        assert (w0.id, w0.pid) == (0, child.pid)
        assert w0.rss_bytes and w0.uss_bytes and w0.pss_bytes and w0.fds and w0.threads == 1
        if len(r.workers) > 1:
            w1 = r.workers[1]
            assert (w1.uss_bytes, w1.rss_bytes, w1.fds, w1.threads) == (None,) * 4
        files = [open(os.devnull) for _ in range(20)]
        try:
            time.sleep(pr.ROUND_S + 0.01)  # a new round (the main process is read once a round)
            assert (s.sample([]).fds or 0) >= r.fds + 20
        finally:
            for f in files:
                f.close()
    finally:
        child.kill()
        child.wait()
    r = s.sample([(0, child.pid)])  # reaped: gone, no figures, no exception
    assert r.workers[0].rss_bytes is None


def costly_uss_sampler(share: float) -> tuple[pr.ResourceSampler, list[float]]:
    """A sampler whose every USS read "costs" 20 ms of its thread's CPU; set [0] for the time."""
    now = [100.0]
    cpu = [0.0]

    def cpu_clock() -> float:
        cpu[0] += 0.02
        return cpu[0]

    return pr.ResourceSampler(uss_cpu_share=share, interval_s=5.0, main_uss_s=0.0,
                              clock=lambda: now[0], cpu_clock=cpu_clock), now


def test_sampler_keeps_uss_within_its_cpu_share():
    s, now = costly_uss_sampler(0.002)
    assert s.sample([]).uss_bytes is not None
    assert s.sample([]).uss_bytes is not None  # the same round (another loader's call): too
    seen = []
    for i in range(1, 41):
        now[0] = 100.0 + 5 * i
        r = s.sample([])
        assert r.rss_bytes is not None and r.fds is not None  # the cheap figures every round
        seen.append(r.uss_bytes is not None)
    # 20 ms a round at 0.2 % of a core: a full round every 10 s, every other one of 5 s
    assert seen == [False, True] * 20


def test_the_main_process_uss_is_read_once_a_minute():
    now = [100.0]
    s = pr.ResourceSampler(uss_cpu_share=0.0, interval_s=5.0, main_uss_s=60.0,
                           clock=lambda: now[0])
    seen = []
    for i in range(25):
        now[0] = 100.0 + 5 * i
        seen.append(s.sample([]).uss_bytes is not None)
    assert seen == ([True] + [False] * 11) * 2 + [True]


def test_sampler_never_raises():
    s = pr.ResourceSampler()
    r = s.sample([(0, -5), (1, 0), (2, os.getpid())])  # nonsense pids are skipped
    assert r.workers == [] and r.sampled_at > 0


def test_resource_interval_override_is_read_at_import():
    code = ("from loadertop.probe import resources as r; "
            "print(r.RESOURCE_S, r.USS_CPU_SHARE)")
    env = {**os.environ, environment.LOADERTOP_RESOURCE_S: "1.5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["1.5", "0.0"]
    env[environment.LOADERTOP_RESOURCE_S] = "nonsense"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["5.0", str(pr.USS_CPU_SHARE)]


def test_shm_figures_by_statvfs(tmp_path):
    doc = shm_figures(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert doc["shm_path"] == str(tmp_path)
    assert doc["shm_total_bytes"] == st.f_blocks * st.f_frsize
    assert 0 <= doc["shm_free_bytes"] <= doc["shm_total_bytes"]
    missing = shm_figures(str(tmp_path / "nope"))
    assert missing == {"shm_path": str(tmp_path / "nope"), "shm_total_bytes": None,
                       "shm_free_bytes": None}


def test_system_feed_sends_shm_from_the_environment(tmp_path, monkeypatch):
    from loadertop.probe.system_feed import SystemFeed

    monkeypatch.setenv(environment.LOADERTOP_SHM_PATH, str(tmp_path))
    feed = SystemFeed("h")
    try:
        msg = feed.report()
    finally:
        feed.sampler.close()
    assert msg is not None and msg.shm_path == str(tmp_path)
    assert msg.shm_total_bytes is not None and msg.shm_total_bytes > 0
    assert wire.decode(wire.encode(msg)) == msg


def test_with_the_black_box_uss_is_read_at_its_larger_share(tmp_path, monkeypatch):
    # The black box's history is what a late viewer's copy-on-read trend is made of (issue 39):
    # its process reads USS at USS_CPU_SHARE_RECORDED, the one with it off at USS_CPU_SHARE.
    from loadertop import statedir
    from loadertop.probe.publisher import Publisher

    monkeypatch.setenv(statedir.LOADERTOP_STATE_DIR, str(tmp_path / "state"))
    monkeypatch.setenv(statedir.LOADERTOP_BLACKBOX, "0")
    off = Publisher(directory=str(tmp_path / "d"))
    off._start_blackbox()
    assert off.blackbox is None and off._resources._share == pr.USS_CPU_SHARE
    monkeypatch.delenv(statedir.LOADERTOP_BLACKBOX)
    on = Publisher(directory=str(tmp_path / "d"))
    on._start_blackbox()
    try:
        assert on.blackbox is not None
        assert on._resources._share == pr.USS_CPU_SHARE_RECORDED > pr.USS_CPU_SHARE
    finally:
        on.blackbox.finish(statedir.Ended(kind="finished", at=0.0), wait_s=5.0)

    s, now = costly_uss_sampler(0.0005)
    s.set_cpu_share(0.002)
    seen = []
    for i in range(0, 8):
        now[0] = 100.0 + 5 * i
        seen.append(s.sample([]).uss_bytes is not None)
    # at 0.2 % of a core, not 0.05 %: a full round every 10 s, not every 40 s
    assert seen == [True, False] * 4
