"""CPU of the shim's background (publisher) thread, read from that thread's own CPU clock.

    python tests/benchmarks/probe_cpu.py [--seconds 10] [--scenarios slow2,fast0,fast2]
                                         [--viewer both|no|yes] [--blackbox on|off|off,on,...]
                                         [--profile]

Each scenario runs in a fresh process (a publisher of its own), iterating an instrumented loader
for --seconds after a warm-up; the publisher thread's CPU is read with
`time.pthread_getcpuclockid(thread.ident)` before and after, so nothing else in the process counts.

    slow2  2 fork workers, batch_size=1, each fetch sleeps 0.1 s: ~20 batches/s (goal <= 0.5 %)
    fast0  TensorDataset, batch_size=1, num_workers=0: ~20-30k batches/s (goal <= 5 %)
    fast2  TensorDataset, batch_size=1, 2 fork workers, as fast as it goes (goal <= 5 %)
    idle   a loader registered and iterated once, then no iteration (the thread's floor)

--viewer yes starts a real subscriber (`loadertop snapshot`) and waits until the publisher has
seen it subscribe. --blackbox: the variants to run, in this order at every --repeat (`off,on` with
--repeat 3 alternates them; `off,off,on,on` gives an A/A pair of each); with the black box on, the
figure is the publisher thread's and the black box's thread's CPU together (docs/blackbox.md),
measured after the black box loaded what it samples with (a one-off, BLACKBOX_TOOLS_AFTER_S in).
--profile runs cProfile inside the publisher thread (this thread only) and prints where its time
goes (cProfile inflates small calls: read it as a distribution).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time

GOALS = {"slow2": 0.5, "fast0": 5.0, "fast2": 5.0, "idle": 0.5}


class SlowDataset:
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i


def _install_breakdown(pubmod) -> dict:
    """Wrap the thread's jobs with accumulators of the publisher thread's CPU clock (calls from
    other threads are not counted): what is left of the total is the wake-ups themselves."""
    import threading

    from loadertop.probe import record as recmod
    from loadertop.probe import system_feed

    timers: dict[str, list[int]] = {}
    targets = [(pubmod.Publisher, "_read_worker_samples"), (pubmod.Publisher, "_read_subscriptions"),
               (pubmod.Publisher, "_send"), (pubmod.Publisher, "_retire_dead"),
               (recmod.LoaderRecord, "sample_queue"), (recmod.LoaderRecord, "sample_workers"),
               (recmod.LoaderRecord, "report"), (system_feed.SystemFeed, "report"),
               ]
    nested = [(recmod.LoaderRecord, "add_worker_sample"), (recmod.LoaderRecord, "drain")]
    if hasattr(pubmod.Publisher, "_follow_up"):
        targets.append((pubmod.Publisher, "_follow_up"))
    clock = time.thread_time_ns
    for cls, name in targets + nested:
        original = getattr(cls, name)
        key = f"{cls.__name__}.{name}" + (" (nested)" if (cls, name) in nested else "")
        acc = timers[key] = [0, 0]

        def wrapped(*a, _original=original, _acc=acc, **k):
            if threading.current_thread().name != "loadertop-publisher":
                return _original(*a, **k)
            c0 = clock()
            try:
                return _original(*a, **k)
            finally:
                _acc[0] += clock() - c0
                _acc[1] += 1

        setattr(cls, name, wrapped)
    return timers


def _child(scenario: str, seconds: float, viewer: bool, profile: bool,
           breakdown: bool = False) -> dict:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import loadertop
    from loadertop.probe import publisher as pubmod

    torch.set_num_threads(1)
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        original_loop = pubmod.Publisher._loop

        def profiled_loop(self, zmq, pub, pull):
            prof.enable()
            try:
                original_loop(self, zmq, pub, pull)
            finally:
                prof.disable()

        pubmod.Publisher._loop = profiled_loop

    timers = _install_breakdown(pubmod) if breakdown else None
    from loadertop.probe import cadence

    for item in filter(None, os.environ.get("LT_PROBE_SET", "").split(",")):
        name, value = item.split("=")  # an experiment: a publisher constant overridden
        # wherever it is read: the publisher's loop, and the queue-sampling timetable it imports
        holders = [mod for mod in (pubmod, cadence) if hasattr(mod, name)] or [pubmod]
        for mod in holders:
            setattr(mod, name, type(getattr(mod, name))(value))

    if scenario == "slow2":
        loader = DataLoader(SlowDataset(10**6, 0.1), batch_size=1, num_workers=2,
                            multiprocessing_context="fork")
    elif scenario in ("fast0", "idle"):
        loader = DataLoader(TensorDataset(torch.arange(10**7)), batch_size=1, num_workers=0)
    elif scenario == "fast2":
        loader = DataLoader(TensorDataset(torch.arange(10**7)), batch_size=1, num_workers=2,
                            multiprocessing_context="fork")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    loader = loadertop.instrument(loader, name=scenario)
    publisher = pubmod.get_publisher()
    it = iter(loader)
    next(it)
    publisher._ready.wait(10)
    thread = publisher._thread
    clock = time.pthread_getcpuclockid(thread.ident)
    box = publisher.blackbox
    box_clock = None
    if box is not None:
        deadline = time.monotonic() + 30
        while not (publisher._viewer_tools and box._thread is not None and box._thread.ident):
            if time.monotonic() > deadline:
                raise SystemExit("the black box did not start")
            next(it) if scenario != "idle" else time.sleep(0.01)
        box_clock = time.pthread_getcpuclockid(box._thread.ident)

    proc = None
    if viewer:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadertop", "snapshot", "--seconds", "600", publisher.endpoint],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while publisher.subscriptions == 0:
            if time.monotonic() > deadline:
                raise SystemExit("the viewer did not subscribe")
            next(it) if scenario != "idle" else time.sleep(0.01)
    try:
        # warm-up: 1.5 s of the steady state (a first SLOW_S tick, worker psutil priming)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            next(it) if scenario != "idle" else time.sleep(0.05)
        if prof is not None:
            prof.clear() if hasattr(prof, "clear") else None
        if timers is not None:
            for acc in timers.values():
                acc[0] = acc[1] = 0
        c0, w0, p0 = time.clock_gettime_ns(clock), time.perf_counter_ns(), time.process_time_ns()
        b0 = time.clock_gettime_ns(box_clock) if box_clock is not None else 0
        m0 = time.thread_time_ns()
        batches = 0
        end = time.monotonic() + seconds
        if scenario == "idle":
            del it
            time.sleep(seconds)
        else:
            while time.monotonic() < end:
                for _ in range(100):
                    next(it)
                batches += 100
        c1, w1, p1 = time.clock_gettime_ns(clock), time.perf_counter_ns(), time.process_time_ns()
        b1 = time.clock_gettime_ns(box_clock) if box_clock is not None else 0
        m1 = time.thread_time_ns()
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    wall = w1 - w0
    out = {"scenario": scenario, "viewer": viewer, "wall_s": wall / 1e9,
           "batches_per_s": batches * 1e9 / wall,
           "thread_cpu_percent": 100 * (c1 - c0 + b1 - b0) / wall,
           "blackbox_cpu_percent": 100 * (b1 - b0) / wall if box is not None else None,
           "main_cpu_percent": 100 * (m1 - m0) / wall,
           "process_cpu_percent": 100 * (p1 - p0) / wall}
    if timers is not None:
        out["breakdown"] = {k: (100 * v[0] / wall, v[1] * 1e9 / wall) for k, v in timers.items()}
    if prof is not None:
        publisher._stop.set()
        thread.join(5)
        s = io.StringIO()
        stats = pstats.Stats(prof, stream=s)
        stats.sort_stats("tottime").print_stats(25)
        s.write("\n---- cumulative ----\n")
        stats.sort_stats("cumulative").print_stats(30)
        out["profile"] = s.getvalue()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--scenarios", default="slow2,fast0,fast2")
    parser.add_argument("--viewer", choices=("both", "no", "yes"), default="both")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--breakdown", action="store_true",
                        help="the thread's CPU per job (its own clock around each call)")
    parser.add_argument("--set", default="", metavar="NAME=VALUE,...",
                        help="override publisher constants (experiments), e.g. SAMPLE_S=0.25")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--blackbox", default="on", help="on, off, or variants in order: off,on")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        scenario, viewer = args.child.split(":")
        print(json.dumps(_child(scenario, args.seconds, viewer == "1", args.profile,
                                args.breakdown)))
        return
    env = dict(os.environ)
    env.setdefault("LOADERTOP_DIR", tempfile.mkdtemp(prefix="ltprobe"))
    env["LT_PROBE_SET"] = args.set
    env.setdefault("LOADERTOP_STATE_DIR", tempfile.mkdtemp(prefix="ltstate"))
    variants = args.blackbox.split(",")
    viewers = {"both": (0, 1), "no": (0,), "yes": (1,)}[args.viewer]
    for _ in range(args.repeat):
        for scenario in args.scenarios.split(","):
            for v, variant in ((v, b) for v in viewers for b in variants):
                env["LOADERTOP_BLACKBOX"] = "0" if variant == "off" else "1"
                cmd = [sys.executable, __file__, "--child", f"{scenario}:{v}",
                       "--seconds", str(args.seconds)] + (["--profile"] if args.profile else []) \
                    + (["--breakdown"] if args.breakdown else [])
                res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
                if res.returncode:
                    print(res.stdout, res.stderr)
                    continue
                r = json.loads(res.stdout.strip().splitlines()[-1])
                box = "" if r["blackbox_cpu_percent"] is None else \
                    f" (black box {r['blackbox_cpu_percent']:.3f} %)"
                print(f"{scenario:6s} viewer={'yes' if v else 'no ':3s} blackbox={variant:3s} "
                      f"{r['batches_per_s']:9.0f} batches/s  publisher thread{box} "
                      f"{r['thread_cpu_percent']:6.2f} % of a core (goal <= {GOALS[scenario]})  "
                      f"main thread {r['main_cpu_percent']:5.1f} %  process "
                      f"{r['process_cpu_percent']:5.1f} %", flush=True)
                if "breakdown" in r:
                    jobs = sum(pct for k, (pct, _) in r["breakdown"].items() if "nested" not in k)
                    for k, (pct, rate) in sorted(r["breakdown"].items(), key=lambda kv: -kv[1][0]):
                        print(f"    {k:34s} {pct:6.3f} %  {rate:7.1f} calls/s")
                    print(f"    {'(wake-ups, loop bookkeeping)':34s} "
                          f"{r['thread_cpu_percent'] - jobs:6.3f} %")
                if "profile" in r:
                    print(r["profile"])


if __name__ == "__main__":
    main()
