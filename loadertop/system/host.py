"""The machine's CPU, memory, swap and disk figures, sampled once a second by a background thread.

`SystemSampler.sample()` returns the `system` part of the snapshot document (CONTRACT.md §3) plus a
few extras (host, cores_available, cgroup, per-GPU details). Rates and percentages are deltas
between two samples; the first sample has none to compare with and says so with None.

CPU percentages come from our own `psutil.cpu_times()` deltas rather than `psutil.cpu_percent()`,
whose module-global "previous call" is shared with any other caller in the process and whose first
answer is a meaningless 0.0.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from .cgroup import DEFAULT_PROC_CGROUP, DEFAULT_ROOT, Cgroup
from .gpu import GpuReader, NvmlGpuReader, error_status


@dataclass(frozen=True)
class CpuTicks:
    """Cumulative CPU seconds, reduced to what a percentage needs."""

    total: float
    busy: float
    iowait: float | None  # None where the OS has no iowait (everything but Linux)

    @classmethod
    def from_psutil(cls, times: Any) -> CpuTicks:
        fields = times._asdict()
        # On Linux guest time is already counted in user/nice; adding it again would inflate the
        # total (psutil's own cpu_percent subtracts it the same way).
        total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
        iowait = fields.get("iowait")
        idle = fields.get("idle", 0.0) + (iowait or 0.0)
        return cls(total=total, busy=total - idle, iowait=iowait)


@dataclass(frozen=True)
class Counters:
    """Every cumulative counter one sample reads; two of them make the rates."""

    cpu: CpuTicks
    per_cpu: tuple[CpuTicks, ...]
    swap_in_bytes: int | None
    swap_out_bytes: int | None
    disk_read_bytes: int | None  # None where psutil finds no disk (some containers, VMs)
    disk_write_bytes: int | None
    # Not counters, but psutil reads them in the same call as swap in/out (the costliest read
    # here, ~0.25 ms); carrying them avoids reading /proc/meminfo and /proc/vmstat twice.
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0


def read_counters() -> Counters:
    """Read the cumulative counters from psutil (the default counter source)."""
    swap = psutil.swap_memory()
    try:
        disk = psutil.disk_io_counters()
    except Exception:
        disk = None
    return Counters(
        cpu=CpuTicks.from_psutil(psutil.cpu_times()),
        per_cpu=tuple(CpuTicks.from_psutil(t) for t in psutil.cpu_times(percpu=True)),
        swap_in_bytes=swap.sin,
        swap_out_bytes=swap.sout,
        disk_read_bytes=disk.read_bytes if disk is not None else None,
        disk_write_bytes=disk.write_bytes if disk is not None else None,
        swap_total_bytes=int(swap.total),
        swap_used_bytes=int(swap.used),
    )


class SystemSampler:
    """Samples the machine's state; `sample()` is cheap enough to call every second.

    `gpu` defaults to an `NvmlGpuReader`; the sampler owns it and `close()` closes it. `clock` is
    the monotonic clock the rates are divided by. The keyword-only arguments are test hooks: the
    counter source, and where to look for cgroup files.
    """

    def __init__(
        self,
        gpu: GpuReader | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        counters: Callable[[], Counters] = read_counters,
        cgroup_root: str = DEFAULT_ROOT,
        proc_cgroup: str = DEFAULT_PROC_CGROUP,
    ):
        self._gpu: GpuReader = gpu if gpu is not None else NvmlGpuReader()
        self._clock = clock
        self._read_counters = counters
        self._lock = threading.Lock()  # sample() may be called from more than one thread
        self._previous: tuple[float, Counters] | None = None
        self._closed = False
        self._host = socket.gethostname()
        self._cpu_count = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        # Limits change rarely (a container is resized, not re-limited every second): read once.
        self._cgroup = Cgroup.detect(cgroup_root, proc_cgroup)
        self._cpu_quota = self._cgroup.cpu_quota_cores()
        self._mem_limit = self._cgroup.mem_limit_bytes()

    def sample(self) -> dict[str, Any]:
        """Return one JSON-able dict of the machine's state (keys: see the package docstring)."""
        with self._lock:
            now = self._clock()
            counters = self._read_counters()
            previous, self._previous = self._previous, (now, counters)
        doc: dict[str, Any] = {
            "host": self._host,
            "cpu_count": self._cpu_count,
            "cores_available": self._cores_available(),
        }
        doc.update(_cpu_figures(previous[1] if previous else None, counters))
        doc["load_avg_1m"] = _load_avg_1m()
        memory, cgroup = self._memory(counters)
        doc.update(memory)
        doc.update(_rates(previous, (now, counters)))
        doc["cgroup"] = cgroup
        status, gpus = self._read_gpus()
        doc["gpu_status"] = status
        doc["gpus"] = gpus
        return doc

    def close(self) -> None:
        """Release the GPU reader (NVML shutdown). Safe to call twice."""
        if not self._closed:
            self._closed = True
            self._gpu.close()

    def __enter__(self) -> SystemSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- parts -------------------------------------------------------------------------------

    def _cores_available(self) -> float:
        cores = float(self._cpu_count)
        if self._cpu_quota is not None:
            cores = min(cores, self._cpu_quota)
        # Affinity (taskset, cpuset, Slurm) can change while we run, and costs one syscall.
        if hasattr(os, "sched_getaffinity"):
            try:
                cores = min(cores, float(len(os.sched_getaffinity(0))))
            except OSError:
                pass
        return cores

    def _memory(self, counters: Counters) -> tuple[dict[str, Any], dict[str, Any]]:
        """(memory and swap figures, the cgroup dict)."""
        vm = psutil.virtual_memory()
        total, available = int(vm.total), int(vm.available)
        cgroup_used = self._cgroup.mem_used_bytes() if self._cgroup.memory_dirs else None
        if self._mem_limit is not None and self._mem_limit < total:
            # The container's limit is what the OOM killer enforces, not the host's RAM. Host
            # pressure can still leave less than the limit allows, so keep the smaller figure.
            total = self._mem_limit
            if cgroup_used is not None:
                available = min(available, max(0, self._mem_limit - cgroup_used))
            else:
                available = min(available, total)
        memory = {
            "mem_total_bytes": total,
            "mem_available_bytes": available,
            "mem_used_percent": round(100.0 * (total - available) / total, 2) if total else 0.0,
            "swap_total_bytes": counters.swap_total_bytes,
            "swap_used_bytes": counters.swap_used_bytes,
        }
        cgroup = {
            "version": self._cgroup.version,
            "cpu_quota_cores": self._cpu_quota,
            "mem_limit_bytes": self._mem_limit,
            "mem_used_bytes": cgroup_used,
        }
        return memory, cgroup

    def _read_gpus(self) -> tuple[str, list[dict[str, Any]]]:
        # A GPU reader bug must cost the GPU figures, not the sampler thread.
        try:
            return self._gpu.read()
        except Exception as e:
            return error_status(e), []


