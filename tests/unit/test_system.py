"""Tests for loadertop.system: the host sampler (real psutil) and the cgroup readers (fake files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import psutil
import pytest

from loadertop.system import SystemSampler
from loadertop.system.cgroup import Cgroup, parse_cpu_max, parse_limit_bytes, parse_memory_stat
from loadertop.system.host import Counters, CpuTicks

from fakes import FakeGpuReader

SAMPLE_KEYS = {
    "host", "cpu_count", "cores_available", "cpu_percent", "per_cpu_percent", "iowait_percent",
    "load_avg_1m", "mem_total_bytes", "mem_available_bytes", "mem_used_percent", "swap_total_bytes",
    "swap_used_bytes", "swap_in_bytes_per_s", "swap_out_bytes_per_s", "disk_read_bytes_per_s",
    "disk_write_bytes_per_s", "cgroup", "gpu_status", "gpus",
}  # fmt: skip
RATE_KEYS = ("swap_in_bytes_per_s", "swap_out_bytes_per_s", "disk_read_bytes_per_s", "disk_write_bytes_per_s")


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _busy(seconds: float) -> None:
    """Burn CPU for `seconds` of wall time so cpu_times() moves by at least a few 10 ms ticks."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _ticks(total: float, busy: float, iowait: float | None = 0.0) -> CpuTicks:
    return CpuTicks(total=total, busy=busy, iowait=iowait)


def _counters(
    cpu: CpuTicks | None = None,
    per_cpu: tuple[CpuTicks, ...] | None = None,
    swap_in: int | None = 0,
    swap_out: int | None = 0,
    disk_read: int | None = 0,
    disk_write: int | None = 0,
) -> Counters:
    cpu = cpu or _ticks(100.0, 50.0)
    return Counters(
        cpu=cpu,
        per_cpu=per_cpu if per_cpu is not None else (cpu,),
        swap_in_bytes=swap_in,
        swap_out_bytes=swap_out,
        disk_read_bytes=disk_read,
        disk_write_bytes=disk_write,
    )


def _scripted(sampler_counters: list[Counters]):
    """A counter source that returns the given readings in order."""
    it = iter(sampler_counters)
    return lambda: next(it)


@pytest.fixture
def no_cgroup(tmp_path: Path) -> dict[str, str]:
    """Point the sampler at an empty cgroup root, so host figures are the machine's own."""
    (tmp_path / "proc_cgroup").write_text("")
    return {"cgroup_root": str(tmp_path / "cgroup"), "proc_cgroup": str(tmp_path / "proc_cgroup")}


# --- real psutil --------------------------------------------------------------------------------


def test_first_sample_is_honest_and_second_has_real_figures():
    clock = FakeClock()
    with SystemSampler(gpu=FakeGpuReader(), clock=clock) as sampler:
        first = sampler.sample()
        assert set(first) == SAMPLE_KEYS
        # Nothing to compare with yet: None, never a made-up 0.
        for key in ("cpu_percent", "per_cpu_percent", "iowait_percent", *RATE_KEYS):
            assert first[key] is None, key

        _busy(0.1)
        clock.now += 1.0
        second = sampler.sample()

    assert set(second) == SAMPLE_KEYS
    assert second["host"]
    assert second["cpu_count"] == psutil.cpu_count(logical=True)
    assert 0 < second["cores_available"] <= second["cpu_count"]
    assert second["cpu_percent"] is not None and 0.0 <= second["cpu_percent"] <= 100.0
    assert len(second["per_cpu_percent"]) == second["cpu_count"]
    assert all(0.0 <= p <= 100.0 for p in second["per_cpu_percent"])
    if sys.platform.startswith("linux"):
        assert second["iowait_percent"] is not None and 0.0 <= second["iowait_percent"] <= 100.0
        assert second["load_avg_1m"] is not None and second["load_avg_1m"] >= 0.0
    assert 0 < second["mem_available_bytes"] <= second["mem_total_bytes"]
    assert 0.0 <= second["mem_used_percent"] <= 100.0
    assert 0 <= second["swap_used_bytes"] <= max(second["swap_total_bytes"], second["swap_used_bytes"])
    for key in RATE_KEYS:
        assert second[key] is None or second[key] >= 0.0, key
    assert second["gpu_status"] == "no_nvml" and second["gpus"] == []
    json.dumps(first)
    json.dumps(second)


