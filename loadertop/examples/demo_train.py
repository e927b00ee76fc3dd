"""A synthetic training job for `loadertop demo`: CPU only, offline, no dataset to download.

It iterates an instrumented DataLoader ("train") through four phases, each lasting
``--phase-seconds`` (default 20 s), in a loop, so that the viewer's bottleneck banner changes:

=========  =================================================  =====================
phase      what the job does                                   expected diagnosis
=========  =================================================  =====================
healthy    cheap samples, 2 workers, a 50 ms training step     ``compute_bound``
io         every sample waits 4 ms (storage latency), 2        ``input_bound_io``
           workers, 10 ms step
cpu        every sample burns 4 ms of CPU, 1 worker, a core    ``input_bound_cpu``
           left idle, 10 ms step
saturated  every sample burns 4 ms of CPU, 3 workers (at nice   ``cpu_saturated``
           10), a busy loop: 2 ms of CPU + 4 ms per step
=========  =================================================  =====================

The expected diagnoses hold on an otherwise idle 2-core machine (checked with `loadertop snapshot
--json` in each phase); other load on the machine pushes the later phases towards cpu_saturated.

Each phase is one pass ("epoch") over the loader, cut short when the phase's time is up: the
dataset's ``mode`` and the loader's ``num_workers`` are set before ``iter()``, so the fresh
workers (forked per epoch: no ``persistent_workers``) see the new behaviour. A small "val"
loader (``num_workers=0``) runs for half a second at the end of every phase, as a second source.

Why the saturated phase renices its workers: with more runnable processes than cores, the main
process waits for a core too, and batches pile up while it does — the loop then waits *although
batches are ready*, which loadertop rightly calls ``main_process_bound``. Workers at a lower priority
leave the loop a core whenever it wants one, so the workers are the limit and every core is busy.

The job starts iterating at once (only torch is imported first) so a viewer has data within
about two seconds. It exits on SIGTERM or SIGINT (cleanly: workers stopped, viewers told), after
``--seconds`` if given, and by itself when the process that started it (``--parent-pid``) is gone,
so a killed `loadertop demo` never leaves it running. ``--phase-file`` receives the current phase
as JSON for the viewer to show.

Run it by hand with ``python -m loadertop.examples.demo_train`` (or ``examples/demo_train.py``)
and watch it with ``loadertop`` in another terminal.

Importing this module imports no torch (the job does once it runs): `loadertop demo` imports it for
the phases and the arguments the two share (``add_phase_arguments``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import NamedTuple

BATCH_SIZE = 16
SAMPLES = 1_000_000  # an "epoch" longer than any phase: a phase ends by time, not by data
IO_WAIT_PER_SAMPLE_S = 0.004
CPU_PER_SAMPLE_S = 0.004
VAL_SECONDS = 0.5


class Phase(NamedTuple):
    name: str
    title: str  # what the viewer shows
    expect: str  # the diagnosis category this phase should produce (docs/contract.md §4)
    num_workers: int
    sample: str  # dataset mode: "cheap" | "io" | "cpu"
    step_sleep_s: float  # the training step: time off the CPU (a GPU would be busy here) ...
    step_cpu_s: float  # ... and CPU burnt by the loop itself
    worker_nice: int = 0  # niceness added in each worker


PHASES = (
    Phase("healthy", "healthy (compute-bound)", "compute_bound", 2, "cheap", 0.050, 0.0),
    Phase("io", "I/O-bound (slow storage)", "input_bound_io", 2, "io", 0.010, 0.0),
    Phase("cpu", "CPU-bound (1 worker, a core idle)", "input_bound_cpu", 1, "cpu", 0.010, 0.0),
    Phase("saturated", "CPU saturated (3 workers + busy loop)", "cpu_saturated", 3, "cpu", 0.004, 0.002,
          worker_nice=10),
)
PHASE_NAMES = tuple(p.name for p in PHASES)
DEFAULT_PHASE_SECONDS = 20.0
# A phase trains, then runs its val pass for VAL_SECONDS: in a shorter one, val would be most of it.
MIN_PHASE_SECONDS = 1.0


# ---- the arguments `loadertop demo` and this job share (the demo passes them on)
def phases_argument(text: str) -> tuple[Phase, ...]:
    """--phases: comma-separated names; the phases run in the order of PHASES, each once."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(PHASE_NAMES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(unknown) or '(none)'}; choose from {', '.join(PHASE_NAMES)}")
    return tuple(p for p in PHASES if p.name in names)


def phase_seconds_argument(text: str) -> float:
    """--phase-seconds: a number, at least MIN_PHASE_SECONDS."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not seconds >= MIN_PHASE_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be at least {MIN_PHASE_SECONDS:g}")
    return seconds


def add_phase_arguments(parser: argparse.ArgumentParser) -> None:
    """--phase-seconds and --phases, validated alike wherever they are given."""
    parser.add_argument("--phase-seconds", type=phase_seconds_argument,
                        default=DEFAULT_PHASE_SECONDS, metavar="S",
                        help=f"how long each phase lasts (default {DEFAULT_PHASE_SECONDS:g}, "
                             f"at least {MIN_PHASE_SECONDS:g})")
    parser.add_argument("--phases", type=phases_argument, default=PHASES, metavar="NAMES",
                        help=f"comma-separated phases to cycle through (default {','.join(PHASE_NAMES)})")


def phase_command_line(phase_seconds: float, phases: tuple[Phase, ...]) -> list[str]:
    """The shared arguments, as the job's command line takes them."""
    return ["--phase-seconds", repr(phase_seconds), "--phases", ",".join(p.name for p in phases)]


