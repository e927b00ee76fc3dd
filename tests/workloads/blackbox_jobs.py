"""Jobs that end badly with no viewer, for the black box's readers (issues 39, 46, 50).

    python tests/workloads/blackbox_jobs.py MODE [READY_FILE]

Each iterates an instrumented DataLoader (num_workers=0, name "train"), a batch every 0.05 s.

oom: once its black box holds a report (read back from its own state directory: never a fixed
    wait), keeps 16 MiB of touched memory per batch until the kernel's OOM killer takes the
    process (run it inside a memory cgroup with a limit).
oom-near-limit: the same, but it first grows to NEAR_SHARE of its memory cgroup's limit, stays
    there until its black box's meta holds the probe's reading near the limit, then grows on
    until it is killed.
sigterm-in-next: a SIGTERM handler that raises SystemExit(128 + signum), as `loadertop demo`'s job
    and many training scripts have; after 5 batches it creates READY_FILE and its next fetch
    blocks, so the SIGTERM the test sends lands inside next().
sigterm-in-step: the same handler; after 5 batches it creates READY_FILE and sleeps in its step.

A wait that cannot end (no black box, no reading) exits with code 3 after WAIT_S and says why.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

import torch
from recorded_job import holds_a_report
from torch.utils.data import DataLoader, Dataset

import loadertop

NEAR_SHARE = 0.92  # above recording.blackbox.OOM_LIKELY_SHARE: the last reading names the OOM killer
WAIT_S = 60.0
BLOCK_BYTES = 16 * 1024 * 1024
MODES = ("oom", "oom-near-limit", "sigterm-in-next", "sigterm-in-step")


class Small(Dataset):
    """Items at once; from item `block_from` on, the fetch creates `ready` and blocks."""

    def __init__(self, block_from: int | None = None, ready: str | None = None) -> None:
        self.block_from = block_from
        self.ready = ready

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.block_from is not None and i >= self.block_from:
            _touch(self.ready)
            time.sleep(3600)
        return torch.zeros(4)


def _touch(path: str | None) -> None:
    if path:
        with open(path, "w"):
            pass


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _grown(kept: list[bytearray], size: int = BLOCK_BYTES) -> None:
    block = bytearray(size)
    for i in range(0, len(block), 4096):  # touch every page: charged to the cgroup
        block[i] = 1
    kept.append(block)


def _give_up(why: str) -> NoReturn:
    print(f"blackbox_jobs: {why} within {WAIT_S:g} s", file=sys.stderr, flush=True)
    os._exit(3)


def _near_limit_recorded(limit: int) -> bool:
    from loadertop import statedir

    job = statedir.find_job(str(os.getpid()))
    reading = job.meta.near_limit if job is not None else None
    return reading is not None and reading.used_bytes >= NEAR_SHARE * limit


def _up_to_near_the_limit(kept: list[bytearray]) -> int:
    """Grow to NEAR_SHARE of the memory cgroup's limit (in steps of 1/64 of it); its limit."""
    from loadertop.probe.memory_watch import MemoryWatch
    from loadertop.system.cgroup import Cgroup

    watch = MemoryWatch.of(Cgroup.detect())
    reading = watch.read() if watch is not None else None
    if watch is None or reading is None:
        _give_up("no memory cgroup with a limit")
    used, limit = reading
    while used < NEAR_SHARE * limit:
        _grown(kept, min(BLOCK_BYTES, max(4096, limit // 64)))
        reading = watch.read()
        if reading is None:
            _give_up("its memory cgroup unreadable")
        used, limit = reading
    return limit


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in MODES:
        print(f"usage: blackbox_jobs.py {{{','.join(MODES)}}} [READY_FILE]", file=sys.stderr)
        return 2
    mode, ready = argv[0], (argv[1] if len(argv) > 1 else None)
    if mode.startswith("sigterm"):
        signal.signal(signal.SIGTERM, _exit_on_signal)
    block_from = 5 * 8 if mode == "sigterm-in-next" else None
    loader = DataLoader(Small(block_from, ready), batch_size=8)
    kept: list[bytearray] = []
    deadline = time.monotonic() + WAIT_S
    recorded = False
    for n, _ in enumerate(loadertop.instrument(loader, name="train"), 1):
        time.sleep(0.05)
        if mode == "sigterm-in-step" and n == 5:
            _touch(ready)
            time.sleep(3600)
        if not mode.startswith("oom"):
            continue
        if not recorded:
            recorded = holds_a_report(os.getpid())
            if not recorded:
                if time.monotonic() > deadline:
                    _give_up("no report in its black box")
                continue
            if mode == "oom-near-limit":
                limit = _up_to_near_the_limit(kept)
                while not _near_limit_recorded(limit):
                    if time.monotonic() > deadline + WAIT_S:
                        _give_up("no reading near the limit in its black box's meta")
                    time.sleep(0.05)
        _grown(kept)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
