"""A small, parameterised training job for the end-to-end tests.

    python tests/workloads/train.py --kind sleep --ms 5 --workers 2 --batch-size 4 \
        --step-ms 10 --duration 8 --status /tmp/ltX/status.json --piddir /tmp/ltX/pids

It iterates an instrumented DataLoader over `lt_data.WorkloadDataset` and tells the test what it
knows, in `--status` (a JSON file replaced atomically every 50 ms and at every change of phase):
its pid, batches received so far, when the last one arrived, the phase (`starting`,
`running`, `error`, `done`), the error text when the loop raised. Worker pids are written by the
dataset itself into `--piddir` as `<worker id>.<pid>`.

Kinds (per sample): sleep (I/O-like), cpu (burn CPU), cheap (nothing), hang (sleep forever from
batch `--after` on), exit (``os._exit(--exit-code)`` from batch `--after` on), raise (ValueError).
`--kill-worker-after N`: after N batches the loop SIGKILLs worker 0 itself (with `--kill-when-told`,
once a file `kill` beside `--status` exists too). `--stop-when-told`: the loop ends once a file
`stop` beside `--status` exists (a test's word, so that the job outlives what it watches);
`--start-when-told`: its imports done and its dataset made, it waits for a file `start` there
before it instruments its loader, which registers it (a test's word: its start is one moment).
store: reads pass a semaphore of `--store-slots` slots shared by the workers (a storage serving
that many at once).
`--then-workers N --then-after S`: after S seconds the loop drops its loader and makes a new one,
the same but with N workers (same name: the same source), for the rest of `--duration`.
Each phase's throughput, measured by the loop itself after `--warmup-s`, goes into the status
file and the final JSON line as `phases`: [{"workers", "batches", "seconds", "batches_per_s"}].
When the loop raises, the error is recorded and the process stays alive `--idle-after-error` s
(so a viewer can see the dead worker), then exits 0. `--end` says how to finish: normal (exit 0),
raise (an uncaught exception), sleep (stay alive until killed).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from lt_data import SleepCollate, WorkloadDataset, burn_cpu, list_collate, seed_worker_rng
from torch.utils.data import DataLoader

import loadertop


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="cheap")
    p.add_argument("--ms", type=float, default=0.0, help="per-sample cost (sleep or CPU)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--payload", type=int, default=1, help="elements per sample tensor")
    p.add_argument("--step-ms", type=float, default=0.0, help="sleep this long per step")
    p.add_argument("--busy-step-ms", type=float, default=0.0, help="burn CPU this long per step")
    p.add_argument("--duration", type=float, default=10.0, help="stop iterating after S seconds")
    p.add_argument("--batches", type=int, default=0, help="stop after N batches (0: no limit)")
    p.add_argument("--start-when-told", action="store_true",
                   help="with its dataset made, write phase `ready` and wait for a file `start` "
                        "beside --status before instrumenting its loader (which registers it)")
    p.add_argument("--stop-when-told", action="store_true",
                   help="stop iterating once a file `stop` exists beside --status (a test writes "
                        "it once it has seen what it needs of the running job); --duration and "
                        "--batches still end it first")
    p.add_argument("--after", type=int, default=0, help="hang/exit/raise from this batch on")
    p.add_argument("--exit-code", type=int, default=3)
    p.add_argument("--kill-worker-after", type=int, default=0)
    p.add_argument("--kill-when-told", action="store_true",
                   help="with --kill-worker-after: past N batches, the kill waits for a file "
                        "`kill` beside --status (a test writes it once its viewer watches)")
    p.add_argument("--idle-after-error", type=float, default=0.0)
    p.add_argument("--slow-worker-ms", type=float, default=0.0,
                   help="worker 0 sleeps this much longer per sample")
    p.add_argument("--rng", choices=("none", "init", "per-worker"), default="none",
                   help="the dataset draws from a numpy Generator made in __init__ (init), or "
                        "one seeded per worker by worker_init_fn (per-worker)")
    p.add_argument("--epochs", type=int, default=1, help="epochs of --batches each (or until "
                   "--duration)")
    p.add_argument("--sleep-after-kill-s", type=float, default=0.0,
                   help="after --kill-worker-after's kill, sleep this long in the loop's step: "
                        "torch's error then comes from its SIGCHLD handler there, not next()")
    p.add_argument("--crash", action="store_true",
                   help="the loop's error propagates: the process dies of it at once")
    p.add_argument("--end", choices=("normal", "raise", "sleep"), default="normal")
    p.add_argument("--nice-workers", type=int, default=0,
                   help="workers lower their priority by this much (worker_init_fn)")
    p.add_argument("--collate-ms", type=float, default=0.0, help="collate_fn sleeps this long")
    p.add_argument("--list-batches", action="store_true",
                   help="collate_fn returns the items' tensors unstacked (many small tensors)")
    p.add_argument("--out-of-order", action="store_true", help="in_order=False (torch >= 2.6)")
    p.add_argument("--name", default="train")
    p.add_argument("--context", default=None, help="multiprocessing context (fork, spawn, ...)")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--worker-init-s", type=float, default=0.0,
                   help="worker_init_fn sleeps this long (a costly set-up at each worker's start)")
    p.add_argument("--plain", action="store_true", help="do not instrument")
    p.add_argument("--store-slots", type=int, default=2, help="kind store: reads served at once")
    p.add_argument("--then-workers", type=int, default=None,
                   help="after --then-after s, re-create the loader with this many workers")
    p.add_argument("--then-after", type=float, default=0.0)
    p.add_argument("--warmup-s", type=float, default=1.0,
                   help="a phase's throughput is measured from this long after its first batch")
    p.add_argument("--sharing", default=None,
                   help="torch.multiprocessing.set_sharing_strategy (file_system, ...)")
    p.add_argument("--status", default=None)
    p.add_argument("--piddir", default=None)
    return p.parse_args(argv)


class Status:
    """The status file: the loop only updates a dict (cheap); a daemon thread writes it out every
    50 ms, so the file stays current even while the loop is blocked (a hang)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.doc = {"pid": os.getpid(), "phase": "starting", "batches": 0, "last_batch_at": None,
                    "started_at": time.time(), "error": None, "error_type": None}
        self._lock = threading.Lock()
        self.write(force=True)
        if path:
            threading.Thread(target=self._flusher, daemon=True, name="status").start()

    def _flusher(self) -> None:
        while True:
            time.sleep(0.05)
            self._dump()

    def _dump(self) -> None:
        with self._lock:
            doc = dict(self.doc, t=time.time())
            tmp = self.path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, self.path)

    def write(self, force: bool = False, **changes) -> None:
        self.doc.update(changes)
        if force and self.path:
            self._dump()


