"""What `loadertop.metrics()` costs: a call on the training thread, and its in-process viewer on
the publisher thread (docs/performance.md, "loadertop.metrics()").

    python tests/benchmarks/metrics_call.py [--loaders 4] [--calls 20000] [--seconds 10]

Instruments `--loaders` loaders (num_workers=0, a TensorDataset, a 2 ms "step" per batch), iterates
them in turn on the main thread, starts `loadertop.metrics()`, waits for all of them in its keys,
then times `--calls` calls of `loadertop.metrics()` and of `loadertop.verdict()` (perf_counter_ns
around each, between batches), and the viewer's work on the publisher thread (thread CPU time of
its `add` and `refresh`) over `--seconds`. Prints one line per figure.

Not a pytest test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loaders", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import loadertop
    from loadertop.integrations import metrics as inprocess

    loaders = [loadertop.instrument(DataLoader(TensorDataset(torch.arange(4096.0)), batch_size=8),
                                    name=f"loader{i}") for i in range(args.loaders)]
    iterators = [iter(dl) for dl in loaders]

    def step() -> None:
        for i, it in enumerate(iterators):
            try:
                next(it)
            except StopIteration:
                iterators[i] = iter(loaders[i])
                next(iterators[i])
        time.sleep(0.002)

    step()
    loadertop.metrics()
    viewer = inprocess.viewer()
    assert viewer is not None
    cpu = {"add": 0, "refresh": 0}
    add, refresh = viewer.add, viewer.refresh

    def timed_add(frame: bytes) -> None:
        t0 = time.thread_time_ns()
        add(frame)
        cpu["add"] += time.thread_time_ns() - t0

    def timed_refresh() -> None:
        t0 = time.thread_time_ns()
        refresh()
        cpu["refresh"] += time.thread_time_ns() - t0

    viewer.add, viewer.refresh = timed_add, timed_refresh  # type: ignore[method-assign]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        step()
        keys = loadertop.metrics()
        if all(f"loadertop/loader{i}/batches_per_s" in keys for i in range(args.loaders)):
            break
    else:
        raise SystemExit("the loaders' figures did not appear within 30 s")
    keys = loadertop.metrics()

    cpu["add"] = cpu["refresh"] = 0
    refreshes0 = viewer.refreshes
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        step()
    elapsed = time.monotonic() - started
    refreshes = viewer.refreshes - refreshes0

    per_call: dict[str, list[float]] = {"metrics": [], "verdict": []}
    clock = time.perf_counter_ns
    done = 0
    while done < args.calls:
        step()
        for _ in range(100):
            t0 = clock()
            loadertop.metrics()
            t1 = clock()
            loadertop.verdict()
            t2 = clock()
            per_call["metrics"].append((t1 - t0) / 1000)
            per_call["verdict"].append((t2 - t1) / 1000)
        done += 100

    print(f"loaders {args.loaders}, keys {len(keys)}, python {__import__('sys').version.split()[0]}")
    for name, values in per_call.items():
        values.sort()
        print(f"loadertop.{name}(): mean {statistics.fmean(values):.2f} µs, "
              f"p50 {values[len(values) // 2]:.2f} µs, p99 {values[int(len(values) * 0.99)]:.2f} µs "
              f"over {len(values)} calls")
    print(f"in-process viewer on the publisher thread: {cpu['add'] / 1e6 / elapsed:.2f} ms/s "
          f"ingesting, {cpu['refresh'] / 1e6 / elapsed:.2f} ms/s refreshing "
          f"({refreshes} refreshes in {elapsed:.1f} s: "
          f"{cpu['refresh'] / 1e6 / max(1, refreshes):.2f} ms each)")


if __name__ == "__main__":
    main()
