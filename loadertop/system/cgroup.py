"""Read the CPU and memory limits a cgroup puts on this process (Linux, v1 and v2).

In a container, `psutil` reports the host's RAM and cores, not what the process may use. A loader
with 16 workers in a 4-core, 8 GiB container is judged against the wrong machine unless we read
the limits here.

Everything takes the cgroup mount point (`root`) and the path of a `/proc/<pid>/cgroup` file as
arguments, so tests can point them at a temp dir of fake files. Nothing here raises on a missing
or unreadable file: the answer is then "no limit known" (None).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

DEFAULT_ROOT = "/sys/fs/cgroup"
DEFAULT_PROC_CGROUP = "/proc/self/cgroup"

# v1 writes "no limit" as a huge page-rounded number (9223372036854771712 on x86-64), not "max".
# Anything at or above 2**60 bytes (1 EiB) is no real limit.
_UNLIMITED_BYTES = 1 << 60

_Number = TypeVar("_Number", int, float)


@dataclass(frozen=True)
class Cgroup:
    """Where this process's cgroup lives.

    `cpu_dirs` / `memory_dirs` run from the process's own cgroup up to the mount root: a limit set
    on any ancestor applies too, so the effective limit is the smallest along the chain. Usage is
    read from the first (the process's own) directory.
    """

    version: int | None
    cpu_dirs: tuple[str, ...] = field(default=())
    memory_dirs: tuple[str, ...] = field(default=())

    @classmethod
    def detect(cls, root: str = DEFAULT_ROOT, proc_cgroup: str = DEFAULT_PROC_CGROUP) -> Cgroup:
        """Find the cgroup version and this process's directories under `root`."""
        paths = _parse_proc_cgroup(_read_text(proc_cgroup) or "")
        # A pure v2 mount has cgroup.controllers at its root. Hybrid hosts (v1 controllers plus an
        # empty v2 tree under root/unified) count as v1: that is where the limits are.
        if os.path.isfile(os.path.join(root, "cgroup.controllers")):
            dirs = _ancestry(root, paths.get("", "/"))
            return cls(version=2, cpu_dirs=dirs, memory_dirs=dirs)
        cpu_mount = _v1_mount(root, ("cpu", "cpu,cpuacct", "cpuacct,cpu"))
        mem_mount = _v1_mount(root, ("memory",))
        if cpu_mount is None and mem_mount is None:
            return cls(version=None)
        return cls(
            version=1,
            cpu_dirs=_ancestry(cpu_mount, paths.get("cpu", "/")) if cpu_mount else (),
            memory_dirs=_ancestry(mem_mount, paths.get("memory", "/")) if mem_mount else (),
        )

    def cpu_quota_cores(self) -> float | None:
        """The CPU quota in cores (e.g. 1.5), or None when there is none."""
        reader = _cpu_quota_v2 if self.version == 2 else _cpu_quota_v1
        return _smallest(reader(d) for d in self.cpu_dirs)

    def mem_limit_bytes(self) -> int | None:
        """The memory limit in bytes, or None when there is none."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return _smallest(parse_limit_bytes(_read_text(os.path.join(d, name))) for d in self.memory_dirs)

    def mem_limit_dir(self) -> tuple[str, int] | None:
        """The directory whose memory limit binds (the smallest along the chain) and that limit,
        or None when there is none: its usage is what the limit is reached by."""
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        found: tuple[str, int] | None = None
        for directory in self.memory_dirs:
            limit = parse_limit_bytes(_read_text(os.path.join(directory, name)))
            if limit is not None and (found is None or limit < found[1]):
                found = (directory, limit)
        return found

    def mem_used_bytes(self, directory: str | None = None) -> int | None:
        """Memory charged to this cgroup (or to `directory`, one of its ancestors), less inactive
        file cache (as `docker stats` counts it).

        Page cache that the kernel can drop on demand is charged to the cgroup but is not pressure;
        without subtracting it a container that read a big dataset once looks nearly full.
        """
        if not self.memory_dirs:
            return None
        own = self.memory_dirs[0] if directory is None else directory
        if self.version == 2:
            usage_file, cache_key = "memory.current", "inactive_file"
        else:
            # v1's total_inactive_file includes child cgroups, matching usage_in_bytes.
            usage_file, cache_key = "memory.usage_in_bytes", "total_inactive_file"
        usage = _parse_int(_read_text(os.path.join(own, usage_file)))
        if usage is None:
            return None
        text = _read_text(os.path.join(own, "memory.stat")) or ""
        inactive = stat_value(text, cache_key)
        if inactive is None:
            inactive = stat_value(text, "inactive_file") or 0
        return usage - inactive if inactive < usage else usage


# --- the OOM killer's traces ------------------------------------------------------------------


@dataclass(frozen=True)
class OomCounts:
    """The kernel's count of OOM kills in one memory cgroup: `kills` (v1 `memory.oom_control`
    `oom_kill`, since Linux 4.13; v2 `memory.events` `oom_kill`) and, v2 only, `group_kills`
    (`oom_group_kill`, since Linux 5.18: the cgroup killed whole, `memory.oom.group`). None where
    the kernel keeps no such count or the file cannot be read (the cgroup removed)."""

    kills: int | None = None
    group_kills: int | None = None

    def risen_since(self, before: OomCounts) -> OomCounts:
        """The kills counted since `before` (None where either side is unknown)."""
        return OomCounts(_difference(self.kills, before.kills),
                         _difference(self.group_kills, before.group_kills))

    def any(self) -> bool:
        return bool(self.kills) or bool(self.group_kills)


def oom_counts(directory: str, version: int | None) -> OomCounts:
    """The OOM-kill counters of the memory cgroup `directory` now.

    Which cgroup counts a kill: the victim's own (v1 counts there only; v2 also in every
    ancestor's `memory.events`), whichever limit, or the machine's memory, set the killer off.
    So a job's own innermost cgroup counts its processes' kills and nothing of its siblings'."""
    text = _read_text(os.path.join(directory, "memory.events" if version == 2 else "memory.oom_control"))
    if text is None:
        return OomCounts()
    return OomCounts(stat_value(text, "oom_kill"),
                     stat_value(text, "oom_group_kill") if version == 2 else None)