def test_busy_loop_shows_in_cpu_percent():
    with SystemSampler(gpu=FakeGpuReader(), clock=FakeClock()) as sampler:
        sampler.sample()
        _busy(0.15)
        doc = sampler.sample()
    # One core was pegged for the whole interval, so at least one per-CPU figure is high. (Total
    # over cores could be diluted on a big machine; the max per CPU cannot.)
    assert max(doc["per_cpu_percent"]) > 30.0


def test_memory_is_the_hosts_when_no_cgroup_limit(no_cgroup):
    with SystemSampler(gpu=FakeGpuReader(), **no_cgroup) as sampler:
        doc = sampler.sample()
    assert doc["cgroup"] == {"version": None, "cpu_quota_cores": None, "mem_limit_bytes": None,
                             "mem_used_bytes": None}
    assert doc["mem_total_bytes"] == psutil.virtual_memory().total
    assert doc["cores_available"] == min(doc["cpu_count"], len(os.sched_getaffinity(0)))


# --- rates and percentages from injected counters ---------------------------------------------


def test_rates_are_delta_over_elapsed_clock():
    clock = FakeClock()
    readings = [
        _counters(swap_in=0, swap_out=4096, disk_read=1_000, disk_write=0),
        _counters(swap_in=8192, swap_out=4096, disk_read=5_000, disk_write=2_000),
    ]
    sampler = SystemSampler(gpu=FakeGpuReader(), clock=clock, counters=_scripted(readings))
    first = sampler.sample()
    assert all(first[k] is None for k in RATE_KEYS)
    clock.now += 2.0
    doc = sampler.sample()
    assert doc["swap_in_bytes_per_s"] == 4096.0
    assert doc["swap_out_bytes_per_s"] == 0.0
    assert doc["disk_read_bytes_per_s"] == 2000.0
    assert doc["disk_write_bytes_per_s"] == 1000.0


def test_backwards_counter_gives_none_for_that_sample_only():
    clock = FakeClock()
    readings = [
        _counters(disk_read=10_000, disk_write=100),
        _counters(disk_read=50, disk_write=300),  # disk_read reset (device replugged, wrap)
        _counters(disk_read=150, disk_write=400),
    ]
    sampler = SystemSampler(gpu=FakeGpuReader(), clock=clock, counters=_scripted(readings))
    sampler.sample()
    clock.now += 1.0
    doc = sampler.sample()
    assert doc["disk_read_bytes_per_s"] is None
    assert doc["disk_write_bytes_per_s"] == 200.0
    clock.now += 1.0
    doc = sampler.sample()
    assert doc["disk_read_bytes_per_s"] == 100.0


def test_no_elapsed_time_or_no_disk_gives_none():
    clock = FakeClock()
    readings = [_counters(disk_read=None, disk_write=None), _counters(disk_read=None, disk_write=None)]
    sampler = SystemSampler(gpu=FakeGpuReader(), clock=clock, counters=_scripted(readings))
    sampler.sample()
    doc = sampler.sample()  # clock did not move
    assert all(doc[k] is None for k in RATE_KEYS)


