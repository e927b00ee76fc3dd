"""What the shim costs the training loop, measured against the plain loop in the same run.

    python tests/benchmarks/overhead.py [--batches 20000] [--rounds 7]

1. Hot path: the same fast loader (TensorDataset, batch_size=1, num_workers=0) iterated plain and
   instrumented, alternated over several rounds; prints the median ns per batch of each and the
   difference (goal: <= 300 ns added per batch).
2. Frozen viewer: the instrumented loop with no viewer vs with a real subscriber process frozen by
   SIGSTOP (its socket buffers fill, the publisher must drop, never block); prints the throughput
   ratio (goal: >= 0.99).
Alternating rounds cancel slow drift of the machine; medians ignore the odd hiccup.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import loadertop


def ns_per_batch(loader) -> float:
    t0 = time.perf_counter_ns()
    n = 0
    for _ in loader:
        n += 1
    return (time.perf_counter_ns() - t0) / n


def hot_path(batches: int, rounds: int) -> tuple[float, float]:
    data = TensorDataset(torch.arange(batches))
    plain = DataLoader(data, batch_size=1, num_workers=0)
    instrumented = loadertop.instrument(DataLoader(data, batch_size=1, num_workers=0), name="bench")
    ns_per_batch(plain), ns_per_batch(instrumented)  # warm up both
    plain_ns, inst_ns = [], []
    for _ in range(rounds):
        plain_ns.append(ns_per_batch(plain))
        inst_ns.append(ns_per_batch(instrumented))
    return statistics.median(plain_ns), statistics.median(inst_ns)


def frozen_viewer(batches: int, rounds: int) -> tuple[float, float]:
    """Batches/s of an instrumented loop without a viewer, then with a SIGSTOP-frozen one."""
    from loadertop.probe.publisher import get_publisher

    data = TensorDataset(torch.arange(batches))
    loader = loadertop.instrument(DataLoader(data, batch_size=1, num_workers=0), name="frozen")
    endpoint = get_publisher().endpoint
    without = [batches * 1e9 / (ns_per_batch(loader) * batches) for _ in range(rounds)]
    viewer = subprocess.Popen(
        [sys.executable, "-m", "loadertop", "snapshot", "--seconds", "600", endpoint],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        # Freeze it only once it has subscribed (the XPUB sees each subscription).
        while get_publisher().subscriptions == 0:
            if time.monotonic() > deadline:
                raise SystemExit("the viewer did not subscribe within 20 s")
            ns_per_batch(loader)
        ns_per_batch(loader)  # it now receives reports: let some go through before the freeze
        os.kill(viewer.pid, signal.SIGSTOP)
        with_frozen = [batches * 1e9 / (ns_per_batch(loader) * batches) for _ in range(rounds)]
    finally:
        os.kill(viewer.pid, signal.SIGCONT)
        viewer.kill()
        viewer.wait()
    return statistics.median(without), statistics.median(with_frozen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("LOADERTOP_DIR", tempfile.mkdtemp(prefix="ltbench"))
    torch.set_num_threads(1)

    plain, inst = hot_path(args.batches, args.rounds)
    print(f"hot path, {args.batches} batches x {args.rounds} rounds (median ns/batch):")
    print(f"  plain        {plain:8.0f} ns")
    print(f"  instrumented {inst:8.0f} ns")
    print(f"  added        {inst - plain:8.0f} ns per batch  (goal <= 300)  ratio {plain / inst:.4f}")

    without, frozen = frozen_viewer(args.batches, args.rounds)
    print("frozen viewer (instrumented loop, median batches/s):")
    print(f"  no viewer         {without:10.0f}")
    print(f"  SIGSTOPped viewer {frozen:10.0f}")
    print(f"  ratio             {frozen / without:10.4f}  (goal >= 0.99)")


if __name__ == "__main__":
    main()