def _cpu_figures(previous: Counters | None, current: Counters) -> dict[str, Any]:
    if previous is None:
        return {"cpu_percent": None, "per_cpu_percent": None, "iowait_percent": None}
    cpu_percent, iowait_percent = _cpu_percent(previous.cpu, current.cpu)
    per_cpu: list[float] | None = None
    # A CPU hot-plugged between samples makes the lists incomparable.
    if len(previous.per_cpu) == len(current.per_cpu):
        pairs = [_cpu_percent(a, b)[0] for a, b in zip(previous.per_cpu, current.per_cpu)]
        per_cpu = [p for p in pairs if p is not None]
        if len(per_cpu) != len(pairs):
            per_cpu = None
    return {"cpu_percent": cpu_percent, "per_cpu_percent": per_cpu, "iowait_percent": iowait_percent}


_TICK_DUST = 1e-6  # seconds


def _cpu_percent(before: CpuTicks, after: CpuTicks) -> tuple[float | None, float | None]:
    """(busy %, iowait %) between two readings; None when nothing can be said."""
    total = after.total - before.total
    busy = after.busy - before.busy
    # No tick elapsed (two samples within 10 ms) or counters went backwards: no honest answer.
    # Sums of large float counters leave rounding dust (-4.5e-13 seen on an idle core): a
    # microsecond of tolerance tells that from a real step backwards.
    if total <= _TICK_DUST or busy < -_TICK_DUST:
        return None, None
    busy = max(0.0, busy)
    iowait: float | None = None
    if after.iowait is not None and before.iowait is not None and after.iowait >= before.iowait:
        iowait = _clamp_percent(100.0 * (after.iowait - before.iowait) / total)
    return _clamp_percent(100.0 * busy / total), iowait


def _rates(previous: tuple[float, Counters] | None, current: tuple[float, Counters]) -> dict[str, Any]:
    names = {
        "swap_in_bytes_per_s": "swap_in_bytes",
        "swap_out_bytes_per_s": "swap_out_bytes",
        "disk_read_bytes_per_s": "disk_read_bytes",
        "disk_write_bytes_per_s": "disk_write_bytes",
    }
    if previous is None:
        return {key: None for key in names}
    (then, before), (now, after) = previous, current
    elapsed = now - then
    return {key: _rate(getattr(before, attr), getattr(after, attr), elapsed) for key, attr in names.items()}


def _rate(before: int | None, after: int | None, elapsed: float) -> float | None:
    if before is None or after is None or elapsed <= 0 or after < before:
        return None  # a counter reset or wrapped: skip this sample rather than report nonsense
    return (after - before) / elapsed


def _load_avg_1m() -> float | None:
    try:
        return float(psutil.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _clamp_percent(value: float) -> float:
    # Per-CPU tick accounting is not atomic across fields; tiny overshoots happen. Rounding drops
    # float noise (3e-11 %) from subtracting large sums; ticks are 10 ms, so 0.01 % hides nothing.
    return round(min(100.0, max(0.0, value)), 2)