def test_cpu_percent_and_iowait_from_tick_deltas():
    readings = [
        _counters(cpu=_ticks(100.0, 40.0, iowait=5.0), per_cpu=(_ticks(50.0, 20.0), _ticks(50.0, 20.0))),
        # +10 s of CPU time: 6 s busy, 1 s iowait; core 0 busy 5 of 5, core 1 busy 1 of 5.
        _counters(cpu=_ticks(110.0, 46.0, iowait=6.0), per_cpu=(_ticks(55.0, 25.0), _ticks(55.0, 21.0))),
    ]
    sampler = SystemSampler(gpu=FakeGpuReader(), clock=FakeClock(), counters=_scripted(readings))
    sampler.sample()
    doc = sampler.sample()
    assert doc["cpu_percent"] == 60.0
    assert doc["iowait_percent"] == 10.0
    assert doc["per_cpu_percent"] == [100.0, 20.0]


def test_cpu_figures_none_when_ticks_stall_or_go_back_or_cpus_change():
    readings = [
        _counters(cpu=_ticks(100.0, 40.0, iowait=None), per_cpu=(_ticks(50.0, 20.0),) * 2),
        # No tick elapsed; a CPU went offline.
        _counters(cpu=_ticks(100.0, 40.0, iowait=None), per_cpu=(_ticks(50.0, 20.0),)),
        # Busy went backwards.
        _counters(cpu=_ticks(101.0, 30.0, iowait=None), per_cpu=(_ticks(51.0, 21.0),)),
    ]
    sampler = SystemSampler(gpu=FakeGpuReader(), clock=FakeClock(), counters=_scripted(readings))
    sampler.sample()
    doc = sampler.sample()
    assert doc["cpu_percent"] is None and doc["per_cpu_percent"] is None
    doc = sampler.sample()
    assert doc["cpu_percent"] is None and doc["iowait_percent"] is None
    assert doc["per_cpu_percent"] == [100.0]


def test_cpu_ticks_from_psutil_do_not_count_guest_twice():
    Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
    ticks = CpuTicks.from_psutil(Times(10.0, 0.0, 5.0, 80.0, 5.0, 0.0, 0.0, 0.0, 3.0, 1.0))
    assert ticks.total == 100.0  # guest is already inside user/nice
    assert ticks.busy == 15.0
    assert ticks.iowait == 5.0
    Mac = namedtuple("Mac", "user nice system idle")
    assert CpuTicks.from_psutil(Mac(1.0, 0.0, 1.0, 8.0)) == CpuTicks(total=10.0, busy=2.0, iowait=None)


# --- the sampler's other duties ---------------------------------------------------------------


def test_gpu_reader_failure_is_reported_not_raised():
    class Broken(FakeGpuReader):
        def read(self):
            raise RuntimeError("boom")

    with SystemSampler(gpu=Broken()) as sampler:
        doc = sampler.sample()
    assert doc["gpu_status"] == "error: boom" and doc["gpus"] == []


def test_gpus_pass_through_and_close_closes_reader_once():
    gpu = FakeGpuReader.single(util=35.0)
    sampler = SystemSampler(gpu=gpu, clock=FakeClock())
    doc = sampler.sample()
    assert doc["gpu_status"] == "ok"
    assert doc["gpus"][0]["util_percent"] == 35.0
    sampler.close()
    sampler.close()
    assert gpu.closed


def test_import_pulls_in_neither_torch_nor_textual():
    code = "import loadertop.system, sys; assert 'torch' not in sys.modules and 'textual' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- cgroup files -----------------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _v2(tmp_path: Path, files: dict[str, str], own: str = "/") -> Cgroup:
    root = tmp_path / "cg"
    _write(root, {"cgroup.controllers": "cpu memory", **files})
    (tmp_path / "self").write_text(f"0::{own}\n")
    return Cgroup.detect(str(root), str(tmp_path / "self"))


def _v1(tmp_path: Path, files: dict[str, str], own: str = "/") -> Cgroup:
    root = tmp_path / "cg"
    (root / "cpu").mkdir(parents=True)
    (root / "memory").mkdir(parents=True)
    _write(root, files)
    (tmp_path / "self").write_text(f"4:memory:{own}\n3:cpu,cpuacct:{own}\n1:name=systemd:/\n0::/\n")
    return Cgroup.detect(str(root), str(tmp_path / "self"))


