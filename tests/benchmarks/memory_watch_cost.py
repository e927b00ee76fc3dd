"""What the black box's reading of its memory cgroup costs (docs/blackbox.md "Near the memory
limit", docs/performance.md "The black box").

    python tests/benchmarks/memory_watch_cost.py [--readings 2000]

In a fresh memory cgroup made under this process's own (v1 or v2; root, as CI runs), limited to
1 GiB and removed afterwards: the CPU time of one reading of its usage (`MemoryWatch.read`: the
usage file and `memory.stat`), and of one reading kept in the job's meta (the reading, then the
meta rewritten atomically, as from 80 % of the limit), each the mean over `--readings`. From them
the share of a core far from the limit (one reading per black box wake-up, every 2 s) and near it
(one kept reading every 0.25 s).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

from loadertop import statedir
from loadertop.probe import blackbox
from loadertop.probe.memory_watch import NEAR_S, MemoryWatch
from loadertop.system.cgroup import Cgroup


def _fresh_cgroup() -> tuple[Path, int]:
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, version = Path("/sys/fs/cgroup/memory") / path.lstrip("/"), 1
            break
    else:
        path = next((e.split(":", 2)[2] for e in lines if e.startswith("0::")), "/")
        parent, version = Path("/sys/fs/cgroup") / path.lstrip("/"), 2
    group = parent / f"lt-bench-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    (group / ("memory.limit_in_bytes" if version == 1 else "memory.max")).write_text(str(1 << 30))
    return group, version


def _cpu_per_call(call, n: int) -> float:
    start = time.thread_time()
    for _ in range(n):
        call()
    return (time.thread_time() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--readings", type=int, default=2000)
    args = p.parse_args()
    group, version = _fresh_cgroup()
    try:
        watch = MemoryWatch(Cgroup(version=version, memory_dirs=(str(group),)), str(group))
        with tempfile.TemporaryDirectory() as state:
            box = blackbox.BlackBox(Path(state), pid=os.getpid(), started_at=time.time(), how="instrument")
            box._open()
            meta = box._meta
            assert meta is not None

            def kept() -> None:
                used, limit = watch.read() or (0, 1)
                statedir.write_meta(box.meta_path, msgspec.structs.replace(meta, near_limit=(
                    statedir.MemoryReading(at=time.time(), used_bytes=used, limit_bytes=limit))))

            read_s = _cpu_per_call(watch.read, args.readings)
            kept_s = _cpu_per_call(kept, args.readings)
    finally:
        group.rmdir()
    print(f"cgroup v{version}, {args.readings} readings each")
    print(f"one reading: {read_s * 1e6:.0f} us of CPU; far from the limit (one per "
          f"{blackbox.FLUSH_S:g} s): {read_s / blackbox.FLUSH_S * 100:.4f} % of a core")
    print(f"one reading kept in the meta: {kept_s * 1e6:.0f} us of CPU; near the limit (one per "
          f"{NEAR_S:g} s): {kept_s / NEAR_S * 100:.3f} % of a core")


if __name__ == "__main__":
    main()
