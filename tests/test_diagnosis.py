"""Unit tests of loadertop.diagnosis: every rule, every boundary, None-robustness, hysteresis."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadertop import diagnosis as d
from loadertop.diagnosis import VerdictStabilizer, diagnose, overall, stall_threshold_ms

GIB = 1024**3
MIB = 1024**2


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------

def stats(p50: float, *, mean=None, p95=None, p99=None, max_=None) -> dict:
    return {"mean": p50 if mean is None else mean, "p50": p50,
            "p95": p50 if p95 is None else p95, "p99": p50 if p99 is None else p99,
            "max": p50 if max_ is None else max_}


def worker(i: int = 0, **overrides) -> dict:
    w = {"id": i, "pid": 2000 + i, "alive": True, "exitcode": None, "cpu_percent": 95.0,
         "rss_bytes": 500 * MIB, "batches": 30, "fetch_ms": stats(80.0, p95=90.0, p99=100.0),
         "cpu_fraction": 0.95}
    w.update(overrides)
    return w


def _merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and value:
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def make_source(**overrides) -> dict:
    """A complete, healthy (compute-bound) source; nested dicts are merged, lists replaced."""
    base = {
        "id": "h:1234:train", "host": "h", "pid": 1234, "rank": None, "name": "train",
        "state": "running",
        "config": {"num_workers": 4, "batch_size": 64, "prefetch_factor": 2, "pin_memory": False,
                   "persistent_workers": False, "dataset": "DS", "worker_context": "fork"},
        "batches": 120, "batches_total": 5400, "batches_per_s": 40.0, "samples_per_s": 2560.0,
        "wait_ms": stats(0.2, mean=1.0, p95=3.1, p99=9.0, max_=12.0),
        "step_ms": stats(24.0, p95=26.0, p99=30.0, max_=31.0),
        "wait_fraction": 0.04,
        "queue": {"ready": 6, "in_flight": 2, "capacity": 8, "ready_mean": 6.0,
                  "in_flight_mean": 2.0, "ready_when_waiting": 0.1},
        "workers": [worker(i) for i in range(4)],
        "blocked_ms": None,
        "loop": {"fetch_ms": None, "cpu_fraction": None},
    }
    return _merge(base, overrides)


def make_system(**overrides) -> dict:
    base = {
        "cpu_count": 8, "cores_available": 8.0, "cpu_percent": 40.0,
        "per_cpu_percent": [40.0] * 8, "iowait_percent": 0.5, "load_avg_1m": 3.0,
        "mem_total_bytes": 16 * GIB, "mem_available_bytes": 8 * GIB, "mem_used_percent": 50.0,
        "swap_total_bytes": 4 * GIB, "swap_used_bytes": 0, "swap_in_bytes_per_s": 0.0,
        "swap_out_bytes_per_s": 0.0, "disk_read_bytes_per_s": 0.0, "disk_write_bytes_per_s": 0.0,
        "cgroup": {"cpu_quota_cores": None, "mem_limit_bytes": None},
        "gpu_status": "no_nvml", "gpus": [],
    }
    return _merge(base, overrides)


def input_bound(**overrides) -> dict:
    """A source whose loop waits 60 % of the time on CPU-busy workers (1 core each)."""
    base = dict(wait_fraction=0.6, wait_ms=stats(30.0, p99=50.0),
                step_ms=stats(20.0, p95=22.0), queue={"ready_when_waiting": 0.05, "ready": 0})
    base.update(overrides)
    return make_source(**base)


def cat(source, system=None, previous=None) -> str:
    return diagnose(source, make_system() if system is None else system, previous)["category"]


def text(verdict: dict) -> str:
    return " | ".join([verdict["summary"], *verdict["evidence"], *verdict["advice"]])


# ---------------------------------------------------------------------------------------------
# shape, layering
# ---------------------------------------------------------------------------------------------

def test_verdict_shape_and_category_names():
    v = diagnose(make_source(), make_system())
    assert set(v) == {"category", "summary", "evidence", "advice"}
    assert v["category"] in d.CATEGORIES
    assert isinstance(v["summary"], str) and "\n" not in v["summary"]
    assert all(isinstance(x, str) for x in v["evidence"] + v["advice"])
    assert sorted(d.OVERALL_RANK) == sorted(d.CATEGORIES)


def test_module_imports_stdlib_only():
    tree = ast.parse(Path(d.__file__).read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= {"__future__", "math", "signal", "collections", "dataclasses", "typing"}


def test_thresholds_table_in_docs_matches_the_module():
    doc = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", doc, flags=re.M))
    numeric = {name for name, value in vars(d).items()
               if name.isupper() and not name.startswith("_") and isinstance(value, (int, float))}
    assert set(rows) == numeric
    for name, value in rows.items():
        assert ast.literal_eval(value) == getattr(d, name), name


def test_formatting_is_human_readable():
    assert d._pct(0.62) == "62 %"
    assert d._pct(0.075) == "7.5 %"
    assert d._pct(0.10) == "10 %"
    assert d._ms(0.45) == "0.45 ms"
    assert d._ms(12.34) == "12 ms"
    assert d._ms(2500) == "2.5 s"
    assert d._bytes(3.1 * GIB) == "3.1 GiB"
    assert d._bytes(512 * MIB) == "512 MiB"


# ---------------------------------------------------------------------------------------------
# compute_bound / wait-fraction boundary and its margin
# ---------------------------------------------------------------------------------------------

def test_compute_bound_healthy():
    v = diagnose(make_source(), make_system())
    assert v["category"] == "compute_bound"
    assert "wait fraction 4 % (threshold 10 %)" in v["evidence"]
    assert "nothing to fix in loading" in v["advice"]


@pytest.mark.parametrize("wf, expected", [
    (0.0999, "compute_bound"), (0.10, "input_bound_cpu"), (0.1001, "input_bound_cpu")])
def test_wait_fraction_boundary(wf, expected):
    assert cat(input_bound(wait_fraction=wf)) == expected


@pytest.mark.parametrize("previous, wf, expected", [
    ("input_bound_cpu", 0.08, "input_bound_cpu"),   # inside the band: stays input-bound
    ("input_bound_cpu", 0.07, "input_bound_cpu"),   # at the leave threshold: stays
    ("input_bound_cpu", 0.0699, "compute_bound"),   # below it: leaves
    ("cpu_saturated", 0.08, "input_bound_cpu"),     # any input-bound category uses the margin
    ("compute_bound", 0.09, "compute_bound"),       # inside the band: stays compute-bound
    ("compute_bound", 0.10, "input_bound_cpu"),
    (None, 0.08, "compute_bound"),
])
def test_wait_fraction_margin(previous, wf, expected):
    assert cat(input_bound(wait_fraction=wf), previous=previous) == expected


def test_wait_fraction_derived_from_means_when_missing():
    src = input_bound(wait_fraction=None, wait_ms=stats(30.0), step_ms=stats(20.0))
    assert cat(src) == "input_bound_cpu"
    src = make_source(wait_fraction=None, wait_ms=stats(1.0), step_ms=stats(99.0))
    assert cat(src) == "compute_bound"
    src = make_source(wait_fraction=None, wait_ms=None, step_ms=None)
    assert cat(src) == "insufficient_data"


@pytest.mark.parametrize("util, idle", [(69.9, True), (70.0, False), (95.0, False)])
def test_compute_bound_gpu_underused(util, idle):
    system = make_system(gpu_status="ok", gpus=[{"index": 0, "name": "H100", "util_percent": util,
                                                 "processes": [{"pid": 1234, "used_mem_bytes": 1}]}])
    v = diagnose(make_source(), system)
    assert v["category"] == "compute_bound"
    assert any("GPU 0 util" in e for e in v["evidence"])
    assert ("step itself leaves" in text(v)) is idle


def test_gpu_chosen_by_pid_among_several():
    gpus = [{"index": 0, "util_percent": 99.0, "processes": [{"pid": 1, "used_mem_bytes": 1}]},
            {"index": 1, "util_percent": 20.0, "processes": [{"pid": 1234, "used_mem_bytes": 1}]}]
    v = diagnose(make_source(), make_system(gpu_status="ok", gpus=gpus))
    assert "GPU 1" in v["summary"] and "GPU 0" not in text(v)
    # several GPUs, none of them ours: no claim about any
    v = diagnose(make_source(pid=999), make_system(gpu_status="ok", gpus=gpus))
    assert "GPU" not in text(v)
    # NVML missing: nothing about GPUs
    v = diagnose(make_source(), make_system(gpu_status="no_nvml", gpus=gpus[:1]))
    assert "GPU" not in text(v)


# ---------------------------------------------------------------------------------------------
# idle / insufficient_data
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batches, expected", [
    (4, "insufficient_data"), (5, "compute_bound"), (6, "compute_bound")])
def test_min_batches_boundary(batches, expected):
    assert cat(make_source(batches=batches)) == expected


def test_slow_steps_are_judged_with_few_batches():
    slow = dict(wait_fraction=0.5, wait_ms=stats(1500.0), step_ms=stats(1500.0))
    assert cat(input_bound(batches=2, **slow)) == "input_bound_cpu"   # 2 x 3 s covered
    assert cat(input_bound(batches=1, **slow)) == "insufficient_data"
    quick = dict(wait_fraction=0.5, wait_ms=stats(100.0), step_ms=stats(100.0))
    assert cat(input_bound(batches=4, **quick)) == "insufficient_data"  # 0.8 s covered


def test_idle_when_no_batches_and_not_blocked():
    v = diagnose(make_source(batches=0, blocked_ms=None, state="idle"), make_system())
    assert v["category"] == "idle"
    assert cat(make_source(batches=0, blocked_ms=None, state="running")) == "idle"
    assert cat(make_source(batches=0, state="finished")) == "idle"
    assert cat(make_source(batches=0, state="gone", blocked_ms=100.0)) == "idle"


def test_waiting_for_first_batch_is_insufficient_data():
    v = diagnose(make_source(batches=0, blocked_ms=800.0, state="waiting"), make_system())
    assert v["category"] == "insufficient_data"
    assert "800 ms" in v["summary"]


# ---------------------------------------------------------------------------------------------
# stalled
# ---------------------------------------------------------------------------------------------

def test_dead_worker_sigkill_names_oom_killer():
    src = make_source(workers=[worker(0), worker(1, alive=False, exitcode=-9)])
    v = diagnose(src, make_system())
    assert v["category"] == "stalled"
    assert "worker 1" in v["summary"] and "SIGKILL" in v["summary"] and "OOM" in v["summary"]
    assert "worker 1 (pid 2001) killed by SIGKILL (signal 9)" in v["evidence"]
    assert any("dmesg" in a for a in v["advice"])


@pytest.mark.parametrize("exitcode, phrase", [
    (1, "exited with code 1"), (None, "exit status unknown"), (-7, "SIGBUS"), (-11, "SIGSEGV")])
def test_dead_worker_other_exits(exitcode, phrase):
    v = diagnose(make_source(workers=[worker(0, alive=False, exitcode=exitcode)]), make_system())
    assert v["category"] == "stalled"
    assert phrase in v["summary"]
    if exitcode == -7:
        assert any("/dev/shm" in a for a in v["advice"])


def test_worker_exiting_normally_or_at_shutdown_is_not_a_stall():
    assert cat(make_source(workers=[worker(0, alive=False, exitcode=0)])) == "compute_bound"
    for state in ("finished", "idle", "gone"):
        src = make_source(state=state, workers=[worker(0, alive=False, exitcode=-15)])
        assert cat(src) != "stalled"
    # alive unknown is no evidence
    assert cat(make_source(workers=[worker(0, alive=None, exitcode=None)])) == "compute_bound"


def test_several_dead_workers_all_named():
    src = make_source(workers=[worker(0, alive=False, exitcode=-9), worker(1, alive=False, exitcode=-9)])
    v = diagnose(src, make_system())
    assert "2 workers dead" in v["summary"]
    assert len([e for e in v["evidence"] if "SIGKILL" in e]) == 2
    assert len(v["advice"]) == len(set(v["advice"]))


@pytest.mark.parametrize("p99, blocked, stalled", [
    (9.0, 4999.0, False), (9.0, 5000.0, True), (9.0, 5001.0, True),           # floor STALL_MIN_MS
    (1000.0, 9999.0, False), (1000.0, 10000.0, True), (1000.0, 10001.0, True),  # 10 x p99
])
def test_blocked_stall_boundary(p99, blocked, stalled):
    src = make_source(blocked_ms=blocked, state="waiting", wait_ms={"p99": p99})
    v = diagnose(src, make_system())
    assert (v["category"] == "stalled") is stalled
    if stalled:
        assert any("py-spy dump --pid 2000" in a for a in v["advice"])
        assert any("py-spy dump --pid 1234" in a for a in v["advice"])


def test_stall_threshold_without_history():
    fresh = make_source(batches=0, batches_total=0, wait_ms=None, blocked_ms=20000.0)
    assert stall_threshold_ms(fresh) == d.STALL_NO_HISTORY_MS
    assert cat(fresh) == "insufficient_data"
    assert cat(make_source(batches=0, batches_total=0, wait_ms=None, blocked_ms=30000.0)) == "stalled"
    # had batches before, window now empty (a hang after steady training): the floor applies
    hung = make_source(batches=0, batches_total=500, wait_ms=None, blocked_ms=5000.0)
    assert stall_threshold_ms(hung) == d.STALL_MIN_MS
    assert cat(hung) == "stalled"


def test_stall_with_ready_batches_points_at_main_process():
    src = make_source(blocked_ms=60000.0, queue={"ready": 3, "in_flight": 1})
    v = diagnose(src, make_system())
    assert "3 ready" in text(v) and "main process is stuck" in text(v)


# ---------------------------------------------------------------------------------------------
# memory_pressure
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction, pressure", [(0.0499, True), (0.05, False), (0.0501, False)])
def test_memory_available_boundary(fraction, pressure):
    system = make_system(mem_available_bytes=fraction * 16 * GIB)
    assert (cat(make_source(), system) == "memory_pressure") is pressure


@pytest.mark.parametrize("fraction, previous, pressure", [
    (0.06, "memory_pressure", True), (0.0699, "memory_pressure", True),
    (0.07, "memory_pressure", False), (0.06, "compute_bound", False)])
def test_memory_margin(fraction, previous, pressure):
    system = make_system(mem_available_bytes=fraction * 16 * GIB)
    assert (cat(make_source(), system, previous) == "memory_pressure") is pressure


@pytest.mark.parametrize("swap_in, pressure", [(MIB - 1, False), (MIB, True), (MIB + 1, True)])
def test_swap_in_boundary(swap_in, pressure):
    system = make_system(swap_in_bytes_per_s=swap_in)
    assert (cat(make_source(), system) == "memory_pressure") is pressure


def test_swap_out_alone_counts_only_with_little_available():
    plenty = make_system(swap_out_bytes_per_s=20 * MIB)             # 50 % available
    assert cat(make_source(), plenty) == "compute_bound"
    scarce = make_system(swap_out_bytes_per_s=20 * MIB, mem_available_bytes=0.08 * 16 * GIB)
    v = diagnose(make_source(), scarce)
    assert v["category"] == "memory_pressure" and "swapping" in v["summary"]


def test_memory_advice_names_worker_rss_and_numbers():
    src = input_bound(workers=[worker(i, rss_bytes=0.775 * GIB) for i in range(4)])
    v = diagnose(src, make_system(mem_available_bytes=0.5 * GIB))
    assert v["category"] == "memory_pressure"
    assert any(e.startswith("4 workers use 3.1 GiB RSS") for e in v["evidence"])
    assert any("num_workers=2" in a for a in v["advice"])
    assert any("prefetch_factor=1" in a for a in v["advice"])
    assert any("batch_size=32" in a for a in v["advice"])


def test_memory_outranks_every_loading_category():
    system = make_system(mem_available_bytes=0.01 * 16 * GIB, cpu_percent=99.0)
    for src in (make_source(), input_bound(), input_bound(queue={"ready_when_waiting": 0.9}),
                make_source(batches=2)):
        assert cat(src, system) == "memory_pressure"


def test_dead_worker_under_memory_pressure_is_stalled_with_memory_evidence():
    src = make_source(workers=[worker(0, alive=False, exitcode=-9)])
    v = diagnose(src, make_system(mem_available_bytes=0.01 * 16 * GIB))
    assert v["category"] == "stalled"
    assert any(e.startswith("memory available") for e in v["evidence"])
    assert any("prefetch_factor=1" in a for a in v["advice"])


# ---------------------------------------------------------------------------------------------
# main_process_bound
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rww, previous, expected", [
    (0.49, None, "input_bound_cpu"), (0.5, None, "main_process_bound"),
    (0.51, None, "main_process_bound"),
    (0.45, "main_process_bound", "main_process_bound"), (0.4, "main_process_bound", "main_process_bound"),
    (0.39, "main_process_bound", "input_bound_cpu")])
def test_ready_when_waiting_boundary_and_margin(rww, previous, expected):
    assert cat(input_bound(queue={"ready_when_waiting": rww}), previous=previous) == expected


@pytest.mark.parametrize("loop_cpu, expected", [
    (None, "main_process_bound"),   # no long waits measured: the ready samples decide
    (0.49, "input_bound_cpu"),      # the loop was blocked inside next(), not busy
    (0.5, "main_process_bound"), (0.95, "main_process_bound")])
def test_loop_cpu_while_waiting_vetoes_main_process_bound(loop_cpu, expected):
    src = input_bound(queue={"ready_when_waiting": 0.8, "loop_cpu_when_waiting": loop_cpu})
    assert cat(src) == expected


def test_blocked_loop_with_ready_batches_on_a_saturated_cpu_is_cpu_saturated():
    # 4 CPU-burning workers on 2 cores: out-of-order batches look "ready", the loop is starved.
    src = input_bound(queue={"ready_when_waiting": 0.7, "loop_cpu_when_waiting": 0.04})
    assert cat(src, make_system(cpu_count=2, cores_available=2.0, cpu_percent=99.0)) == "cpu_saturated"


def test_main_process_advice():
    src = input_bound(queue={"ready_when_waiting": 0.95}, batches_per_s=900.0,
                      config={"pin_memory": True, "batch_size": 8})
    v = diagnose(src, make_system())
    assert v["category"] == "main_process_bound"
    assert "ready in 95 %" in text(v)
    advice = text(v)
    assert "more workers will not help" in advice
    assert "pin_memory=False" in advice
    assert "batch_size=32" in advice


def test_main_process_bound_needs_workers():
    src = input_bound(config={"num_workers": 0}, workers=[], queue={"ready_when_waiting": 0.9},
                      loop={"fetch_ms": stats(30.0), "cpu_fraction": 0.9})
    assert cat(src) == "input_bound_cpu"


def test_main_process_bound_with_saturated_cpu_mentions_both():
    src = input_bound(queue={"ready_when_waiting": 0.9})
    v = diagnose(src, make_system(cpu_percent=99.0))
    assert v["category"] == "main_process_bound"
    assert "CPU is saturated too" in text(v)


# ---------------------------------------------------------------------------------------------
# cpu_saturated
# ---------------------------------------------------------------------------------------------

def light_workers(n=4):
    return [worker(i, cpu_percent=50.0) for i in range(n)]   # 0.5 core each


@pytest.mark.parametrize("busy, previous, expected", [
    (89.9, None, "input_bound_cpu"), (90.0, None, "cpu_saturated"), (90.1, None, "cpu_saturated"),
    (86.0, "cpu_saturated", "cpu_saturated"), (85.0, "cpu_saturated", "cpu_saturated"),
    (84.9, "cpu_saturated", "input_bound_cpu")])
def test_cpu_percent_boundary_and_margin(busy, previous, expected):
    src = input_bound(workers=light_workers())
    assert cat(src, make_system(cpu_percent=busy), previous) == expected


def test_cgroup_quota_saturated_by_own_workers():
    # 64-core host nearly idle, but the cgroup allows 4 cores and 4 workers use 3.8 of them
    system = make_system(cpu_count=64, cores_available=4.0, cpu_percent=6.0, load_avg_1m=4.0)
    v = diagnose(input_bound(), system)
    assert v["category"] == "cpu_saturated"
    assert "workers use 3.8 of 4 cores available (threshold 90 %)" in v["evidence"]
    assert any("cgroup allows 4 cores" in e for e in v["evidence"])
    # 3 workers use 2.85 cores of 4: not saturated
    assert cat(input_bound(workers=[worker(i) for i in range(3)]), system) == "input_bound_cpu"


def test_too_many_workers_for_the_cores():
    src = input_bound(config={"num_workers": 8}, workers=[worker(i, cpu_percent=50.0) for i in range(8)])
    v = diagnose(src, make_system(cpu_count=4, cores_available=4.0, cpu_percent=99.0))
    assert v["category"] == "cpu_saturated"
    assert any("try num_workers=3" in a for a in v["advice"])
    assert any("more workers will not help" in a for a in v["advice"])
    assert any("GPU" in a for a in v["advice"])


def test_load_average_only_when_cpu_percent_unknown():
    system = make_system(cpu_percent=None, load_avg_1m=8.0)
    assert cat(input_bound(workers=light_workers()), system) == "cpu_saturated"
    assert cat(input_bound(workers=light_workers()), make_system(cpu_percent=None, load_avg_1m=7.9)) \
        == "input_bound_cpu"
    # I/O-bound workers in D state inflate the load: not saturation
    io_workers = [worker(i, cpu_fraction=0.1, cpu_percent=10.0) for i in range(4)]
    assert cat(input_bound(workers=io_workers), system) == "input_bound_io"
    # with cpu_percent known, load alone does not decide
    assert cat(input_bound(workers=light_workers()), make_system(cpu_percent=50.0, load_avg_1m=20.0)) \
        == "input_bound_cpu"


def test_other_processes_taking_the_cpu_are_named():
    src = input_bound(workers=[worker(i, cpu_percent=20.0) for i in range(4)])
    v = diagnose(src, make_system(cpu_percent=97.0))
    assert v["category"] == "cpu_saturated"
    assert any("other processes" in e for e in v["evidence"])


# ---------------------------------------------------------------------------------------------
# input_bound_io vs input_bound_cpu
# ---------------------------------------------------------------------------------------------

def with_fraction(f: float, **overrides) -> dict:
    return input_bound(workers=[worker(i, cpu_fraction=f, cpu_percent=f * 100) for i in range(4)],
                       **overrides)


@pytest.mark.parametrize("fraction, previous, expected", [
    (0.49, None, "input_bound_io"), (0.5, None, "input_bound_cpu"), (0.51, None, "input_bound_cpu"),
    (0.54, "input_bound_io", "input_bound_io"), (0.55, "input_bound_io", "input_bound_cpu"),
    (0.46, "input_bound_cpu", "input_bound_cpu"), (0.45, "input_bound_cpu", "input_bound_cpu"),
    (0.449, "input_bound_cpu", "input_bound_io")])
def test_cpu_fraction_boundary_and_margin(fraction, previous, expected):
    assert cat(with_fraction(fraction), previous=previous) == expected


def test_io_evidence_and_advice():
    src = with_fraction(0.08)
    v = diagnose(src, make_system(iowait_percent=23.0, disk_read_bytes_per_s=120 * MIB))
    assert v["category"] == "input_bound_io"
    assert "worker cpu_fraction 0.08 (I/O-bound below 0.50)" in v["evidence"]
    assert "iowait 23 % (threshold 10 %)" in v["evidence"]
    assert "disk reads 120 MiB/s" in v["evidence"]
    assert any("cache" in a for a in v["advice"])


def test_io_worker_count_not_capped_by_cores_but_by_4x():
    # fetch 80 ms / step 20 ms = 4 workers needed; 2 cores: the CPU cap (1) does not apply to I/O
    src = input_bound(config={"num_workers": 1},
                      workers=[worker(0, cpu_fraction=0.05, cpu_percent=5.0)])
    v = diagnose(src, make_system(cpu_count=2, cores_available=2.0))
    assert v["category"] == "input_bound_io"
    assert any("try num_workers=4" in a for a in v["advice"])
    # fetch 1 s / step 10 ms = 100 needed; cap 4 x 2 cores = 8
    src = input_bound(config={"num_workers": 1}, step_ms=stats(10.0),
                      workers=[worker(0, cpu_fraction=0.05, fetch_ms=stats(1000.0))])
    v = diagnose(src, make_system(cpu_count=2, cores_available=2.0))
    assert any("try num_workers=8" in a for a in v["advice"])
    assert any("even 8 workers cannot keep up (100 needed)" in a for a in v["advice"])


def test_num_workers_zero_uses_loop_figures():
    base = dict(config={"num_workers": 0, "prefetch_factor": None}, workers=[],
                queue={"ready": None, "in_flight": None, "capacity": 0, "ready_when_waiting": None},
                step_ms=stats(10.0))
    cpu = input_bound(loop={"fetch_ms": stats(30.0), "cpu_fraction": 0.9}, **base)
    v = diagnose(cpu, make_system())
    assert v["category"] == "input_bound_cpu"
    assert any("use workers at all: try num_workers=3" in a for a in v["advice"])
    io = input_bound(loop={"fetch_ms": stats(30.0), "cpu_fraction": 0.2}, **base)
    v = diagnose(io, make_system())
    assert v["category"] == "input_bound_io"
    assert any("use workers at all: try num_workers=3" in a for a in v["advice"])


def test_cpu_advice_example_from_the_brief():
    # fetch 80 ms, step 20 ms, 1 worker, 8 free cores -> num_workers=4
    src = input_bound(config={"num_workers": 1}, workers=[worker(0)])
    v = diagnose(src, make_system(cpu_count=9, cores_available=9.0))
    assert v["category"] == "input_bound_cpu"
    assert "try num_workers=4 (fetch 80 ms per batch / step 20 ms = 4 workers)" in v["advice"]


def test_cpu_advice_capped_by_free_cores():
    src = input_bound(config={"num_workers": 2},
                      workers=[worker(i, fetch_ms=stats(200.0), cpu_percent=50.0) for i in range(2)])
    v = diagnose(src, make_system())       # 8 cores -> 7 for workers; 10 needed
    assert any("try num_workers=7" in a for a in v["advice"])
    assert any("even 7 workers cannot keep up (10 needed)" in a and "cheaper" in a for a in v["advice"])


def test_cpu_advice_no_free_cores():
    src = input_bound(config={"num_workers": 1}, workers=[worker(0, cpu_percent=50.0)])
    v = diagnose(src, make_system(cpu_count=2, cores_available=2.0, cpu_percent=50.0))
    assert v["category"] == "input_bound_cpu"
    assert any("no free cores" in a for a in v["advice"])
    assert any("cheaper" in a for a in v["advice"])


def test_cpu_advice_tail_and_bursts():
    # p50 needs 2 <= 4 workers, p95 needs 5: cover the tail
    tail = input_bound(workers=[worker(i, fetch_ms=stats(40.0, p95=100.0), cpu_percent=40.0)
                                for i in range(4)])
    assert any("try num_workers=5" in a and "p95" in a for a in diagnose(tail, make_system())["advice"])
    # both keep up: bursts -> more prefetch
    bursts = input_bound(workers=[worker(i, fetch_ms=stats(40.0, p95=60.0), cpu_percent=40.0)
                                  for i in range(4)])
    assert any("prefetch_factor=4" in a for a in diagnose(bursts, make_system())["advice"])


def test_negligible_step_advises_the_cap():
    src = input_bound(step_ms=stats(0.01), config={"num_workers": 2},
                      workers=[worker(i, cpu_percent=50.0) for i in range(2)])
    v = diagnose(src, make_system())
    assert any(a.startswith("try num_workers=7") for a in v["advice"])


def test_unknown_cores_gives_uncapped_advice():
    src = input_bound(config={"num_workers": 1}, workers=[worker(0)])
    v = diagnose(src, make_system(cpu_count=None, cores_available=None))
    assert any("try num_workers=4" in a for a in v["advice"])
    assert any("core count unknown" in a for a in v["advice"])


def test_unknown_cpu_fraction_fallbacks():
    blind = [worker(i, cpu_fraction=None, cpu_percent=None) for i in range(4)]
    assert cat(input_bound(workers=blind), make_system(iowait_percent=20.0)) == "input_bound_io"
    assert cat(input_bound(workers=blind), make_system(iowait_percent=1.0)) == "input_bound_cpu"
    v = diagnose(input_bound(workers=blind), make_system(iowait_percent=None))
    assert v["category"] == "input_bound_cpu"
    assert any("unknown" in e for e in v["evidence"])
    # process CPU stands in for cpu_fraction
    proxy = [worker(i, cpu_fraction=None, cpu_percent=10.0) for i in range(4)]
    v = diagnose(input_bound(workers=proxy), make_system())
    assert v["category"] == "input_bound_io"
    assert any("worker process CPU 0.10" in e for e in v["evidence"])
    # no worker entries at all yet
    assert cat(input_bound(workers=[]), make_system()) == "input_bound_cpu"


def test_starved_gpu_is_evidence_for_input_bound():
    system = make_system(gpu_status="ok", gpus=[{"index": 0, "util_percent": 12.0, "processes": []}])
    v = diagnose(input_bound(), system)
    assert "GPU 0 util 12 % (starved)" in v["evidence"]


# ---------------------------------------------------------------------------------------------
# None-robustness
# ---------------------------------------------------------------------------------------------

def _all_none(value):
    if isinstance(value, dict):
        return {k: _all_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_all_none(v) for v in value]
    return None


def test_every_figure_none():
    src = _all_none(make_source())
    v = diagnose(src, _all_none(make_system()))
    assert v["category"] == "insufficient_data"
    assert diagnose(src, None)["category"] == "insufficient_data"


@pytest.mark.parametrize("source", [None, {}, {"batches": 10}, {"batches": 0},
                                    {"workers": None, "queue": None, "config": None, "loop": None},
                                    {"workers": [None, 3, "x"], "batches": 10, "wait_fraction": 0.5}])
@pytest.mark.parametrize("system", [None, {}, {"gpus": None, "gpu_status": "ok"}])
def test_degenerate_inputs(source, system):
    v = diagnose(source, system)
    assert v["category"] in d.CATEGORIES


def test_system_none_still_judges_from_the_source():
    assert diagnose(make_source(), None)["category"] == "compute_bound"
    v = diagnose(input_bound(config={"num_workers": 1}, workers=[worker(0)]), None)
    assert v["category"] == "input_bound_cpu"
    assert any("try num_workers=4" in a for a in v["advice"])


def test_nan_and_inf_are_unknown():
    src = input_bound(wait_fraction=float("nan"), wait_ms=None, step_ms=None)
    assert cat(src) == "insufficient_data"
    system = make_system(mem_available_bytes=float("inf"), cpu_percent=float("nan"))
    assert cat(make_source(), system) == "compute_bound"


_maybe_num = st.one_of(st.none(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True))
_stats = st.one_of(st.none(), st.fixed_dictionaries({k: _maybe_num for k in ("mean", "p50", "p95", "p99", "max")}))
_worker = st.fixed_dictionaries({
    "id": st.one_of(st.none(), st.integers(0, 64)), "pid": st.one_of(st.none(), st.integers(1, 10**6)),
    "alive": st.one_of(st.none(), st.booleans()), "exitcode": st.one_of(st.none(), st.integers(-64, 255)),
    "cpu_percent": _maybe_num, "rss_bytes": _maybe_num, "batches": _maybe_num, "fetch_ms": _stats,
    "cpu_fraction": _maybe_num})
_source = st.fixed_dictionaries({
    "id": st.just("h:1:x"), "pid": st.one_of(st.none(), st.integers(1, 10**6)),
    "state": st.sampled_from(["running", "waiting", "stalled", "idle", "finished", "gone", None]),
    "config": st.fixed_dictionaries({"num_workers": _maybe_num, "batch_size": _maybe_num,
                                     "prefetch_factor": _maybe_num,
                                     "pin_memory": st.one_of(st.none(), st.booleans())}),
    "batches": _maybe_num, "batches_total": _maybe_num, "batches_per_s": _maybe_num,
    "wait_ms": _stats, "step_ms": _stats, "wait_fraction": _maybe_num, "blocked_ms": _maybe_num,
    "queue": st.fixed_dictionaries({k: _maybe_num for k in (
        "ready", "in_flight", "capacity", "ready_mean", "in_flight_mean", "ready_when_waiting")}),
    "workers": st.one_of(st.none(), st.lists(_worker, max_size=5)),
    "loop": st.fixed_dictionaries({"fetch_ms": _stats, "cpu_fraction": _maybe_num})})
_system = st.one_of(st.none(), st.fixed_dictionaries({
    **{k: _maybe_num for k in ("cpu_count", "cores_available", "cpu_percent", "iowait_percent",
                               "load_avg_1m", "mem_total_bytes", "mem_available_bytes",
                               "swap_in_bytes_per_s", "swap_out_bytes_per_s",
                               "disk_read_bytes_per_s")},
    "gpu_status": st.sampled_from(["ok", "no_nvml", "no_gpu", "error: x"]),
    "gpus": st.lists(st.fixed_dictionaries({
        "index": st.integers(0, 7), "util_percent": _maybe_num,
        "processes": st.lists(st.fixed_dictionaries({"pid": st.integers(1, 10**6)}), max_size=2)}),
        max_size=2)}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_source, _system, st.sampled_from([None, *d.CATEGORIES]))
def test_random_inputs_never_crash(source, system, previous):
    v = diagnose(source, system, previous)
    assert v["category"] in d.CATEGORIES
    assert isinstance(v["summary"], str) and v["summary"]
    for line in v["evidence"] + v["advice"]:
        assert isinstance(line, str) and "nan" not in line.lower().split()


# ---------------------------------------------------------------------------------------------
# overall
# ---------------------------------------------------------------------------------------------

def verdict(category: str) -> dict:
    return {"category": category, "summary": category, "evidence": [], "advice": []}


def test_overall_rank_order():
    rank = ["stalled", "memory_pressure", "cpu_saturated", "main_process_bound", "input_bound_io",
            "input_bound_cpu", "compute_bound", "insufficient_data", "idle"]
    assert list(d.OVERALL_RANK) == rank
    for i, winner in enumerate(rank):
        others = [(f"s{j}", verdict(c)) for j, c in enumerate(rank[i:])][::-1]
        top = overall(others, make_system())
        assert top["category"] == winner
        assert top["source"] == f"s{0}"


def test_overall_ties_keep_order_and_unknown_ranks_last():
    top = overall([("a", verdict("input_bound_io")), ("b", verdict("input_bound_io"))], None)
    assert top["source"] == "a"
    top = overall([("a", {"category": "bogus"}), ("b", verdict("idle")), ("c", None)], None)
    assert top["source"] == "b"


def test_overall_without_sources():
    top = overall([], make_system())
    assert top["category"] == "idle" and top["source"] is None
    top = overall([], None)
    assert top["category"] == "idle" and top["source"] is None
    top = overall([], make_system(mem_available_bytes=0.01 * 16 * GIB))
    assert top["category"] == "memory_pressure" and top["source"] is None
    assert set(top) == {"category", "source", "summary", "evidence", "advice"}


def test_overall_keeps_source_of_memory_pressure():
    system = make_system(mem_available_bytes=0.01 * 16 * GIB)
    verdicts = [("h:1:train", diagnose(make_source(), system)), ("h:1:val", verdict("compute_bound"))]
    top = overall(verdicts, system)
    assert top["category"] == "memory_pressure" and top["source"] == "h:1:train"


# ---------------------------------------------------------------------------------------------
# VerdictStabilizer
# ---------------------------------------------------------------------------------------------

def test_stabilizer_first_verdict_shows_at_once():
    s = VerdictStabilizer()
    assert s.update("a", verdict("compute_bound"), 0.0)["category"] == "compute_bound"
    assert s.shown_category("a") == "compute_bound"
    assert s.shown_category("b") is None


def test_stabilizer_noise_around_a_boundary_does_not_flip():
    s = VerdictStabilizer()
    s.update("a", verdict("compute_bound"), 0.0)
    for i in range(1, 41):  # ends on compute_bound
        category = "input_bound_cpu" if i % 2 else "compute_bound"
        assert s.update("a", verdict(category), i * 0.5)["category"] == "compute_bound"
    # two in a row, then back: still no flip
    s.update("a", verdict("input_bound_cpu"), 30.0)
    s.update("a", verdict("input_bound_cpu"), 30.5)
    assert s.update("a", verdict("compute_bound"), 31.0)["category"] == "compute_bound"


def test_stabilizer_sustained_change_after_n_updates():
    s = VerdictStabilizer()
    s.update("a", verdict("compute_bound"), 0.0)
    shown = [s.update("a", verdict("input_bound_io"), 0.1 * i)["category"]
             for i in range(1, d.STABLE_UPDATES + 1)]
    assert shown == ["compute_bound"] * (d.STABLE_UPDATES - 1) + ["input_bound_io"]


def test_stabilizer_sustained_change_after_t_seconds():
    s = VerdictStabilizer()
    s.update("a", verdict("compute_bound"), 0.0)
    assert s.update("a", verdict("input_bound_io"), 10.0)["category"] == "compute_bound"  # one alone
    assert s.update("a", verdict("input_bound_io"), 10.0 + d.STABLE_SECONDS)["category"] \
        == "input_bound_io"


@pytest.mark.parametrize("urgent", ["stalled", "memory_pressure"])
def test_stabilizer_urgent_shows_at_once(urgent):
    s = VerdictStabilizer()
    s.update("a", verdict("compute_bound"), 0.0)
    assert s.update("a", verdict(urgent), 0.5)["category"] == urgent
    # leaving an urgent category follows the normal rule
    assert s.update("a", verdict("compute_bound"), 1.0)["category"] == urgent


def test_stabilizer_refreshes_figures_while_category_holds():
    s = VerdictStabilizer()
    s.update("a", {**verdict("compute_bound"), "evidence": ["wait fraction 3 %"]}, 0.0)
    shown = s.update("a", {**verdict("compute_bound"), "evidence": ["wait fraction 4 %"]}, 0.5)
    assert shown["evidence"] == ["wait fraction 4 %"]
    # a pending change keeps the last verdict of the shown category
    assert s.update("a", verdict("input_bound_io"), 1.0)["evidence"] == ["wait fraction 4 %"]


def test_stabilizer_sources_are_independent_and_forgettable():
    s = VerdictStabilizer()
    s.update("a", verdict("compute_bound"), 0.0)
    s.update("b", verdict("input_bound_io"), 0.0)
    assert s.update("a", verdict("input_bound_io"), 0.5)["category"] == "compute_bound"
    s.forget("a")
    assert s.shown_category("a") is None
    assert s.update("a", verdict("input_bound_io"), 1.0)["category"] == "input_bound_io"


def test_stabilizer_with_margins_on_a_steady_noisy_workload():
    """End to end: wait fraction jittering 8-12 % around the 10 % boundary stays input-bound."""
    s = VerdictStabilizer()
    shown = []
    for i, wf in enumerate([0.12, 0.08, 0.11, 0.09, 0.075, 0.12, 0.08, 0.095] * 3):
        v = diagnose(input_bound(wait_fraction=wf), make_system(), s.shown_category("a"))
        shown.append(s.update("a", v, i * 0.5)["category"])
    assert set(shown) == {"input_bound_cpu"}