def test_cgroup_v2_limits_and_usage_without_inactive_file(tmp_path):
    cg = _v2(
        tmp_path,
        {
            "cpu.max": "150000 100000",
            "memory.max": str(4 << 30),
            "memory.current": str(3 << 30),
            "memory.stat": f"anon 1000\nfile 2000\ninactive_file {1 << 30}\nactive_file 5",
        },
    )
    assert cg.version == 2
    assert cg.cpu_quota_cores() == 1.5
    assert cg.mem_limit_bytes() == 4 << 30
    assert cg.mem_used_bytes() == 2 << 30


def test_cgroup_v2_max_means_no_limit(tmp_path):
    cg = _v2(tmp_path, {"cpu.max": "max 100000", "memory.max": "max", "memory.current": "123"})
    assert cg.cpu_quota_cores() is None
    assert cg.mem_limit_bytes() is None
    assert cg.mem_used_bytes() == 123  # no memory.stat: nothing to subtract


def test_cgroup_v2_nested_takes_smallest_limit_and_own_usage(tmp_path):
    cg = _v2(
        tmp_path,
        {
            "kubepods/cpu.max": "200000 100000",
            "kubepods/memory.max": str(8 << 30),
            "kubepods/pod1/cpu.max": "max 100000",
            "kubepods/pod1/memory.max": str(16 << 30),
            "kubepods/pod1/memory.current": "777",
        },
        own="/kubepods/pod1",
    )
    assert cg.cpu_quota_cores() == 2.0
    assert cg.mem_limit_bytes() == 8 << 30
    assert cg.mem_used_bytes() == 777


def test_cgroup_path_missing_under_mount_falls_back_to_root(tmp_path):
    # A container without its own cgroup namespace: /proc/self/cgroup names a host path, while the
    # container's cgroup is what is mounted at the root.
    cg = _v2(tmp_path, {"cpu.max": "50000 100000"}, own="/docker/abc123")
    assert cg.cpu_quota_cores() == 0.5


def test_cgroup_v1_limits_usage_and_unlimited(tmp_path):
    cg = _v1(
        tmp_path,
        {
            "cpu/cpu.cfs_quota_us": "300000",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": str(2 << 30),
            "memory/memory.usage_in_bytes": "5000",
            "memory/memory.stat": "inactive_file 100\ntotal_inactive_file 1000",
        },
    )
    assert cg.version == 1
    assert cg.cpu_quota_cores() == 3.0
    assert cg.mem_limit_bytes() == 2 << 30
    assert cg.mem_used_bytes() == 4000  # hierarchical total_inactive_file, as docker does on v1

    unlimited = _v1(
        tmp_path / "u",
        {
            "cpu/cpu.cfs_quota_us": "-1",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": "9223372036854771712",
        },
    )
    assert unlimited.cpu_quota_cores() is None
    assert unlimited.mem_limit_bytes() is None
    assert unlimited.mem_used_bytes() is None  # no usage file


def test_cgroup_missing_everything(tmp_path):
    cg = Cgroup.detect(str(tmp_path / "nope"), str(tmp_path / "nope-self"))
    assert cg.version is None
    assert cg.cpu_quota_cores() is None and cg.mem_limit_bytes() is None and cg.mem_used_bytes() is None


def test_cgroup_v2_files_missing_or_garbage(tmp_path):
    cg = _v2(tmp_path, {"memory.max": "lots", "memory.current": ""})
    assert cg.cpu_quota_cores() is None
    assert cg.mem_limit_bytes() is None
    assert cg.mem_used_bytes() is None


def test_parsers():
    assert parse_cpu_max("max 100000") is None
    assert parse_cpu_max("250000 100000") == 2.5
    assert parse_cpu_max("50000") == 0.5
    assert parse_cpu_max("") is None and parse_cpu_max(None) is None
    assert parse_limit_bytes("max") is None and parse_limit_bytes("0") is None
    assert parse_limit_bytes("1048576") == 1048576
    assert parse_memory_stat("a 1\nbroken\nb x\nc 3") == {"a": 1, "c": 3}


