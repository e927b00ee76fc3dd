"""One trial: the user's program with one num_workers, measured through the shim and the Model.

    outcome = run_trial(["python", "train.py"], 4, "climb", TrialSettings(trial_s=10))

1. **Start** the program as `loadertop run` would (the same start-up hook, `launch.child_env`)
   with LOADERTOP_TUNE_NUM_WORKERS=N (every DataLoader built with N workers: `probe.override`), in
   its own session (`launch.start_in_session`: the whole process group, workers and torchrun
   ranks included, can be ended), with a private LOADERTOP_DIR: each trial's processes are the
   only ones its viewer finds.
2. **Subscribe** like `loadertop snapshot` does (a `Subscriber` over discovery feeding the viewer's
   `Model`, so a figure means what it means in the TUI), and wait for the first batch: no DataLoader
   within `start_s` is the program's problem, said as such.
3. **Warm up**: worker start-up and the first fill of the prefetch queue deliver a burst that no
   steady state has. Measuring begins `warmup_s` after the first batch, and once the main loader
   has delivered its queue's capacity (num_workers × prefetch_factor) a few times over.
4. **Measure** for `trial_s`: the Model's window is exactly the measurement, so its
   `samples_per_s` and `wait_fraction` cover nothing else; the machine's figures (CPU, memory,
   swap) are read every half second; the rate of each half second gives the spread.
5. **End** the program: SIGTERM to its process group, SIGKILL after `grace_s`, and wait until
   no process of the group is left (a hung worker outlives its parent) before the next trial starts.

The main loader is the one with the most batches in the window; under torchrun each rank is a
source of the same name, and their rates add up.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loadertop import diagnosis, environment
from loadertop.client.document import Document, Source, SourceFigures, SystemFigures
from loadertop.launch import child_env, signal_group, start_in_session
from loadertop.tuning.document import TrialFigures, TrialReason

if TYPE_CHECKING:
    from loadertop.client.model import SourceState
    from loadertop.client.subscriber import Subscriber

POLL_S = 0.1  # the longest a poll of the subscriber waits for data (no fixed sleeps: it wakes on data)
SAMPLE_S = 0.5  # the Model is advanced (diagnosis, system figures) and the rate chunked this often
WARMUP_CAPACITY_ROUNDS = 2  # ... and warm-up lasts until the queue's capacity came through this often
WARMUP_MIN_BATCHES = 5
MIN_MEASURED_S = 1.0  # a program that ends sooner than this into the measurement gives no figure
STDERR_TAIL_LINES = 3
STDERR_TAIL_CHARS = 300
DEFAULT_PREFETCH = 2  # torch's prefetch_factor default with workers


class CannotStart(Exception):
    """COMMAND cannot be executed at all (not found, not executable): one line, exit 2."""


@dataclass(frozen=True)
class TrialSettings:
    trial_s: float = 10.0  # the measurement
    warmup_s: float | None = None  # None: a quarter of trial_s, within 0.5..5 s
    start_s: float = 60.0  # the most a trial may take to its first batch
    grace_s: float = 3.0  # SIGTERM to SIGKILL

    @property
    def warmup(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return min(5.0, max(0.5, self.trial_s / 4))


@dataclass(frozen=True)
class TrialOutcome:
    figures: TrialFigures
    source: SourceFigures | None  # the main loader at the end of the measurement (advice's input)
    system: SystemFigures | None
    no_loader: bool  # no DataLoader delivered a batch: within start_s, or before the program ended
    duration_s: float  # the whole trial, start to the last process gone


# ------------------------------------------------------------------------------- the environment
def trial_env(environ: Mapping[str, str], directory: Path,
              num_workers: int | None) -> dict[str, str]:
    """`loadertop run`'s environment for the program, with this trial's private discovery
    directory and num_workers (None: the program's own setting)."""
    env = child_env(environ, None)
    env[environment.LOADERTOP_DIR] = str(directory)
    # The trial's publisher binds its private ipc socket (a fixed tcp port from the user's
    # environment would outlive a killed trial for a moment), and is never disabled.
    env.pop(environment.LOADERTOP_ENDPOINT, None)
    env.pop(environment.LOADERTOP_DISABLE, None)
    if num_workers is None:
        env.pop(environment.LOADERTOP_TUNE_NUM_WORKERS, None)
    else:
        env[environment.LOADERTOP_TUNE_NUM_WORKERS] = str(num_workers)
    return env


def _trial_dir() -> Path:
    # ipc paths must stay under ~100 characters: a short directory under /tmp, mode 0700.
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix="lttune", dir=base))


