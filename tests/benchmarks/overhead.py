"""What the shim costs the training loop, measured against the plain loop in the same run.

    python tests/benchmarks/overhead.py [--batches 20000] [--rounds 7]

1. Hot path: the same fast loader (TensorDataset, batch_size=1, num_workers=0) iterated plain,
   plain again (the A/A pair, to show the noise) and instrumented, in a shuffled order every
   round; prints the median ns per batch and the median per-round differences (goal: <= 300 ns
   added per batch), then the wrapper alone around a trivial iterator (a figure without the
   DataLoader's own noise of several µs per batch), with its own A/A pair.
2. Frozen viewer: the instrumented loop with no viewer vs with a real subscriber process frozen by
   SIGSTOP (its socket buffers fill, the publisher must drop, never block), alternating rounds;
   prints the throughput ratio (goal: >= 0.99).
Shuffled or alternating rounds cancel slow drift of the machine; medians ignore the odd hiccup.
"""

from __future__ import annotations

import argparse
import os
import random
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


def hot_path(batches: int, rounds: int) -> tuple[float, float, float, float]:
    """Median ns/batch plain and instrumented, the median of the per-round differences, and the
    same difference between two plain loaders (the A/A pair: what a difference of nothing
    measures here, i.e. the noise)."""
    data = TensorDataset(torch.arange(batches))
    variants = {"plain": DataLoader(data, batch_size=1, num_workers=0),
                "plain again": DataLoader(data, batch_size=1, num_workers=0),
                "instrumented": loadertop.instrument(DataLoader(data, batch_size=1, num_workers=0),
                                                     name="bench")}
    for loader in variants.values():
        ns_per_batch(loader)  # warm up
    rng = random.Random(0)
    ns: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)  # a new order every round: a drift of the machine favours none
        for name in order:
            ns[name].append(ns_per_batch(variants[name]))
    diffs = [b - a for a, b in zip(ns["plain"], ns["instrumented"])]
    aa = [b - a for a, b in zip(ns["plain"], ns["plain again"])]
    return (statistics.median(ns["plain"]), statistics.median(ns["instrumented"]),
            statistics.median(diffs), statistics.median(aa))


class _PythonIterator:
    """Shaped like torch's _BaseDataLoaderIter: a Python __next__ that calls _next_data()."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def _next_data(self):
        self.i += 1
        if self.i > self.n:
            raise StopIteration
        return self.i

    def __next__(self):
        return self._next_data()


def wrapper_only(calls: int, rounds: int) -> dict[str, float]:
    """The hot path alone: ns added per next() by each wrapper around an iterator shaped like the
    DataLoader's own (a Python __next__), median over rounds. Without the DataLoader's several µs
    of per-batch work, and its noise, the few hundred ns are measurable."""
    from loadertop.probe.loader import _InstrumentedIterator, _SingleProcessIterator

    record = loadertop.instrument(DataLoader(TensorDataset(torch.arange(2))), name="micro")._lt_record

    def per_call(it) -> float:
        t0 = time.perf_counter_ns()
        for _ in it:
            pass
        return (time.perf_counter_ns() - t0) / calls

    variants = {"bare": lambda: _PythonIterator(calls),
                "A/A (bare again)": lambda: _PythonIterator(calls),
                "num_workers>0": lambda: _InstrumentedIterator(_PythonIterator(calls), record),
                "num_workers=0": lambda: _SingleProcessIterator(_PythonIterator(calls), record)}
    rng = random.Random(1)
    added: dict[str, list[float]] = {name: [] for name in variants if name != "bare"}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        took = {name: per_call(variants[name]()) for name in order}
        for name in added:
            added[name].append(took[name] - took["bare"])
        # No record.drain() here: the publisher thread drains the record at every report, and a
        # second drainer on another thread races it (seen: IndexError, pop from an empty deque).
    return {k: statistics.median(v) for k, v in added.items()}


def frozen_viewer(batches: int, rounds: int) -> tuple[float, float]:
    """Median batches/s of an instrumented loop without a viewer and with a SIGSTOP-frozen one,
    alternating: each frozen round starts a fresh viewer, waits until it has subscribed, freezes
    it, measures, then kills it."""
    from loadertop.probe.publisher import get_publisher

    data = TensorDataset(torch.arange(batches))
    loader = loadertop.instrument(DataLoader(data, batch_size=1, num_workers=0), name="frozen")
    publisher = get_publisher()
    endpoint = publisher.endpoint
    without, frozen = [], []
    for _ in range(rounds):
        without.append(1e9 / ns_per_batch(loader))
        viewer = subprocess.Popen(
            [sys.executable, "-m", "loadertop", "snapshot", "--seconds", "600", endpoint],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while publisher.subscriptions == 0:  # the XPUB sees each subscription
                if time.monotonic() > deadline:
                    raise SystemExit("the viewer did not subscribe within 20 s")
                time.sleep(0.01)
            os.kill(viewer.pid, signal.SIGSTOP)
            frozen.append(1e9 / ns_per_batch(loader))
        finally:
            os.kill(viewer.pid, signal.SIGCONT)
            viewer.kill()
            viewer.wait()
        deadline = time.monotonic() + 5
        while publisher.subscriptions and time.monotonic() < deadline:
            time.sleep(0.01)
    return statistics.median(without), statistics.median(frozen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    os.environ.setdefault("LOADERTOP_DIR", tempfile.mkdtemp(prefix="ltbench"))
    torch.set_num_threads(1)

    plain, inst, added, aa = hot_path(args.batches, args.rounds)
    print(f"DataLoader loop, {args.batches} batches x {args.rounds} rounds, order shuffled each "
          f"round (median ns/batch):")
    print(f"  plain        {plain:8.0f} ns")
    print(f"  instrumented {inst:8.0f} ns")
    print(f"  added        {added:8.0f} ns per batch (median of per-round differences; goal <= 300)"
          f"  throughput ratio {plain / inst:.4f}")
    print(f"  A/A          {aa:8.0f} ns (plain vs plain: the noise; a smaller 'added' is not resolved)")
    micro = wrapper_only(500_000, args.rounds)
    for kind, ns in micro.items():
        goal = " (the noise)" if kind.startswith("A/A") else " (goal <= 300)"
        print(f"hot path alone, {kind} iterator: {ns:5.0f} ns added per next(){goal}")

    without, frozen = frozen_viewer(args.batches, max(3, args.rounds // 2))
    print("frozen viewer (instrumented loop, median batches/s, alternating rounds):")
    print(f"  no viewer         {without:10.0f}")
    print(f"  SIGSTOPped viewer {frozen:10.0f}")
    print(f"  ratio             {frozen / without:10.4f}  (goal >= 0.99)")


if __name__ == "__main__":
    main()
