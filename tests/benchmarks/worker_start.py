"""What a DataLoader worker pays for loadertop at its start, measured against plain in one run.

    python tests/benchmarks/worker_start.py [--rounds 100] [--loaders 150]

1. primitives: a process forked from one that has imported torch (a large address space shared
   copy-on-write, as a fork worker's) does one thing, then touches 3,000 of its parent's pages as
   a worker's first batches do; the CPU time of the whole child (user + sys, from wait4) over a
   child that does nothing, rounds shuffled, with an A/A pair. A thread started there (waiting,
   never running again); `import faulthandler` in the child, alone and followed by
   `dump_traceback_later` (a C watchdog thread), as loadertop's workers once did both; a stack file
   created on disk; a memfd; a socket connected to a listener.
2. loaders: 2-worker fork loaders made, iterated (4 batches) and dropped one after another, plain
   (twice: A/A) and with `loadertop.instrument`, shuffled: wall time per loader and the workers'
   CPU time (RUSAGE_CHILDREN: torch joins its workers), the difference of medians per round.

A difference within the A/A's is printed as "not resolved".
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import socket
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import loadertop

PAGES = 3000


def _child(mode: str, buf: bytearray, listen_path: str, scratch: str) -> None:
    if mode == "thread":
        import _thread

        lock = _thread.allocate_lock()
        lock.acquire()
        _thread.start_new_thread(lock.acquire, (True, 30))
    elif mode == "import + dump_traceback_later":
        import faulthandler

        faulthandler.dump_traceback_later(30, file=2)
    elif mode == "import faulthandler":
        import faulthandler
    elif mode == "file on disk":
        os.open(os.path.join(scratch, f"{os.getpid()}.txt"),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
    elif mode == "memfd":
        os.memfd_create("bench", os.MFD_CLOEXEC)
    elif mode == "socket connect":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        sock.connect(listen_path)
    for i in range(0, len(buf), 4096):
        buf[i] = 2
    os._exit(0)


def primitives(rounds: int) -> None:
    sys.modules.pop("faulthandler", None)  # imported by the child alone in "import faulthandler"
    buf = bytearray(4096 * PAGES)
    for i in range(0, len(buf), 4096):
        buf[i] = 1
    scratch = tempfile.mkdtemp(prefix="ltworker")
    listen_path = os.path.join(scratch, "inbox.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(listen_path)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    modes = ["nothing", "nothing again", "thread", "import + dump_traceback_later",
             "import faulthandler",
             "file on disk", "memfd", "socket connect"]
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    rng = random.Random(0)
    for _ in range(rounds):
        order = modes[:]
        rng.shuffle(order)
        for mode in order:
            pid = os.fork()
            if pid == 0:
                _child(mode, buf, listen_path, scratch)
            _, _, usage = os.wait4(pid, 0)
            cpu[mode].append((usage.ru_utime + usage.ru_stime) * 1e6)
            while True:
                try:
                    listener.accept()[0].close()
                except BlockingIOError:
                    break
        for name in os.listdir(scratch):
            if name.endswith(".txt"):
                os.unlink(os.path.join(scratch, name))
    print(f"1. primitives in a child forked from a torch process, then {PAGES} pages touched, "
          f"{rounds} rounds, shuffled (CPU µs of the child):")
    _report(cpu, "nothing", "nothing again", " us", 0)


def loaders(count: int) -> None:
    data = TensorDataset(torch.arange(256, dtype=torch.float32).reshape(64, 4))

    def one(instrumented: bool) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
        if instrumented:
            loader = loadertop.instrument(loader, name="bench")
        it = iter(loader)
        for _ in range(4):
            next(it)
        del it, loader
        took = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return took * 1e3, (after.ru_utime + after.ru_stime - before.ru_utime
                            - before.ru_stime) * 1e3

    variants = {"plain": False, "plain again": False, "instrumented": True}
    for flag in variants.values():
        one(flag)  # warm up (the probe's start is not counted)
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    rng = random.Random(1)
    for _ in range(count):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            w, c = one(variants[name])
            wall[name].append(w)
            cpu[name].append(c)
    print(f"2. 2-worker fork loaders (4 batches each), {count} rounds, shuffled:")
    print("  wall ms per loader:")
    _report(wall, "plain", "plain again", " ms", 2)
    print("  workers' CPU ms per loader:")
    _report(cpu, "plain", "plain again", " ms", 2)


def _report(values: dict[str, list[float]], base: str, again: str, unit: str,
            digits: int) -> None:
    aa = statistics.median(x - y for x, y in zip(values[again], values[base]))
    aa_low = min(values[again]) - min(values[base])
    spread = max(abs(aa), abs(aa_low))
    for name, v in values.items():
        diff = statistics.median(x - y for x, y in zip(v, values[base]))
        low = min(v) - min(values[base])
        shown = [f"{d:+.{digits}f}{unit}" if abs(d) > spread else "not resolved"
                 for d in (diff, low)]
        print(f"    {name:29} median {statistics.median(v):10.{digits}f}{unit}  "
              f"min {min(v):10.{digits}f}{unit}   - {base}: median {shown[0]:>14}, "
              f"min {shown[1]:>14}")
    print(f"    (A/A: median {aa:+.{digits}f}{unit}, min {aa_low:+.{digits}f}{unit})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--loaders", type=int, default=150)
    parser.add_argument("--only", default="primitives,loaders")
    args = parser.parse_args()
    os.environ.setdefault("LOADERTOP_DIR", tempfile.mkdtemp(prefix="ltbench"))
    torch.set_num_threads(1)
    only = set(args.only.split(","))
    if "primitives" in only:
        primitives(args.rounds)
    if "loaders" in only:
        loaders(args.loaders)


if __name__ == "__main__":
    main()