def check_command(command: Sequence[str], search_path: str | None = None) -> None:
    """Raise CannotStart when COMMAND's program cannot be found or executed — before the first
    trial, so that the answer is one line and not a trial that fails. (`start_program` still
    reports what this cannot foresee.)"""
    program = command[0]
    if shutil.which(program, path=search_path) is not None:
        return
    if os.sep in program and os.path.exists(program):
        reason = "is a directory" if os.path.isdir(program) else "Permission denied"
        raise CannotStart(f"cannot execute {program}: {reason}")
    raise CannotStart(f"command not found: {program}")


def start_program(command: Sequence[str], env: dict[str, str],
                  directory: Path) -> subprocess.Popen[bytes]:
    """The program in its own session; its stdout and stderr go to files of the trial (stdout is
    tune's own: the table or the JSON document)."""
    out = open(directory / "stdout", "wb")
    err = open(directory / "stderr", "wb")
    try:
        return start_in_session(command, env, stdout=out, stderr=err)
    except FileNotFoundError:
        raise CannotStart(f"command not found: {command[0]}") from None
    except PermissionError as exc:
        raise CannotStart(f"cannot execute {command[0]}: {exc.strerror}") from None
    except OSError as exc:
        raise CannotStart(f"cannot execute {command[0]}: {exc}") from None
    finally:
        out.close()
        err.close()


# ------------------------------------------------------------------------------- ending it
def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def end_process_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the program's process group, SIGKILL to whatever is left after `grace_s`, then
    wait (a few seconds at most) until none of it runs. A second Ctrl-C skips the grace."""
    pgid = proc.pid  # start_in_session: the program leads its own group
    interrupted = False
    try:
        signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_members(pgid):
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True  # straight to SIGKILL; the interrupt goes on once the group is gone
    finally:
        signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5.0
        while group_members(pgid) and time.monotonic() < deadline:
            signal_group(pgid, signal.SIGKILL)
            time.sleep(0.05)
    if interrupted:
        raise KeyboardInterrupt


def exit_text(returncode: int, stderr_tail: str) -> str:
    """"exit 3: <tail>" / "killed by SIGKILL: <tail>" (the tail omitted when empty)."""
    if returncode < 0:
        try:
            head = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            head = f"killed by signal {-returncode}"
    else:
        head = f"exit {returncode}"
    return f"{head}: {stderr_tail}" if stderr_tail else head


def stderr_tail(path: Path) -> str:
    """The last few non-empty lines of the program's stderr, on one line."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    tail = " | ".join(lines[-STDERR_TAIL_LINES:])
    return tail if len(tail) <= STDERR_TAIL_CHARS else "…" + tail[-STDERR_TAIL_CHARS:]