def test_sampler_uses_cgroup_limit_for_memory_and_cores(tmp_path):
    physical = psutil.virtual_memory().total
    limit = min(physical // 2, 1 << 30)
    _write(
        tmp_path / "cg",
        {
            "cgroup.controllers": "cpu memory",
            "cpu.max": "50000 100000",
            "memory.max": str(limit),
            "memory.current": str(limit // 2 + 4096),
            "memory.stat": "inactive_file 4096",
        },
    )
    (tmp_path / "self").write_text("0::/\n")
    with SystemSampler(gpu=FakeGpuReader(), cgroup_root=str(tmp_path / "cg"),
                       proc_cgroup=str(tmp_path / "self")) as s:
        doc = s.sample()
    assert doc["cgroup"] == {"version": 2, "cpu_quota_cores": 0.5, "mem_limit_bytes": limit,
                             "mem_used_bytes": limit // 2}
    assert doc["mem_total_bytes"] == limit
    assert doc["mem_available_bytes"] <= limit - limit // 2
    assert doc["cores_available"] == 0.5


def test_limit_above_physical_ram_is_reported_but_not_applied(tmp_path):
    physical = psutil.virtual_memory().total
    _write(tmp_path / "cg", {"cgroup.controllers": "", "memory.max": str(physical * 2),
                             "memory.current": "1"})
    (tmp_path / "self").write_text("0::/\n")
    with SystemSampler(gpu=FakeGpuReader(), cgroup_root=str(tmp_path / "cg"),
                       proc_cgroup=str(tmp_path / "self")) as s:
        doc = s.sample()
    assert doc["cgroup"]["mem_limit_bytes"] == physical * 2
    assert doc["mem_total_bytes"] == physical


def test_float_rounding_dust_on_an_idle_core_is_zero_not_unknown():
    # Measured here: an idle core's busy delta came out as -4.5e-13 s (sums of large floats).
    from loadertop.system.host import _cpu_percent

    before = _ticks(total=1000.1, busy=500.3)
    after = _ticks(total=1000.2, busy=500.3 - 4.5e-13)
    assert _cpu_percent(before, after)[0] == 0.0
    assert _cpu_percent(before, _ticks(total=1000.2, busy=500.2))[0] is None  # really backwards


@pytest.mark.skipif(not os.path.isfile("/proc/stat"), reason="Linux procfs")
def test_the_procfs_reader_reads_what_psutil_reads():
    """The cheaper /proc reader behind the 1 Hz system sample: the same figures as psutil's."""
    from loadertop.system.host import ProcfsCounters, read_counters

    procfs = ProcfsCounters()
    ours, theirs, ours_after = procfs(), read_counters(), procfs()
    assert len(ours.per_cpu) == len(theirs.per_cpu) == psutil.cpu_count()
    assert (ours.swap_total_bytes, ours.disk_read_bytes is None) == \
        (theirs.swap_total_bytes, theirs.disk_read_bytes is None)
    # Cumulative counters: psutil's, read between two of ours, lie between them (float sums of
    # the same ticks may differ in their last bits). Bracketed, not bounded by how much time a
    # loaded machine let pass between two reads.
    dust = 1e-6
    assert ours.cpu.total - dust <= theirs.cpu.total <= ours_after.cpu.total + dust
    assert ours.cpu.busy - dust <= theirs.cpu.busy <= ours_after.cpu.busy + dust
    if ours.disk_read_bytes is not None:
        assert ours.disk_read_bytes <= theirs.disk_read_bytes <= ours_after.disk_read_bytes
        assert ours.disk_write_bytes <= theirs.disk_write_bytes <= ours_after.disk_write_bytes
    assert ours.mem_total_bytes == psutil.virtual_memory().total
