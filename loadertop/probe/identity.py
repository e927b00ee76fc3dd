"""Who this process is, as a source names it: its start time and command line."""

from __future__ import annotations

import os
import sys
import time


def process_identity() -> tuple[float, str]:
    """(start time, command line) of this process, as psutil gives them (its create_time() and
    cmdline()), read from /proc on Linux without importing psutil; psutil elsewhere."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22: starttime
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().rstrip(b"\0").split(b"\0")
        command = " ".join(a.decode(errors="replace") for a in argv)
        return boot + start_ticks / os.sysconf("SC_CLK_TCK"), command
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    try:
        import psutil  # not Linux: on the caller's thread, before the publisher thread starts

        proc = psutil.Process()
        return proc.create_time(), " ".join(proc.cmdline())
    except Exception:
        return time.time(), " ".join(sys.argv)