_BLOCK = bytes(64 * 1024)


def burn_cpu(seconds: float) -> None:
    """Use `seconds` of this thread's CPU time (wall time stretches when cores are contended).

    The work is sha256 over 64 KiB blocks (~0.1 ms each), which releases the GIL as real transforms
    do (image decoding, torch ops). A pure-Python spin would hold it, and starve the worker's queue
    feeder thread: each finished batch would reach the loop tens of ms late, a handoff the viewer
    rightly shows — and calls main_process_bound — though real loaders rarely have it."""
    import hashlib

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        hashlib.sha256(_BLOCK).digest()


class _Renice:
    """worker_init_fn: lower the worker's priority (a class, so spawn could pickle it)."""

    def __init__(self, increment: int) -> None:
        self.increment = increment

    def __call__(self, worker_id: int) -> None:
        os.nice(self.increment)


def make_dataset_class():
    import torch
    from torch.utils.data import Dataset

    class DemoDataset(Dataset):
        """Tiny synthetic images whose cost per sample depends on ``mode``."""

        def __init__(self, length: int = SAMPLES) -> None:
            self.length = length
            self.mode = "cheap"

        def __len__(self) -> int:
            return self.length

        def __getitem__(self, index: int):
            if self.mode == "io":
                time.sleep(IO_WAIT_PER_SAMPLE_S)  # a read from slow storage or the network
            elif self.mode == "cpu":
                burn_cpu(CPU_PER_SAMPLE_S)  # decoding and augmentation
            # One tensor per sample: each tensor of a batch costs the main process a shared-memory
            # handle to receive (docs/performance.md), and the demo's "model" needs no labels.
            return torch.full((3, 16, 16), float(index % 251))

    return DemoDataset


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.parent_pid = args.parent_pid
        self.deadline = time.monotonic() + args.seconds if args.seconds else None

    def should_stop(self) -> bool:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return True
        # Our starter is gone (killed without a chance to stop us): we are an orphan, leave.
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    def write_phase(self, index: int, count: int, phase: Phase, started: float, ends: float) -> None:
        if not self.args.phase_file:
            return
        doc = {"index": index, "count": count, "name": phase.name, "title": phase.title,
               "expect": phase.expect, "started_at": started, "ends_at": ends, "pid": os.getpid()}
        tmp = f"{self.args.phase_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.args.phase_file)  # readers never see half a file

    def run(self) -> int:
        import torch
        from torch.utils.data import DataLoader

        import loadertop

        torch.set_num_threads(1)  # the demo's "model" is tiny; keep the main process on one core
        dataset = make_dataset_class()()
        train = loadertop.instrument(
            DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=False, num_workers=2), name="train")
        val_set = make_dataset_class()(length=SAMPLES)
        val = loadertop.instrument(DataLoader(val_set, batch_size=BATCH_SIZE, num_workers=0), name="val")
        weights = torch.randn(3 * 16 * 16, 10)

        phases = self.args.phases
        index = 0
        while not self.should_stop():
            phase = phases[index % len(phases)]
            started = time.time()
            ends = started + self.args.phase_seconds
            self.write_phase(index % len(phases), len(phases), phase, started, ends)
            dataset.mode = phase.sample
            train.num_workers = phase.num_workers  # read by iter(): this epoch's fresh workers
            train.worker_init_fn = _Renice(phase.worker_nice) if phase.worker_nice else None
            for images in train:
                (images.flatten(1) @ weights).sum()  # the "model"
                if phase.step_cpu_s:
                    burn_cpu(phase.step_cpu_s)
                if phase.step_sleep_s:
                    time.sleep(phase.step_sleep_s)
                if time.time() >= ends - VAL_SECONDS or self.should_stop():
                    break
            val_end = time.time() + VAL_SECONDS
            for images in val:
                (images.flatten(1) @ weights).sum()
                time.sleep(0.01)  # the evaluation step
                if time.time() >= val_end or self.should_stop():
                    break
            index += 1
        return 0


def _exit_on_signal(signum, frame) -> None:
    # Raise in the training loop, so the DataLoader iterator stops its workers and loadertop's
    # atexit hook tells viewers "finished" (SIGTERM's default would skip both).
    raise SystemExit(128 + signum)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="demo_train", description="loadertop's synthetic training job")
    add_phase_arguments(p)
    p.add_argument("--seconds", type=float, default=None, metavar="S",
                   help="stop after this long (default: run until stopped)")
    p.add_argument("--phase-file", default=None, metavar="PATH",
                   help="write the current phase here as JSON")
    p.add_argument("--parent-pid", type=int, default=None, metavar="PID",
                   help="exit when this process is no longer our parent")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        return Job(args).run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
