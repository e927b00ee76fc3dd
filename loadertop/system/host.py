"""The machine's CPU, memory, swap and disk figures, sampled once a second by a background thread.

`SystemSampler.sample()` returns the `system` part of the snapshot document (docs/contract.md §3) plus a
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
    # Not counters, but psutil reads them in the same call as swap in/out (the costliest read of
    # these); carrying them avoids reading /proc/meminfo and /proc/vmstat twice.
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0
    # Read from /proc/meminfo by the procfs reader, which reads that file anyway; None: ask psutil.
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None


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


class ProcfsCounters:
    """`read_counters` for Linux, several times cheaper: each /proc file read once (psutil reads
    /proc/stat twice and /proc/meminfo twice, parses all of /proc/vmstat, and asks the file system for every
    line of /proc/diskstats whether it is a disk or a partition). Which names are whole disks is
    remembered, and asked again only for a name not seen before or after DEVICES_TTL_S. The same
    figures as psutil's (sums over whole disks, sectors of 512 bytes, swap pages of 4 KiB, guest
    time not counted twice); anything it cannot read or parse falls back to psutil for good
    (docs/performance.md: the two, a call and in the probe's thread)."""

    DEVICES_TTL_S = 60.0

    def __init__(self, procfs: str = "/proc", sysfs_block: str = "/sys/block") -> None:
        self._procfs = procfs
        self._block = sysfs_block
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._disks: dict[bytes, bool] = {}
        self._disks_at = 0.0
        self._broken = False
        self._swap: tuple[int, int] | None = None  # (in, out) bytes, last read

    def __call__(self) -> Counters:
        if not self._broken:
            try:
                return self._read()
            except Exception:
                self._broken = True
        return read_counters()

    def _read_file(self, name: str) -> bytes:
        with open(f"{self._procfs}/{name}", "rb", buffering=0) as f:
            return f.read()

    def _ticks_of(self, line: bytes) -> CpuTicks:
        v = [int(x) for x in line.split()[1:11]]
        # user nice system idle iowait irq softirq steal guest guest_nice: guest time is already
        # in user and nice (CpuTicks.from_psutil subtracts it the same way).
        total = sum(v[:8]) / self._ticks
        iowait = v[4] / self._ticks if len(v) > 4 else None
        idle = (v[3] + (v[4] if len(v) > 4 else 0)) / self._ticks
        return CpuTicks(total=total, busy=total - idle, iowait=iowait)

    def _read(self) -> Counters:
        stat = self._read_file("stat").split(b"\n")
        cpu = self._ticks_of(stat[0])
        per_cpu = tuple(self._ticks_of(line) for line in stat[1:] if line.startswith(b"cpu"))
        meminfo = {}
        for line in self._read_file("meminfo").split(b"\n"):
            key, _, rest = line.partition(b":")
            if key in (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree"):
                meminfo[key] = int(rest.split()[0]) * 1024
        swap_total = meminfo[b"SwapTotal"]
        if swap_total or self._swap is None:
            vmstat = self._read_file("vmstat")
            sin = _vmstat_value(vmstat, b"pswpin")
            sout = _vmstat_value(vmstat, b"pswpout")
            self._swap = (sin * 4096 if sin is not None else 0,
                          sout * 4096 if sout is not None else 0)
        # else: no swap space, so nothing is swapped in or out: the counters stand still (and
        # /proc/vmstat, a long file to read and parse, is not read again)
        read_bytes, write_bytes = self._disk_bytes()
        return Counters(
            cpu=cpu, per_cpu=per_cpu,
            swap_in_bytes=self._swap[0], swap_out_bytes=self._swap[1],
            disk_read_bytes=read_bytes, disk_write_bytes=write_bytes,
            swap_total_bytes=swap_total, swap_used_bytes=swap_total - meminfo[b"SwapFree"],
            mem_total_bytes=meminfo.get(b"MemTotal"),
            mem_available_bytes=meminfo.get(b"MemAvailable"),
        )

    def _disk_bytes(self) -> tuple[int | None, int | None]:
        try:
            text = self._read_file("diskstats")
        except OSError:
            return None, None
        now = time.monotonic()
        if now - self._disks_at > self.DEVICES_TTL_S:
            self._disks.clear()
            self._disks_at = now
        disks = self._disks
        read = write = 0
        found = False
        for line in text.split(b"\n"):
            fields = line.split()
            n = len(fields)
            if n == 14 or n >= 18:
                name, rsect, wsect = fields[2], fields[5], fields[9]
            elif n == 7:
                name, rsect, wsect = fields[2], fields[4], fields[6]
            elif n == 15:
                name, rsect, wsect = fields[3], fields[6], fields[10]
            elif n == 0:
                continue
            else:
                raise ValueError(f"unknown /proc/diskstats line {line!r}")
            whole = disks.get(name)
            if whole is None:
                path = f"{self._block}/{name.decode().replace('/', '!')}"
                whole = disks[name] = os.access(path, os.F_OK)
            if whole:
                found = True
                read += int(rsect) * 512
                write += int(wsect) * 512
        return (read, write) if found else (None, None)


def _vmstat_value(text: bytes, key: bytes) -> int | None:
    start = text.find(b"\n" + key + b" ")
    if start < 0:
        if not text.startswith(key + b" "):
            return None
        start = -1
    start += len(key) + 2
    end = text.find(b"\n", start)
    return int(text[start:end if end >= 0 else None])


def default_counters() -> Callable[[], Counters]:
    return ProcfsCounters() if os.path.isfile("/proc/stat") else read_counters


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
        counters: Callable[[], Counters] | None = None,
        cgroup_root: str = DEFAULT_ROOT,
        proc_cgroup: str = DEFAULT_PROC_CGROUP,
    ):
        self._gpu: GpuReader = gpu if gpu is not None else NvmlGpuReader()
        self._clock = clock
        self._read_counters = counters if counters is not None else default_counters()
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
        return cores_available(self._cpu_count, self._cpu_quota)

    def _memory(self, counters: Counters) -> tuple[dict[str, Any], dict[str, Any]]:
        """(memory and swap figures, the cgroup dict)."""
        if counters.mem_total_bytes is not None and counters.mem_available_bytes is not None:
            total, available = counters.mem_total_bytes, counters.mem_available_bytes
        else:
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


def cores_available(cpu_count: int | None = None, cpu_quota: float | None = None, *,
                    detect_quota: bool = False) -> float:
    """The cores this process may use: the machine's, capped by the cgroup's CPU quota and by the
    CPU affinity (taskset, cpuset, Slurm). `detect_quota` reads the quota here (a one-off caller
    such as `loadertop tune`; the sampler reads it once and passes it)."""
    cores = float(cpu_count or psutil.cpu_count(logical=True) or os.cpu_count() or 1)
    if detect_quota:
        cpu_quota = Cgroup.detect().cpu_quota_cores()
    if cpu_quota is not None:
        cores = min(cores, cpu_quota)
    # Affinity can change while we run, and costs one syscall: read it every time.
    if hasattr(os, "sched_getaffinity"):
        try:
            cores = min(cores, float(len(os.sched_getaffinity(0))))
        except OSError:
            pass
    return cores


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


DEFAULT_SHM_PATH = "/dev/shm"


def shm_figures(path: str = DEFAULT_SHM_PATH) -> dict[str, Any]:
    """The shared-memory file system DataLoader workers hand batches over through (torch's
    ``file_descriptor`` and ``file_system`` strategies both allocate there), by ``statvfs``:
    ``shm_path``, ``shm_total_bytes``, ``shm_free_bytes`` (what an unprivileged process may still
    allocate). The sizes are None where the path does not exist (macOS has no /dev/shm) or is not
    a file system we may ask."""
    try:
        st = os.statvfs(path)
    except (OSError, ValueError):
        return {"shm_path": path, "shm_total_bytes": None, "shm_free_bytes": None}
    total = st.f_blocks * st.f_frsize
    return {"shm_path": path, "shm_total_bytes": total if total > 0 else None,
            "shm_free_bytes": min(st.f_bavail * st.f_frsize, total) if total > 0 else None}


def _load_avg_1m() -> float | None:
    try:
        return float(psutil.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def _clamp_percent(value: float) -> float:
    # Per-CPU tick accounting is not atomic across fields; tiny overshoots happen. Rounding drops
    # float noise (3e-11 %) from subtracting large sums; ticks are 10 ms, so 0.01 % hides nothing.
    return round(min(100.0, max(0.0, value)), 2)
