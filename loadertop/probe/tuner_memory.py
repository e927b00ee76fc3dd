"""`run --autotune`'s memory (docs/autotune.md, "Memory"; docs/contract.md §10): pressure now,
on which the tuner backs off at once, and before it tries more workers, what they would take.

The prediction reads each current worker's USS (`/proc/PID/smaps_rollup`: its private pages, what
another worker of the same loader would add) at most every `READ_S` while the tuner explores,
and from the first and the latest reading of a worker its growth: copy-on-read (a forked worker
that reads the dataset's Python objects writes their reference counts, and so copies their pages
one by one) shows as a private size that grows while it works. A worker of the next count is
predicted at the largest of the current workers' sizes, grown at its rate for the rest of the
epoch (at least HORIZON_MIN_S, at most HORIZON_MAX_S: it reads again while it explores), and by
no more than the main process's resident size (all a forked worker can copy of it). The most
workers the memory allows keep the whole under the same margin whose crossing backs off:
available memory over `MEMORY_MARGIN` of the machine's, and the cgroup's use under
`1 - MEMORY_MARGIN` of its limit.

A reading costs the kernel a walk of the worker's resident pages (probe/resources.py), done inside
`read()` with the GIL released, on the publisher thread: never the training thread's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

MEMORY_MARGIN = 0.10  # available memory (or what the cgroup limit leaves) under 10 %: pressure
READ_S = 1.0  # the workers' USS at most this often, while exploring
GROWTH_MIN_S = 1.0  # a worker's growth is read from readings at least this far apart
HORIZON_MIN_S = 10.0  # a worker's growth is carried this far ahead at least ...
HORIZON_MAX_S = 60.0  # ... and at most: the tuner reads again while it explores


def swap_pages() -> int | None:
    """Pages swapped in and out since boot (/proc/vmstat)."""
    try:
        with open("/proc/vmstat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"pswpin ", b"pswpout ")):
            total += int(line.split()[1])
    return total


def _meminfo() -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes."""
    try:
        with open("/proc/meminfo", "rb") as f:
            info = {line.split(b":")[0]: int(line.split()[1]) * 1024 for line in f if b":" in line
                    and len(line.split()) >= 2 and line.split()[1].isdigit()}
    except (OSError, ValueError):
        return None
    total, available = info.get(b"MemTotal"), info.get(b"MemAvailable")
    return (total, available) if total and available is not None else None


def _cgroup() -> tuple[int, int] | None:
    """(limit, used) of this process's memory cgroup, where it has a limit."""
    try:
        from loadertop.system.cgroup import Cgroup

        group = Cgroup.detect()
        limit, used = group.mem_limit_bytes(), group.mem_used_bytes()
    except Exception:
        return None
    return (limit, used) if limit and used is not None else None


def memory_short() -> str | None:
    """Why memory is short now (None: it is not)."""
    machine = _meminfo()
    if machine is not None and machine[1] < MEMORY_MARGIN * machine[0]:
        return f"available memory {machine[1] / machine[0]:.0%} of the machine's"
    group = _cgroup()
    if group is not None and group[0] - group[1] < MEMORY_MARGIN * group[0]:
        return f"the cgroup's memory limit {group[1] / group[0]:.0%} used"
    return None


def headroom() -> tuple[int, str] | None:
    """(bytes that may still be taken before the margin, where that bound is), the tighter of
    the machine's and the cgroup's; None where neither can be read."""
    bounds: list[tuple[int, str]] = []
    machine = _meminfo()
    if machine is not None:
        bounds.append((machine[1] - int(MEMORY_MARGIN * machine[0]), "available memory"))
    group = _cgroup()
    if group is not None:
        bounds.append((int((1 - MEMORY_MARGIN) * group[0]) - group[1], "the cgroup's limit"))
    return min(bounds) if bounds else None


def _resident_bytes() -> int | None:
    """This (the main) process's resident size, from /proc/self/statm."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def uss_bytes(pid: int) -> int | None:
    """A process's private memory (what psutil calls USS), from /proc/PID/smaps_rollup."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return None
    total = 0
    for line in text.splitlines():
        if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Private_Hugetlb:")):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                total += int(parts[1]) * 1024
    return total


class MemoryPlan:
    """The workers' memory as read so far, and the most workers it allows (publisher thread)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: dict[int, tuple[float, int]] = {}  # pid -> (when, USS) of its first reading
        self._latest: dict[int, tuple[float, int]] = {}
        self._read_at = float("-inf")

    def read(self, pids: Iterable[int]) -> bool:
        """Read the USS of the current workers `pids`, at most every READ_S; forget the others.
        True when a reading was taken."""
        now = self._clock()
        if now - self._read_at < READ_S:
            return False
        self._read_at = now
        current = set(pids)
        for gone in set(self._latest) - current:
            self._first.pop(gone, None)
            del self._latest[gone]
        for pid in current:
            uss = uss_bytes(pid)
            if uss is None:
                continue
            self._first.setdefault(pid, (now, uss))
            self._latest[pid] = (now, uss)
        return True

    def per_worker(self, horizon_s: float, bound: int | None = None) -> int | None:
        """A worker's predicted private memory `horizon_s` from now (clamped to the HORIZON
        bounds): the largest current one, grown at its measured rate by at most `bound`."""
        horizon_s = min(HORIZON_MAX_S, max(HORIZON_MIN_S, horizon_s))
        out = None
        for pid, (t1, uss) in self._latest.items():
            t0, first = self._first[pid]
            growth = (uss - first) / (t1 - t0) if t1 - t0 >= GROWTH_MIN_S and uss > first else 0.0
            grown = int(growth * horizon_s)
            predicted = uss + (min(grown, bound) if bound is not None else grown)
            out = predicted if out is None else max(out, predicted)
        return out

    def cap(self, horizon_s: float) -> tuple[int | None, str]:
        """(The most workers predicted to stay within the margin, why); (None, "") where it
        cannot be told yet (no reading, or memory unreadable)."""
        each = self.per_worker(horizon_s, _resident_bytes())
        room = headroom()
        if each is None or each <= 0 or room is None:
            return None, ""
        now = sum(uss for _, uss in self._latest.values())
        most = max(1, int((room[0] + now) // each))
        return most, (f"{most + 1} workers of {each / 2**20:.0f} MiB each would pass "
                      f"{1 - MEMORY_MARGIN:.0%} of {room[1]}")