def nice_worker(increment: int, worker_id: int) -> None:
    os.nice(increment)


def slow_worker_start(seconds: float, worker_id: int) -> None:
    time.sleep(seconds)


def worker_pid(piddir: str, worker_id: int, deadline_s: float = 5.0) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for name in os.listdir(piddir):
            wid, _, pid = name.partition(".")
            if wid == str(worker_id) and pid.isdigit():
                return int(pid)
        time.sleep(0.01)
    raise RuntimeError(f"worker {worker_id} never wrote its pid")


def make_loader(args, ds, workers: int):
    kwargs = {}
    if workers > 0:
        kwargs["persistent_workers"] = args.persistent
        if args.context:
            kwargs["multiprocessing_context"] = args.context
        if args.out_of_order:
            kwargs["in_order"] = False
        if args.nice_workers:
            kwargs["worker_init_fn"] = functools.partial(nice_worker, args.nice_workers)
        elif args.rng == "per-worker":
            kwargs["worker_init_fn"] = seed_worker_rng
        elif args.worker_init_s:
            kwargs["worker_init_fn"] = functools.partial(slow_worker_start, args.worker_init_s)
    if args.collate_ms:
        kwargs["collate_fn"] = SleepCollate(args.collate_ms)
    elif args.list_batches:
        kwargs["collate_fn"] = list_collate
    loader = DataLoader(ds, batch_size=args.batch_size, num_workers=workers, **kwargs)
    if not args.plain:
        loader = loadertop.instrument(loader, name=args.name)
    return loader