def peak_bytes(directory: str, version: int | None) -> int | None:
    """The most memory ever charged to the cgroup (v1 `memory.max_usage_in_bytes`; v2
    `memory.peak`, since Linux 5.19), None where it is not kept."""
    name = "memory.peak" if version == 2 else "memory.max_usage_in_bytes"
    return _parse_int(_read_text(os.path.join(directory, name)))


def _difference(now: int | None, before: int | None) -> int | None:
    return max(0, now - before) if now is not None and before is not None else None


# --- parsers (pure) ---------------------------------------------------------------------------


def parse_cpu_max(text: str | None) -> float | None:
    """Parse v2 `cpu.max` ("max 100000" or "150000 100000") into cores."""
    if not text:
        return None
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = _parse_int(parts[0])
    period = _parse_int(parts[1]) if len(parts) > 1 else 100_000  # the kernel's default period
    return _quota_to_cores(quota, period)


def parse_limit_bytes(text: str | None) -> int | None:
    """Parse a memory limit file: "max", a huge v1 number or an unreadable file mean None."""
    value = _parse_int(text)
    if value is None or value <= 0 or value >= _UNLIMITED_BYTES:
        return None
    return value


def parse_memory_stat(text: str) -> dict[str, int]:
    """Parse `memory.stat` ("key value" lines) into a dict of ints; bad lines are skipped."""
    stat: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        number = _parse_int(value)
        if number is not None:
            stat[key] = number
    return stat


def stat_value(text: str, key: str) -> int | None:
    """The value of one "key value" line of `memory.stat`, without parsing the other ~40 lines."""
    at = text.find(key + " ")
    while at > 0 and text[at - 1] != "\n":
        at = text.find(key + " ", at + 1)
    if at < 0:
        return None
    end = text.find("\n", at)
    return _parse_int(text[at + len(key) + 1:end if end >= 0 else None])


# --- helpers ----------------------------------------------------------------------------------


def _cpu_quota_v2(directory: str) -> float | None:
    return parse_cpu_max(_read_text(os.path.join(directory, "cpu.max")))


def _cpu_quota_v1(directory: str) -> float | None:
    quota = _parse_int(_read_text(os.path.join(directory, "cpu.cfs_quota_us")))
    period = _parse_int(_read_text(os.path.join(directory, "cpu.cfs_period_us")))
    return _quota_to_cores(quota, period)


def _quota_to_cores(quota: int | None, period: int | None) -> float | None:
    # v1 writes -1 for "no quota".
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _parse_proc_cgroup(text: str) -> dict[str, str]:
    """Map controller name -> cgroup path from /proc/<pid>/cgroup; the v2 entry is under ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            paths[""] = path
        for name in controllers.split(","):
            if name:
                paths[name] = path
    return paths


def _v1_mount(root: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        candidate = os.path.join(root, name)
        if os.path.isdir(candidate):
            return candidate
    return None


def _ancestry(mount: str, cgroup_path: str) -> tuple[str, ...]:
    """The process's cgroup directory and its ancestors up to `mount`, innermost first.

    Inside a container without its own cgroup namespace, /proc/self/cgroup names a host path
    ("/docker/<id>") while the container's own cgroup is mounted at the root; when the named
    directory doesn't exist under the mount, the mount root is the process's cgroup.
    """
    relative = cgroup_path.strip("/")
    leaf = os.path.join(mount, relative) if relative else mount
    if not os.path.isdir(leaf):
        return (mount,)
    dirs = [leaf]
    parts = relative.split("/") if relative else []
    while parts:
        parts.pop()
        dirs.append(os.path.join(mount, *parts) if parts else mount)
    return tuple(dirs)


def _smallest(values: Iterable[_Number | None]) -> _Number | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def _parse_int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None
