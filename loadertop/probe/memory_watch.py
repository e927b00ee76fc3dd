"""The job's memory cgroup read more often as its usage nears the limit, for the black box
(docs/blackbox.md, "Near the memory limit").

A job the OOM killer takes with no launcher to witness it (a plain `instrument()`), whose cgroup
is removed before anyone reads it (a container runtime, Kubernetes, Slurm), leaves no OOM-kill
counter to read: what it can leave is how near the limit it was a moment before it died. So the
black box's thread (never the training one) reads the usage of the cgroup whose limit binds:

- far from the limit (below WATCH_SHARE of it), once per the thread's usual wake-up and nothing
  more;
- from WATCH_SHARE, every WATCH_S (a fast climb is not missed between two usual wake-ups);
- from NEAR_SHARE, every NEAR_S, each reading kept in the job's meta (`statedir.MemoryReading`),
  and taken off it once the usage falls back below.

A reading is two small cgroup files (the usage, and `memory.stat` for the inactive file cache
the kernel drops before it kills: `Cgroup.mem_used_bytes`): cheap, and at most 1 / NEAR_S a second.
"""

from __future__ import annotations

import os
from typing import Final

from loadertop.system.cgroup import Cgroup, parse_limit_bytes

WATCH_SHARE: Final = 0.5
NEAR_SHARE: Final = 0.8
WATCH_S: Final = 0.5
NEAR_S: Final = 0.25


class MemoryWatch:
    """The binding memory limit of a cgroup chain, and its usage on demand."""

    def __init__(self, group: Cgroup, directory: str) -> None:
        self.group = group
        self.directory = directory
        self._limit_file = os.path.join(directory, "memory.max" if group.version == 2
                                        else "memory.limit_in_bytes")

    @classmethod
    def of(cls, group: Cgroup) -> MemoryWatch | None:
        """The watch of `group`'s binding limit; None when no directory of it has a limit."""
        found = group.mem_limit_dir()
        return cls(group, found[0]) if found is not None else None

    def read(self) -> tuple[int, int] | None:
        """(used bytes, limit bytes) now; None when either cannot be read (the limit lifted, the
        cgroup gone)."""
        try:
            with open(self._limit_file, encoding="ascii") as f:
                limit = parse_limit_bytes(f.read(64))
        except (OSError, ValueError):
            return None
        used = self.group.mem_used_bytes(self.directory)
        if limit is None or used is None:
            return None
        return used, limit


def next_reading_s(used: int, limit: int, idle_s: float) -> float:
    """How soon to read again: `idle_s` (the thread's usual wake-up) far from the limit, WATCH_S
    from WATCH_SHARE of it, NEAR_S from NEAR_SHARE."""
    share = used / limit
    if share >= NEAR_SHARE:
        return NEAR_S
    if share >= WATCH_SHARE:
        return min(WATCH_S, idle_s)
    return idle_s
