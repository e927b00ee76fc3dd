"""What the shim costs the training loop, measured against the plain loop in the same run.

    python tests/benchmarks/overhead.py [--batches 5000] [--rounds 21] [--slice 50]
                                        [--frozen-seconds 1]
                                        [--epoch-rounds 3] [--epoch-contexts fork,spawn,forkserver]
                                        [--short-rounds 3] [--only hot,micro,frozen,epoch,short]

Every section runs its variants in a new shuffled order each round (a slow drift of the machine
favours none) and includes an A/A pair: the plain variant measured twice under two names. Every
A/B difference is printed with its median over rounds (of the per-round differences) and the
difference of the minimums, beside the same two statistics of the A/A pair; a difference no
larger than the A/A spread (the larger of the A/A's two statistics) prints as "not resolved":
this machine cannot tell it from nothing.

1. hot: the fastest loader (TensorDataset, batch_size=1, num_workers=0), ns per batch: plain,
   plain again (A/A), a minimal wrapper (two clock reads, two deque appends) and
   `loadertop.instrument`; where the C hot path is built (loader.HOT_PATH == "c"), `instrument`
   on the pure-Python one too: what a user on an install without it pays. Within a round the
   variants take turns in slices of --slice batches (50: ~1 ms), shuffled each time: this VM's
   speed drifts within a second, and rounds of 5,000 batches per variant left an A/A spread of
   1-2 µs. The publisher thread's drains hold the GIL, but land in whichever variant's slice
   is running, so its cost is read from its own CPU clock instead, per drained batch (an upper
   bound of the time it takes the GIL from the loop), and added to `instrument`'s: goal
   <= 1500 ns added per batch. (The A/A pair covers the loop's timings, not that clock: its own
   spread is its median beside its minimum.) One share is overstated: the num_workers=0
   iterator measures one batch in detail per 10 ms of wall time (~5-6 µs more than a plain
   batch here), so taking turns with the other variants its batches meet ~5x as many of those
   as a loop alone would (ad hoc, six variants: sampling on vs off +138 and +189 ns a batch).
2. micro: the iterator wrappers alone around a Python iterator shaped like torch's (no
   DataLoader noise), ns added per next(); both hot paths where the C one is built; the
   multi-worker one under `--autotune` (the same per-batch path between switches), and during a
   switch (the old iterator's outstanding batches, one Python call more each).
3. frozen: the instrumented loop without a viewer (twice: A/A) and with a real subscriber
   process frozen by SIGSTOP (its socket buffers fill, the publisher must drop, never block);
   throughput ratio, goal >= 0.99. A control variant starts the same viewer, lets it subscribe,
   kills it and waits as long: the disturbance of starting a process, without a frozen viewer;
   another idles the loop's thread as long as a viewer's start takes (the median so far), without
   a process: earlier runs read the control ~1.7 % under "no viewer", and a pause alone (an idle
   core slowing down) was the other suspect.
   Beside the rates, the publisher thread's CPU share in each variant (its own CPU clock), and
   that of every thread but the loop's (the process's CPU clock less the loop thread's: the
   publisher and ZeroMQ's I/O threads): a frozen viewer can only slow the loop through more work
   on those threads (holding the GIL, or taking a core), so what it adds there bounds what it
   can take from the loop, and a CPU share is steadier on a noisy machine than the rate. (A
   paired design was tried and dropped: two trainer processes running the same loop over the
   same second, a viewer frozen on one, varied by 0.79-1.31 from round to round, no steadier.)
4. epoch: `iter()` of a 2-worker loader plus its first batch, plain (twice) vs instrumented, for
   fork, spawn and forkserver (spawn costs ~1.5-3.5 s a round here: --epoch-rounds); beside it
   iter() alone, the main process's share, and the page faults the loop's thread takes there.
5. short: a program that makes 30 short-lived 2-worker fork loaders and takes 4 batches from each
   (tests/benchmarks/short_loaders.py), run plain (twice) and under `loadertop run`; wall time of
   the whole process, ratio goal <= 1.05 (--short-rounds).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if (__name__ == "__main__" and os.environ.get("PYTHONDONTWRITEBYTECODE")
        and "--keep-bytecode-setting" not in sys.argv):
    # With PYTHONDONTWRITEBYTECODE (set in this project's dev image) every child process here
    # (spawn/forkserver workers, which inherit it as -B, section 5's programs, the viewers)
    # compiles every loadertop module from source at each start: ~160 ms for the probe alone,
    # against ~30 ms from bytecode, which an installed package has. Run again without it
    # (bytecode goes to the git-ignored __pycache__ directories).
    _env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    os.execve(sys.executable, [sys.executable, *sys.argv], _env)

import torch
from torch.utils.data import DataLoader, TensorDataset

import loadertop

HERE = Path(__file__).resolve().parent
SECTIONS = ("hot", "micro", "frozen", "epoch", "short")


# --------------------------------------------------------------------------- rounds and verdicts
def shuffled_rounds(variants: dict, rounds: int, seed: int, measure) -> dict[str, list[float]]:
    """`measure(name, variant)` for every variant, in a new random order each round."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for name in order:
            out[name].append(measure(name, variants[name]))
    return out


