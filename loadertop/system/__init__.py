"""Readers of the machine's state: CPU, memory, swap, disk, cgroup limits and GPUs.

No torch and no textual here: the probe (inside training) and the viewer both use this package.

    sampler = SystemSampler()          # GPUs through NVML when a driver is present
    doc = sampler.sample()             # a JSON-able dict; call about once a second
    sampler.close()                    # releases NVML

`sample()` returns exactly these keys (a figure that cannot be known is None, never a made-up 0;
rates and percentages are None on the first call, which has nothing to compare with):

    host, cpu_count, cores_available,
    cpu_percent, per_cpu_percent, iowait_percent, load_avg_1m,
    mem_total_bytes, mem_available_bytes, mem_used_percent,      # cgroup-aware
    swap_total_bytes, swap_used_bytes, swap_in_bytes_per_s, swap_out_bytes_per_s,
    disk_read_bytes_per_s, disk_write_bytes_per_s,
    cgroup: {version, cpu_quota_cores, mem_limit_bytes, mem_used_bytes},
    gpu_status: "ok" | "no_nvml" | "no_gpu" | "error: <reason>",
    gpus: [{index, name, uuid, util_percent, mem_util_percent, mem_used_bytes, mem_total_bytes,
            temperature_c, power_w, power_limit_w, processes: [{pid, used_mem_bytes}]}]
"""

from typing import TYPE_CHECKING

from .gpu import GpuReader, NvmlGpuReader

if TYPE_CHECKING:
    from .host import SystemSampler

__all__ = ["GpuReader", "NvmlGpuReader", "SystemSampler"]


def __getattr__(name: str) -> object:
    # SystemSampler is loaded on first use: its module imports psutil, which the probe's black
    # box (reading only `cgroup`, at a program's first loader) must not pull onto the training
    # thread (probe/publisher.py loads psutil on its own thread, holding forks off meanwhile).
    if name == "SystemSampler":
        from .host import SystemSampler

        return SystemSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