# ------------------------------------------------------------------------------- the trial
def run_trial(command: Sequence[str], num_workers: int | None, reason: TrialReason,
              settings: TrialSettings, *, run: int = 1, environ: Mapping[str, str] = os.environ,
              on_phase: Callable[[str], None] | None = None) -> TrialOutcome:
    """Run, measure and end one trial. Raises CannotStart, and lets KeyboardInterrupt through
    (after ending the program and removing the trial's files)."""
    from loadertop.client.model import Model
    from loadertop.client.subscriber import Subscriber

    directory = _trial_dir()
    began = time.monotonic()
    try:
        proc = start_program(command, trial_env(environ, directory, num_workers), directory)
        try:
            sub = Subscriber(Model(window_s=settings.trial_s), None, directory=directory,
                             discover=True)
            try:
                measurement = _Measurement(sub, proc, num_workers, settings, on_phase)
                measurement.run()
            finally:
                sub.close()
        finally:
            end_process_group(proc, settings.grace_s)
        returncode = proc.returncode if measurement.ended else None
        figures = measurement.figures(reason, run, returncode, stderr_tail(directory / "stderr"))
        return TrialOutcome(figures=figures, source=measurement.main_source,
                            system=measurement.last_system, no_loader=measurement.first_batch is None,
                            duration_s=time.monotonic() - began)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class _Measurement:
    """The phases of one trial, and what they saw (see the module docstring)."""

    def __init__(self, sub: Subscriber, proc: subprocess.Popen[bytes], num_workers: int | None,
                 settings: TrialSettings, on_phase: Callable[[str], None] | None) -> None:
        self.sub, self.model, self.proc = sub, sub.model, proc
        self.requested = num_workers
        self.settings = settings
        self.on_phase = on_phase or (lambda phase: None)
        self.started = time.time()
        self.first_batch: float | None = None
        self.measure_from: float | None = None
        self.measure_to: float | None = None
        self.ended = False  # the program ended by itself before the measurement was over
        self.document: Document | None = None
        self.systems: dict[float, SystemFigures] = {}  # by sent_at: each machine sample once
        self.main_source: Source | None = None
        self.last_system: SystemFigures | None = None

    # ---- phases
    def run(self) -> None:
        self.on_phase("starting")
        self._until_first_batch()
        if self.first_batch is None:
            return
        if not self.ended:
            self.on_phase("warming up")
            if self._warm_up():
                self.on_phase("measuring")
                self._measure()
        self._finish()

    def _poll(self, timeout_s: float = POLL_S) -> bool:
        """Receive for up to timeout_s; False once the program has ended."""
        if not self.sub.found_any():
            self.sub.rescan()  # right away, not at the subscriber's 1 s rescan
        self.sub.poll(timeout_ms=max(0.0, timeout_s) * 1000)
        if self.proc.poll() is not None:
            self.sub.poll(timeout_ms=0)  # what it sent before it ended
            self.ended = True
            return False
        return True

    def _until_first_batch(self) -> None:
        deadline = time.monotonic() + self.settings.start_s
        while time.monotonic() < deadline:
            alive = self._poll()
            if self._batches_total() > 0:
                self.first_batch = time.time()
                return
            if not alive:
                return

    def _warm_up(self) -> bool:
        assert self.first_batch is not None
        warm_until = self.first_batch + self.settings.warmup
        give_up = self.first_batch + max(self.settings.warmup, 2 * self.settings.trial_s)
        first_total = self._batches_total()
        while time.time() < give_up:
            if not self._poll():
                return False
            state = self._busiest()
            if state is None or state.last is None:
                continue
            config = state.last.config
            capacity = config.num_workers * (config.prefetch_factor or DEFAULT_PREFETCH)
            needed = max(WARMUP_MIN_BATCHES, WARMUP_CAPACITY_ROUNDS * capacity)
            if time.time() >= warm_until and state.batches_total - first_total >= needed:
                return True
        return True  # a slow loader: measure anyway, the warm-up had its time

    def _measure(self) -> None:
        self.measure_from = time.time()
        end = self.measure_from + self.settings.trial_s
        next_sample = self.measure_from + SAMPLE_S
        while (now := time.time()) < end:
            if not self._poll(min(end - now, POLL_S)):
                break
            if time.time() >= next_sample:
                next_sample += SAMPLE_S
                self._advance(time.time())

    def _finish(self) -> None:
        now = time.time()
        start = self.measure_from if self.measure_from is not None else self.first_batch
        if start is None:
            return
        self.measure_to = now
        self.model.window_s = max(0.001, now - start)  # the window is the measurement, no more
        self._advance(now)

    def _advance(self, now: float) -> None:
        self.document = self.model.advance(now)
        system = self.document.system
        if system is not None and self.measure_from is not None:
            self.systems[system.sent_at] = system
            self.last_system = system

    # ---- reading the model
    def _batches_total(self) -> int:
        return max((s.batches_total for s in self.model.sources.values()), default=0)

    def _busiest(self) -> SourceState | None:
        states = [s for s in self.model.sources.values() if s.last is not None]
        return max(states, key=lambda s: s.batches_total, default=None)

    def _main_group(self) -> list[Source]:
        """The main loader's sources (one per rank): the name with the most batches."""
        doc = self.document
        if doc is None or not doc.sources:
            return []
        by_name: dict[str, list[Source]] = {}
        for source in doc.sources:
            by_name.setdefault(source.name, []).append(source)
        group = max(by_name.values(), key=lambda g: (sum(s.batches for s in g),
                                                     sum(s.batches_total for s in g)))
        return sorted(group, key=lambda s: -s.batches)

    # ---- the result
    def figures(self, reason: TrialReason, run: int, returncode: int | None,
                tail: str) -> TrialFigures:
        group = self._main_group()
        self.main_source = group[0] if group else None
        exit_line = exit_text(returncode, tail) if returncode is not None else None
        if returncode == 0:
            exit_line = "exit 0: the program ended during the trial" + (f": {tail}" if tail else "")
        if not group:
            problem = (f"no DataLoader delivered a batch within {self.settings.start_s:g} s"
                       if not self.ended else "the program ended before its first DataLoader batch")
            return TrialFigures(
                num_workers=self.requested, samples_per_s=None, wait_fraction=None,
                cpu_percent=None, mem_available_bytes=None, swap_active=None, category=None,
                exit=exit_line, exit_code=returncode, run=run, reason=reason, problem=problem)
        main = group[0]
        measured_s = (self.measure_to or 0.0) - (self.measure_from or self.first_batch or 0.0)
        counts = sorted({s.config.num_workers for s in group})
        trouble: str | None = None
        too_short = self.measure_from is None or \
            measured_s < min(MIN_MEASURED_S, self.settings.trial_s / 2)
        if self.requested is not None and counts != [self.requested]:
            trouble = (f"the main loader ran with num_workers={','.join(map(str, counts))}, not "
                       f"{self.requested}: the override did not reach it")
        elif too_short:
            trouble = (f"the program ended {max(0.0, measured_s):.1f} s into the measurement"
                       if self.measure_from is not None else "the program ended during the warm-up")
        rate, batch_rate, unit_batch_size = self._rates(group)
        spread = self._spread(group)
        memory = self._memory()
        rss = [w.rss_bytes for s in group for w in s.workers if w.rss_bytes is not None]
        uss = [w.uss_bytes for s in group for w in s.workers if w.uss_bytes is not None]
        waits = [s.wait_fraction for s in group if s.wait_fraction is not None]
        return TrialFigures(
            num_workers=counts[0] if self.requested is None else self.requested,
            samples_per_s=None if too_short else _round(rate),
            wait_fraction=round(sum(waits) / len(waits), 3) if waits else None,
            cpu_percent=memory.cpu_percent,
            mem_available_bytes=memory.mem_available_bytes,
            swap_active=memory.swap_active,
            category=main.diagnosis.category,
            exit=exit_line, exit_code=returncode, run=run, reason=reason,
            spread_samples_per_s=_round(spread),
            batches_per_s=_round(batch_rate),
            batch_size=unit_batch_size,
            loader=main.name, sources=len(group),
            workers_rss_bytes=sum(rss) if rss else None,
            worker_rss_bytes=round(sum(rss) / len(rss)) if rss else None,
            worker_uss_bytes=round(sum(uss) / len(uss)) if uss else None,
            memory_short=memory.short or main.diagnosis.category == diagnosis.MEMORY_PRESSURE,
            measured_s=round(max(0.0, measured_s), 2),
            startup_s=round(self.first_batch - self.started, 2) if self.first_batch else None,
            batches_per_epoch=_round(self._batches_per_epoch(group), 1),
            iterable=self._iterable(group),
            problem=trouble,
        )

    @staticmethod
    def _rates(group: list[Source]) -> tuple[float | None, float | None, int | None]:
        """(samples/s — batches/s where a batch size is unknown —, batches/s, the batch size
        when every source has the same one)."""
        batch_rates = [s.batches_per_s for s in group if s.batches_per_s is not None]
        if not batch_rates:
            return None, None, None
        sizes = {s.config.batch_size for s in group}
        if all(s.samples_per_s is not None for s in group):
            rate = sum(s.samples_per_s or 0.0 for s in group)
        else:
            rate = sum(batch_rates)
        size = sizes.pop() if len(sizes) == 1 else None
        return rate, sum(batch_rates), size

    def _spread(self, group: list[Source]) -> float | None:
        """The standard error of the rate, from the rate of every SAMPLE_S of the measurement.

        A part's rate is its batches over the loop's own time for them (the sums of their waits
        and steps, which add up to the wall time the loop spent on them), not over the part's
        length: a steady pipeline then shows no scatter from where the parts' edges fall between
        two batches; bursts (more workers than the storage serves) still show."""
        if self.measure_from is None or self.measure_to is None:
            return None
        parts: dict[int, dict[str, list[float]]] = {}
        for source in group:
            state = self.model.sources.get(source.id)
            if state is None:
                continue
            scale = (source.config.batch_size or 1) if source.samples_per_s is not None else 1
            for received, report in state.reports:
                if not self.measure_from <= received <= self.measure_to or not report.batches:
                    continue
                part = int((received - self.measure_from) // SAMPLE_S)
                sums = parts.setdefault(part, {}).setdefault(source.id, [0.0, 0.0])
                sums[0] += report.batches * scale
                sums[1] += (report.wait_ns + report.step_ns) / 1e9
        rates = [sum(b / t for b, t in per.values() if t > 0) for _, per in sorted(parts.items())]
        return standard_error(rates)

    def _batches_per_epoch(self, group: list[Source]) -> float | None:
        """The main loader's batches per epoch, from the epochs that began during the trial: an
        epoch's start lies inside the first report that carries its number, estimated at that
        report's middle; at least two starts are needed."""
        lengths = []
        for source in group:
            state = self.model.sources.get(source.id)
            if state is None:
                continue
            starts: list[tuple[int, float]] = []
            previous = None
            for _, report in state.reports:
                if previous is not None and report.epoch > previous.epoch:
                    starts.append((report.epoch, report.batches_total - (report.batches + 1) / 2))
                previous = report
            if len(starts) >= 2 and starts[-1][0] > starts[0][0]:
                lengths.append((starts[-1][1] - starts[0][1]) / (starts[-1][0] - starts[0][0]))
        return sum(lengths) / len(lengths) if lengths else None

    def _iterable(self, group: list[Source]) -> bool | None:
        state = self.model.sources.get(group[0].id)
        if state is None or state.last is None:
            return None
        return bool(state.last.config.iterable)

    def _memory(self) -> _MemoryFigures:
        samples = list(self.systems.values())
        if not samples and self.last_system is not None:
            samples = [self.last_system]
        cpu = [s.cpu_percent for s in samples if s.cpu_percent is not None]
        available = [s.mem_available_bytes for s in samples if s.mem_available_bytes is not None]
        swap_known = [s for s in samples if s.swap_in_bytes_per_s is not None]
        swap = None
        if swap_known:
            swap = any(_swapping(s) for s in swap_known)
        low = any(s.mem_available_bytes is not None and s.mem_total_bytes
                  and s.mem_available_bytes < diagnosis.MEM_AVAILABLE_MIN_FRACTION * s.mem_total_bytes
                  for s in samples)
        return _MemoryFigures(cpu_percent=round(sum(cpu) / len(cpu), 1) if cpu else None,
                              mem_available_bytes=min(available) if available else None,
                              swap_active=swap, short=bool(swap) or low)


@dataclass(frozen=True)
class _MemoryFigures:
    cpu_percent: float | None
    mem_available_bytes: int | None
    swap_active: bool | None
    short: bool


def standard_error(rates: Sequence[float]) -> float | None:
    """The standard error of the mean of consecutive parts' rates, corrected for their lag-1
    correlation: Var(mean) = s²/n × (1 + 2ρ₁), at least s²/n².

    Why the correction: where the workers deliver in bursts (more workers than the storage
    serves), a part's edges cut a burst; the batch one part misses the next one has, so
    neighbouring parts err in opposite directions (ρ₁ near −0.5) and their errors cancel in the
    mean — the whole window is cut only at its two ends. The plain s/√n counted that scatter
    as noise of the mean: measured here on 3 slots with 5 workers, ±4 % from each 5 s trial
    while three trials agreed within 1 %. Fluctuations that last (a busy machine) keep ρ₁ >= 0
    and the plain figure. None with fewer than 3 parts."""
    n = len(rates)
    if n < 3:
        return None
    mean = sum(rates) / n
    variance = sum((r - mean) ** 2 for r in rates) / (n - 1)
    if variance <= 0:
        return 0.0
    lag1 = sum((rates[i] - mean) * (rates[i + 1] - mean) for i in range(n - 1)) / (n - 1) / variance
    factor = max(1.0 + 2.0 * max(-0.5, min(1.0, lag1)), 1.0 / n)
    return math.sqrt(variance * factor / n)


def _swapping(system: SystemFigures) -> bool:
    """The diagnosis's rule for swap activity: swap-in at its rate, or swap-out at it while
    little memory is available (swap-out alone, with plenty left, is the kernel making room for
    page cache)."""
    rate = diagnosis.SWAP_RATE_MIN_BYTES_PER_S
    if (system.swap_in_bytes_per_s or 0.0) >= rate:
        return True
    low = (system.mem_available_bytes is not None and system.mem_total_bytes
           and system.mem_available_bytes
           < diagnosis.MEM_AVAILABLE_SWAP_OUT_FRACTION * system.mem_total_bytes)
    return bool((system.swap_out_bytes_per_s or 0.0) >= rate and low)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)