def _fmt(value: float, unit: str, digits: int) -> str:
    return f"{value:+.{digits}f}{unit}"


def difference(values: dict[str, list[float]], b: str, a: str, aa: tuple[str, str], *,
               unit: str = " ns", digits: int = 0) -> str:
    """`b - a`: median of per-round differences and min(b) - min(a), beside the A/A pair's."""
    med = statistics.median(x - y for x, y in zip(values[b], values[a]))
    low = min(values[b]) - min(values[a])
    aa_med = statistics.median(x - y for x, y in zip(values[aa[1]], values[aa[0]]))
    aa_low = min(values[aa[1]]) - min(values[aa[0]])
    spread = max(abs(aa_med), abs(aa_low))

    def shown(v: float) -> str:
        return _fmt(v, unit, digits) if abs(v) > spread else "not resolved"

    return (f"median {shown(med):>14}  min {shown(low):>14}   "
            f"(A/A: median {_fmt(aa_med, unit, digits)}, min {_fmt(aa_low, unit, digits)})")


def ratio(values: dict[str, list[float]], b: str, a: str, aa: tuple[str, str],
          higher_is_better: bool) -> str:
    """b / a: the median of the per-round ratios and the ratio of the best rounds, beside the
    A/A pair's; as for differences, a ratio within the A/A's distance from 1 is not resolved.

    Per-round, not the ratio of the medians: this VM's speed swings up to 2x from one second to
    the next (the same loop ran at 23k and 63k batches/s in one run), and variants measured in
    the same round share that swing; the ratio of two medians does not cancel it."""
    best = max if higher_is_better else min
    med = statistics.median(x / y for x, y in zip(values[b], values[a]))
    top = best(values[b]) / best(values[a])
    aa_med = statistics.median(x / y for x, y in zip(values[aa[1]], values[aa[0]]))
    aa_top = best(values[aa[1]]) / best(values[aa[0]])
    spread = max(abs(aa_med - 1), abs(aa_top - 1))

    def shown(v: float) -> str:
        return f"{v:.4f}" if abs(v - 1) > spread else "not resolved"

    kind = "max" if higher_is_better else "min"
    return (f"median {shown(med):>12}  {kind}s {shown(top):>12}   "
            f"(A/A: median {aa_med:.4f}, {kind}s {aa_top:.4f})")


def table(values: dict[str, list[float]], unit: str, scale: float = 1.0, digits: int = 0) -> None:
    width = max(map(len, values))
    for name, v in values.items():
        print(f"  {name:<{width}}  median {statistics.median(v) * scale:10.{digits}f}{unit}"
              f"  min {min(v) * scale:10.{digits}f}{unit}")


# --------------------------------------------------------------------------- 1. hot path
def ns_per_batch(loader) -> float:
    t0 = time.perf_counter_ns()
    n = 0
    for _ in loader:
        n += 1
    return (time.perf_counter_ns() - t0) / n


_clock = time.perf_counter_ns