class PhaseClock:
    """A phase's throughput as the loop sees it: batches from `warmup_s` after its first batch."""

    def __init__(self, workers: int, warmup_s: float) -> None:
        self.workers, self.warmup_s = workers, warmup_s
        self.first: float | None = None
        self.start: float | None = None
        self.counted = 0
        self.last: float | None = None

    def batch(self, now: float) -> None:
        if self.first is None:
            self.first = now
        elif now - self.first >= self.warmup_s:
            if self.start is None:
                self.start = now
            else:
                self.counted += 1
            self.last = now

    def summary(self) -> dict:
        seconds = (self.last - self.start) if self.start is not None and self.last else 0.0
        return {"workers": self.workers, "batches": self.counted, "seconds": round(seconds, 3),
                "batches_per_s": round(self.counted / seconds, 3) if seconds > 0 else None}


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    if args.sharing:  # before any worker starts (fork workers inherit it; spawn ones would not)
        torch.multiprocessing.set_sharing_strategy(args.sharing)
    status = Status(args.status)
    if args.piddir:
        os.makedirs(args.piddir, exist_ok=True)
    bad_index = args.after * args.batch_size if args.kind in ("hang", "exit", "raise") else None
    ds = WorkloadDataset(args.kind, args.ms, bad_index=bad_index, exit_code=args.exit_code,
                         piddir=args.piddir, payload=args.payload,
                         slow_worker_ms=args.slow_worker_ms, rng=args.rng,
                         store_slots=args.store_slots)
    if args.start_when_told:  # before instrument(), which starts the publisher and registers
        status.write(force=True, phase="ready")
        while not os.path.exists(os.path.join(os.path.dirname(args.status or "."), "start")):
            time.sleep(0.005)
    loader = make_loader(args, ds, args.workers)
    started = time.monotonic()
    end_at = started + args.duration
    switch_at = started + args.then_after if args.then_workers is not None else None
    phases = [PhaseClock(args.workers, args.warmup_s)]
    n = 0
    status.write(force=True, phase="running")
    _batch = None
    epoch = 0
    try:
        killed = False
        told_to_kill = os.path.join(os.path.dirname(args.status or "."), "kill")
        told_to_stop = os.path.join(os.path.dirname(args.status or "."), "stop")
        while epoch < args.epochs:
            in_epoch = 0
            for _batch in loader:
                n += 1
                in_epoch += 1
                now = time.monotonic()
                phases[-1].batch(now)
                status.write(batches=n, last_batch_at=time.time(), epoch=epoch,
                             phases=[p.summary() for p in phases])
                if switch_at is not None and now >= switch_at:
                    break
                if (args.kill_worker_after and not killed and n >= args.kill_worker_after
                        and (not args.kill_when_told or os.path.exists(told_to_kill))):
                    killed = True
                    status.write(force=True)
                    os.kill(worker_pid(args.piddir, 0), signal.SIGKILL)
                    if args.sleep_after_kill_s:
                        try:
                            time.sleep(args.sleep_after_kill_s)
                        except Exception:
                            status.write(force=True, raised_in="step")
                            raise
                if args.step_ms > 0:
                    time.sleep(args.step_ms / 1000.0)
                if args.busy_step_ms > 0:
                    burn_cpu(args.busy_step_ms)
                if time.monotonic() >= end_at or (args.batches and in_epoch >= args.batches):
                    break
                if args.stop_when_told and os.path.exists(told_to_stop):
                    break
            if args.stop_when_told and os.path.exists(told_to_stop):
                break
            if switch_at is not None and time.monotonic() >= switch_at:
                # The same loader made anew with more workers, under the same name: the old one
                # is dropped first so that its source carries on (loadertop.instrument).
                switch_at = None
                del loader, _batch
                gc.collect()
                loader = make_loader(args, ds, args.then_workers)
                phases.append(PhaseClock(args.then_workers, args.warmup_s))
                continue  # the same epoch, on the new loader
            epoch += 1
            if time.monotonic() >= end_at:
                break
    except Exception as exc:  # torch's "DataLoader worker ... exited unexpectedly" and kin
        if args.crash:
            status.write(force=True, phase="error", error=str(exc), error_type=type(exc).__name__,
                         batches=n)
            raise
        # torch (2.13) raises "worker ... killed by signal" from its SIGCHLD handler in the main
        # thread for as long as the iterator lives (`exc` keeps it here). When the loop failed
        # first on the dead worker's shared-memory fd (ConnectionResetError, seen under load), that
        # signal comes later and would end this script mid-idle: the first error stands.
        # That handler may also run while this call is being made (a signal already pending is
        # handled at the call's first bytecode), raising the same death again: try until it holds.
        while True:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                break
            except RuntimeError:
                continue
        status.write(force=True, phase="error", error=str(exc), error_type=type(exc).__name__,
                     batches=n)
        print(json.dumps({"error": str(exc)}), flush=True)
        end = time.monotonic() + args.idle_after_error
        while time.monotonic() < end:
            time.sleep(0.05)
        return 0
    summaries = [p.summary() for p in phases]
    status.write(force=True, phase="done", batches=n, phases=summaries)
    print(json.dumps({"pid": os.getpid(), "batches": n, "phases": summaries}), flush=True)
    if args.end == "raise":
        raise SystemError("workload ends with an exception")
    if args.end == "sleep":
        while True:
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