class _TwoStampIterator:
    """The minimal measuring wrapper: two clock reads and two appends per batch."""

    __slots__ = ("_next", "_append")

    def __init__(self, inner, events) -> None:
        self._next = inner.__next__
        self._append = events.append

    def __iter__(self):
        return self

    def __next__(self):
        append = self._append
        append(_clock())
        try:
            batch = self._next()
        except BaseException:
            append(0)
            raise
        append(-_clock())
        return batch


class _Wrapped:
    def __init__(self, loader, make_iterator) -> None:
        self.loader, self.make_iterator = loader, make_iterator

    def __iter__(self):
        return self.make_iterator(self.loader)


def hot_path(batches: int, rounds: int, slice_batches: int) -> None:
    from loadertop.probe.loader import HOT_PATH, PY_ITERATORS, instrumented_iter
    from loadertop.probe.publisher import REPORT_S, get_publisher

    data = TensorDataset(torch.arange(batches))

    def fresh():
        return DataLoader(data, batch_size=1, num_workers=0)

    events = collections.deque(maxlen=1 << 16)
    variants = {
        "plain": fresh(),
        "plain again": fresh(),
        "wrapper (2 clocks, 2 appends)": _Wrapped(fresh(), lambda dl: _TwoStampIterator(
            iter(dl), events)),
        "instrument()": loadertop.instrument(fresh(), name="bench"),
    }
    drained = [variants["instrument()"]._lt_record]
    if HOT_PATH == "c":  # the fallback where the C hot path is not built, registered and drained
        py_loader = loadertop.instrument(fresh(), name="bench-py")  # kept: its record lives on
        variants["instrument(), pure-Python hot path"] = _Wrapped(
            py_loader._lt_loader, lambda dl, keep=py_loader: instrumented_iter(
                dl, keep._lt_record, None, iterators=PY_ITERATORS))
        drained.append(py_loader._lt_record)
    for loader in variants.values():
        ns_per_batch(loader)  # warm up (the publisher starts with the first instrumented iter())
    publisher = get_publisher()
    publisher._ready.wait(10)
    thread_clock = time.pthread_getcpuclockid(publisher._thread.ident)
    slices = max(1, batches // slice_batches)
    per_round = slices * slice_batches
    rng = random.Random(0)
    ns: dict[str, list[float]] = {name: [] for name in variants}
    publisher_ns: list[float] = []  # the publisher thread's CPU per drained batch, each round
    clock = time.perf_counter_ns
    for _ in range(rounds):
        iterators = {name: iter(loader) for name, loader in variants.items()}
        spent = dict.fromkeys(variants, 0)
        c0 = time.clock_gettime_ns(thread_clock)
        for _ in range(slices):
            order = list(variants)
            rng.shuffle(order)
            for name in order:
                it = iterators[name]
                t0 = clock()
                for _ in itertools.islice(it, slice_batches):
                    pass
                spent[name] += clock() - t0
        # The publisher drains at its next report: this round's stamps are all in its clock
        # once the records' stamp stores are empty (a poll with a deadline).
        deadline = time.monotonic() + 4 * REPORT_S
        while any(record.events for record in drained) and time.monotonic() < deadline:
            time.sleep(REPORT_S / 10)
        publisher_ns.append((time.clock_gettime_ns(thread_clock) - c0) /
                            (per_round * len(drained)))
        for name in variants:
            ns[name].append(spent[name] / per_round)
        del iterators
    total = "instrument() + its publisher thread"
    ns[total] = [a + b for a, b in zip(ns["instrument()"], publisher_ns)]
    print(f"1. hot path ({HOT_PATH}): TensorDataset, batch_size=1, num_workers=0, {per_round} "
          f"batches x {rounds} rounds, each round in slices of {slice_batches} batches "
          f"shuffled among the variants (ns per batch):")
    table(ns, " ns")
    print(f"  {'the publisher thread CPU per drained batch':<44} "
          f"median {statistics.median(publisher_ns):10.0f} ns  min {min(publisher_ns):10.0f} ns")
    aa = ("plain", "plain again")
    print("  added per batch (goal: instrument() + its publisher thread <= 1500 ns):")
    for name in [n for n in ns if n not in aa]:
        print(f"    {name + ' - plain':<44} {difference(ns, name, 'plain', aa)}")
    print(f"    {'the hot path beyond the minimal wrapper':<44} "
          f"{difference(ns, 'instrument()', 'wrapper (2 clocks, 2 appends)', aa)}")
    print(f"  throughput ratio (instrument() + its publisher thread) / plain: "
          f"{ratio(ns, 'plain', total, aa, higher_is_better=False)}")


# --------------------------------------------------------------------------- 2. wrappers alone
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


class _TunerStub:
    """What the `run --autotune` iterator asks of its tuner (probe/autotune.py's LoaderTuner)."""

    epoch_token = 1

    def loop_iterator(self, wrapper) -> None:
        pass

    def ended(self, token, batches) -> None:
        pass

    def switch_started(self, switch) -> None:
        pass


_STUB = _TunerStub()


def _tuned(inner: _PythonIterator, record, switching: bool = False):
    """The loop's iterator under --autotune; `switching`: every next() goes through a switch's
    handover, as the old iterator's outstanding batches do (probe/worker_switch.py)."""
    from loadertop.probe.loader import _InstrumentedIterator, _tuned_class
    from loadertop.probe.worker_switch import Switch

    wrapper = _tuned_class(_InstrumentedIterator)(inner, record, _STUB)
    if switching:
        inner._num_workers = inner._prefetch_factor = 2
        inner._task_info = {0: (0,)}  # a task of the old workers outstanding, for ever
        switch = Switch(owner=_STUB, wrapper=wrapper, old=inner, loader=_STUB, count=2,
                        worker_hook=lambda view: None, base_seed=0, reason="")
        switch.old = switch.new = inner
        switch._old_next = inner.__next__
        wrapper._lt_follow(switch)
    return wrapper


def wrapper_only(calls: int, rounds: int) -> None:
    """ns added per next() by each wrapper around an iterator shaped like the DataLoader's own.
    The record is registered (the publisher drains it, as in real use); no drain here: a second
    drainer on another thread races the publisher's (seen: IndexError, pop from an empty deque)."""
    from loadertop.probe.loader import (
        HOT_PATH,
        PY_ITERATORS,
        _InstrumentedIterator,
        _SingleProcessIterator,
    )

    record = loadertop.instrument(DataLoader(TensorDataset(torch.arange(2))), name="micro")._lt_record

    def per_call(_, make) -> float:
        it = make()
        t0 = time.perf_counter_ns()
        for _ in it:
            pass
        return (time.perf_counter_ns() - t0) / calls

    variants = {"bare": lambda: _PythonIterator(calls),
                "bare again": lambda: _PythonIterator(calls),
                "num_workers>0 iterator": lambda: _InstrumentedIterator(_PythonIterator(calls),
                                                                        record),
                "num_workers=0 iterator": lambda: _SingleProcessIterator(_PythonIterator(calls),
                                                                         record)}
    if HOT_PATH == "c":
        py_multi, py_single = PY_ITERATORS
        variants["num_workers>0, pure Python"] = lambda: py_multi(_PythonIterator(calls), record)
        variants["num_workers=0, pure Python"] = lambda: py_single(_PythonIterator(calls), record)
    variants["num_workers>0 under --autotune"] = lambda: _tuned(_PythonIterator(calls), record)
    variants["... during a switch"] = lambda: _tuned(_PythonIterator(calls), record, switching=True)
    ns = shuffled_rounds(variants, rounds, 1, per_call)
    print(f"2. the wrappers alone ({HOT_PATH}), {calls} next() x {rounds} rounds (ns per next()):")
    table(ns, " ns", digits=1)
    for name in list(variants)[2:]:
        print(f"    {name + ' - bare':<44} "
              f"{difference(ns, name, 'bare', ('bare', 'bare again'), digits=1)}")
    for b, a in (("num_workers>0 under --autotune", "num_workers>0 iterator"),
                 ("... during a switch", "num_workers>0 under --autotune")):
        print(f"    {b[:22] + ' - ' + a[:19]:<44} "
              f"{difference(ns, b, a, ('bare', 'bare again'), digits=1)}")


# --------------------------------------------------------------------------- 3. frozen viewer
def _wait_unsubscribed(publisher, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while publisher.subscriptions and time.monotonic() < deadline:
        time.sleep(0.01)


def frozen_viewer(seconds: float, rounds: int) -> None:
    from loadertop.probe.publisher import REPORT_S, get_publisher

    # Each round iterates for whole report periods: the publisher wakes every REPORT_S, and a
    # round shorter than that (5,000 batches took ~0.13 s) caught a report or not, which moved
    # its rate more than anything measured here.
    window_ns = int(max(seconds, 2 * REPORT_S) / REPORT_S) * int(REPORT_S * 1e9)
    data = TensorDataset(torch.arange(10**7))
    loader = loadertop.instrument(DataLoader(data, batch_size=1, num_workers=0), name="frozen")
    publisher = get_publisher()
    for _ in itertools.islice(loader, 2000):  # the publisher starts with the first iter()
        pass
    publisher._ready.wait(10)
    thread_clock = time.pthread_getcpuclockid(publisher._thread.ident)
    # The publisher thread's CPU per variant, from its own clock: the one way a frozen viewer
    # could slow the loop is more work on that thread (publishing runs there, holding the GIL),
    # and a CPU share is steadier here than the loop's rate, which swings with the machine.
    variants = {"no viewer": None, "no viewer again": None, "no viewer, paused as long": None,
                "viewer started, killed, 0.5 s": None, "frozen viewer": None}
    preludes: list[float] = []  # seconds from a viewer's start to its round's warm-up
    share: dict[str, list[float]] = {name: [] for name in variants}
    others: dict[str, list[float]] = {name: [] for name in variants}

    def timed(name: str) -> float:
        # Warm up first, in every variant: right after a process start and a pause the loop ran
        # 15-30 % slower for a while whether a viewer was frozen or gone (the control below
        # showed it), which read as a frozen viewer's cost.
        it = iter(loader)
        for _ in itertools.islice(it, 2000):
            pass
        clock = time.perf_counter_ns
        p0, l0 = time.process_time_ns(), time.thread_time_ns()
        c0, w0 = time.clock_gettime_ns(thread_clock), clock()
        end, n = w0 + window_ns, 0
        while clock() < end:
            for _ in range(500):
                next(it)
            n += 500
        c1, w1 = time.clock_gettime_ns(thread_clock), clock()
        p1, l1 = time.process_time_ns(), time.thread_time_ns()
        share[name].append(100 * (c1 - c0) / (w1 - w0))
        others[name].append(100 * ((p1 - p0) - (l1 - l0)) / (w1 - w0))
        return n * 1e9 / (w1 - w0)

    def measure(name, _):
        if name in ("no viewer", "no viewer again"):
            return timed(name)
        if name == "no viewer, paused as long":
            # The loop's thread idles as long as it does while a viewer starts and subscribes:
            # the pause without the process.
            time.sleep(statistics.median(preludes) if preludes else 1.0)
            return timed(name)
        started = time.monotonic()
        viewer = subprocess.Popen(
            [sys.executable, "-m", "loadertop", "snapshot", "--seconds", "600",
             publisher.endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while publisher.subscriptions == 0:  # the XPUB sees each subscription
                if time.monotonic() > deadline:
                    raise SystemExit("the viewer did not subscribe within 20 s")
                time.sleep(0.01)
            if name == "frozen viewer":
                os.kill(viewer.pid, signal.SIGSTOP)
            else:  # the control: the same disturbance (a viewer started, subscribed), then gone
                viewer.kill()
                viewer.wait()
                _wait_unsubscribed(publisher)
            time.sleep(0.5)  # as long after the viewer's start as in the frozen case
            preludes.append(time.monotonic() - started)
            return timed(name)
        finally:
            if viewer.poll() is None:
                os.kill(viewer.pid, signal.SIGCONT)
                viewer.kill()
                viewer.wait()
            _wait_unsubscribed(publisher)

    rate = shuffled_rounds(variants, rounds, 2, measure)
    print(f"3. frozen viewer: instrumented loop, {window_ns / 1e9:.2f} s x {rounds} rounds, "
          f"shuffled (batches/s):")
    table(rate, "/s")
    aa = ("no viewer", "no viewer again")
    control = "viewer started, killed, 0.5 s"
    print(f"  frozen / none (goal >= 0.99):     {ratio(rate, 'frozen viewer', 'no viewer', aa, True)}")
    print(f"  control / none:                   {ratio(rate, control, 'no viewer', aa, True)}")
    paused = "no viewer, paused as long"
    print(f"  paused / none:                    {ratio(rate, paused, 'no viewer', aa, True)}")
    print(f"  frozen / paused:                  {ratio(rate, 'frozen viewer', paused, aa, True)}")
    print(f"  frozen / control (the viewer's share): "
          f"{ratio(rate, 'frozen viewer', control, aa, True)}")
    print("  the publisher thread's CPU while the loop ran (% of a core, its own clock):")
    table(share, " %", digits=2)
    print(f"  frozen - none:                    "
          f"{difference(share, 'frozen viewer', 'no viewer', aa, unit=' %', digits=2)}")
    print("  every thread but the loop's (the publisher's, ZeroMQ's I/O threads), % of a core:")
    table(others, " %", digits=2)
    print(f"  frozen - none:                    "
          f"{difference(others, 'frozen viewer', 'no viewer', aa, unit=' %', digits=2)}")


# --------------------------------------------------------------------------- 4. epoch start
def epoch_start(rounds: int, contexts: tuple[str, ...] = ("fork", "spawn", "forkserver")) -> None:
    data = TensorDataset(torch.arange(64))

    def make(instrumented: bool, context: str):
        loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context=context)
        return loadertop.instrument(loader, name=f"epoch-{context}") if instrumented else loader

    # The whole figure split in two: iter() alone is the main process's share (torch starts the
    # workers inside it; what the workers do before their first batch lands in the first
    # next()), and the page faults this thread takes inside iter(). After fork, every page the
    # parent writes first is copied, and that is most of what the shim adds there as we read
    # it (ad hoc, 300 rounds: iter() +0.47 ms over plain); the count resolves where the clock
    # does not.
    iter_ms: dict[str, list[float]] = {}
    faults: dict[str, list[float]] = {}

    def minflt() -> int:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt

    def measure(name, loader) -> float:
        f0 = minflt()
        t0 = time.perf_counter()
        it = iter(loader)
        t1 = time.perf_counter()
        f1 = minflt()
        next(it)
        took = time.perf_counter() - t0
        del it  # shuts the workers down: not counted
        iter_ms.setdefault(name, []).append((t1 - t0) * 1e3)
        faults.setdefault(name, []).append(f1 - f0)
        return took

    print(f"4. epoch start: iter() + the first batch of a 2-worker loader, {rounds} rounds each, "
          f"shuffled (ms); iter() alone (the main process's share) and its page faults:")
    for context in contexts:
        variants = {"plain": make(False, context), "plain again": make(False, context),
                    "instrumented": make(True, context)}
        for name, loader in variants.items():
            measure(name, loader)  # warm up: forkserver starts its server on first use
        iter_ms.clear()
        faults.clear()
        ms = shuffled_rounds(variants, rounds, 3, measure)
        print(f"  {context}:")
        table(ms, " ms", scale=1e3, digits=1)
        scaled = {k: [x * 1e3 for x in v] for k, v in ms.items()}
        aa = ("plain", "plain again")
        print(f"    instrumented - plain  "
              f"{difference(scaled, 'instrumented', 'plain', aa, unit=' ms', digits=1)}")
        print(f"    iter() alone          "
              f"{difference(iter_ms, 'instrumented', 'plain', aa, unit=' ms', digits=2)}")
        print(f"    faults in iter()      "
              f"{difference(faults, 'instrumented', 'plain', aa, unit='', digits=0)}")


# --------------------------------------------------------------------------- 5. short loaders
def short_loaders(rounds: int, loaders: int = 30, batches: int = 4, suspects: str = "") -> None:
    script = str(HERE / "short_loaders.py")
    args = ["--loaders", str(loaders), "--batches", str(batches)]
    plain = [sys.executable, script, *args]
    cli = str(Path(sys.executable).with_name("loadertop"))
    run = ([cli] if os.path.exists(cli) else [sys.executable, "-m", "loadertop"]) + \
        ["run", "-q", "--", *plain]
    variants = {"plain": plain, "plain again": plain, "loadertop run": run}
    for name in filter(None, suspects.split(",")):
        variants[f"run, {name}"] = run
    inner: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}

    def measure(name, cmd) -> float:
        env = dict(os.environ)
        if name.startswith("run, "):
            env["LT_SHORT_SUSPECT"] = name[len("run, "):]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        took = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the program and its workers
        cpu[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if res.returncode != 0:
            raise SystemExit(f"{name}: exit {res.returncode}\n{res.stderr[-2000:]}")
        for word in res.stdout.split():
            if word.startswith("loaders_s="):
                inner[name].append(float(word.split("=", 1)[1]))
        return took

    for name, cmd in variants.items():
        measure(name, cmd)  # warm up (and fill the bytecode cache)
    for values in (*inner.values(), *cpu.values()):
        values.clear()
    wall = shuffled_rounds(variants, rounds, 4, measure)
    print(f"5. short-lived loaders: {loaders} loaders x {batches} batches, 2 fork workers each, "
          f"{rounds} rounds, shuffled (s):")
    print("  whole process:")
    table(wall, " s", digits=3)
    print("  its loaders alone (from the first loader to the end):")
    table(inner, " s", digits=3)
    print("  CPU time (user + sys) of the program and its workers:")
    table(cpu, " s", digits=3)
    aa = ("plain", "plain again")
    for name in list(variants)[2:]:
        print(f"  {name} / plain, whole process (goal <= 1.05): "
              f"{ratio(wall, name, 'plain', aa, higher_is_better=False)}")
        print(f"  {name} / plain, loaders alone:                 "
              f"{ratio(inner, name, 'plain', aa, higher_is_better=False)}")
        print(f"  {name} / plain, CPU time:                      "
              f"{ratio(cpu, name, 'plain', aa, higher_is_better=False)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=5_000,
                        help="batches per round of the hot section")
    parser.add_argument("--rounds", type=int, default=21,
                        help="rounds of the hot and micro sections (frozen: a third, >= 5)")
    parser.add_argument("--slice", type=int, default=50,
                        help="batches each variant runs in turn within a hot-section round")
    parser.add_argument("--frozen-seconds", type=float, default=1.0,
                        help="seconds of each frozen-section round (whole report periods)")
    parser.add_argument("--epoch-rounds", type=int, default=3)
    parser.add_argument("--epoch-contexts", default="fork,spawn,forkserver",
                        help="start methods of the epoch section (fork alone: ~0.12 s a round here)")
    parser.add_argument("--short-rounds", type=int, default=3)
    parser.add_argument("--short-suspects", default="",
                        help="also run `loadertop run` with these LT_SHORT_SUSPECT values, e.g. "
                             "no_worker_hook,no_sender,no_retention (see short_loaders.py)")
    parser.add_argument("--keep-bytecode-setting", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE (by default the benchmark runs again "
                             "without it, see the top of this file)")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections: {','.join(SECTIONS)}")
    args = parser.parse_args()
    only = set(args.only.split(","))
    os.environ.setdefault("LOADERTOP_DIR", tempfile.mkdtemp(prefix="ltbench"))
    torch.set_num_threads(1)
    t0 = time.monotonic()
    if "hot" in only:
        hot_path(args.batches, args.rounds, args.slice)
    if "micro" in only:
        wrapper_only(500_000, args.rounds)
    if "frozen" in only:
        frozen_viewer(args.frozen_seconds, max(5, args.rounds // 3))
    if "epoch" in only:
        epoch_start(args.epoch_rounds, tuple(args.epoch_contexts.split(",")))
    if "short" in only:
        short_loaders(args.short_rounds, suspects=args.short_suspects)
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
