"""Findings from the loop's and workers' timing: hangs, deaths, slow workers, random states,
epoch starts. Pure: figures in, findings out (no I/O, no torch)."""

from __future__ import annotations

import re
import signal
from typing import Final

from loadertop import diagnosis
from loadertop.client.document import Finding, SourceFigures, StackFigures, SystemFigures, WorkerFigures
from loadertop.client.units import say_fraction, say_ms
from loadertop.diagnosis import short_frame, user_frame
from loadertop.findings._common import finding

# worker_hung: a worker inside one batch this long, and this many times its own recent p99 per
# batch; a worker with no batch in the window (it is stuck, after all) is judged by the floor
# when the loader delivered batches before, else by the no-history figure (a slow first batch
# is normal: workers open files, fill caches). The same figures as the loop's stall.
WORKER_HUNG_MIN_MS: Final = diagnosis.STALL_MIN_MS
WORKER_HUNG_FACTOR: Final = diagnosis.STALL_FACTOR
WORKER_HUNG_NO_HISTORY_MS: Final = diagnosis.STALL_NO_HISTORY_MS
# epoch_start_slow: the first batch of each of the last EPOCH_START_EPOCHS epochs took this long
# (the first epoch alone is not it: caches are cold once).
EPOCH_START_SLOW_MS: Final = 1000.0
EPOCH_START_EPOCHS: Final = 2

_LIVE_STATES = ("running", "waiting", "stalled")


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    out: list[Finding] = []
    live = source.state in _LIVE_STATES
    if live:
        out += worker_hung(source)
        out += loop_hung(source)
    out += worker_died(source)
    out += slow_worker(source)
    out += duplicate_rng(source)
    out += epoch_start_slow(source)
    return out


def _where(stack: StackFigures | None) -> str | None:
    frame = user_frame(stack) if stack is not None else None
    return short_frame(frame) if frame is not None else None


def worker_hung_threshold_ms(worker: WorkerFigures, batches_total: int) -> float:
    per_batch = None
    if worker.fetch_ms is not None:
        per_batch = worker.fetch_ms.p99 + (worker.collate_ms.p99 if worker.collate_ms else 0.0)
    if per_batch is None:
        return WORKER_HUNG_MIN_MS if batches_total > 0 else WORKER_HUNG_NO_HISTORY_MS
    return max(WORKER_HUNG_MIN_MS, WORKER_HUNG_FACTOR * per_batch)


def worker_hung(source: SourceFigures) -> list[Finding]:
    out = []
    for w in source.workers:
        if w.busy_ms is None or w.alive is False:
            continue
        threshold = worker_hung_threshold_ms(w, source.batches_total)
        if w.busy_ms < threshold:
            continue
        where = _where(w.stack)
        summary = f"worker {w.id} has been inside one batch for {say_ms(w.busy_ms)}"
        summary += f", at {where}" if where else ""
        evidence = [f"inside one batch for {say_ms(w.busy_ms)} (threshold {say_ms(threshold)})"]
        if w.fetch_ms is not None:
            evidence.append(f"its recent batches took {say_ms(w.fetch_ms.p50)} (p50)")
        if w.stack is None:
            evidence.append("no stack: the worker's watchdog file could not be read")
        advice = ["the stack shows where it is: a lock, a network read or a C call that never "
                  "returns; pass timeout=SECONDS to the DataLoader to turn a hang into an error"]
        if (source.config.worker_context or "fork") == "fork":
            advice.append("a deadlock right after fork (OpenMP/OpenCV threads, a lock held while "
                          "forking, pytorch#1355): try multiprocessing_context='spawn'")
        if w.pid is not None:
            advice.append(f"a live view of it: py-spy dump --pid {w.pid}")
        out.append(finding("worker_hung", "critical", source.id, w.id, summary, evidence, advice,
                           w.stack))
    return out


def loop_hung(source: SourceFigures) -> list[Finding]:
    blocked = source.blocked_ms
    if blocked is None:
        return []
    threshold = diagnosis.stall_threshold_ms(source.wait_ms, source.batches_total)
    if blocked < threshold:
        return []
    where = _where(source.loop_stack)
    summary = f"the training loop has been blocked in next() for {say_ms(blocked)}"
    summary += f", at {where}" if where else ""
    evidence = [f"blocked in next() for {say_ms(blocked)} (threshold {say_ms(threshold)})"]
    busy = [w for w in source.workers if w.busy_ms is not None and w.alive is not False]
    if source.config.num_workers:
        if busy:
            evidence.append("workers inside a batch: " + ", ".join(
                f"{w.id} for {say_ms(w.busy_ms or 0.0)}" for w in busy[:8]))
        elif source.queue.ready:
            evidence.append(f"{source.queue.ready} batches ready: the main process itself is "
                            "stuck (receiving, unpickling, pin_memory)")
    advice = ["the stack shows where the loop waits"]
    if busy:
        advice.append("the loop waits for a worker: see that worker's finding for its stack")
    advice.append("pass timeout=SECONDS to the DataLoader to turn a hang into an error")
    return [finding("loop_hung", "critical", source.id, None, summary, evidence, advice,
                    source.loop_stack)]


# torch 2.13 `_utils/signal_handling.py` / `DataLoader.cpp`: "DataLoader worker (pid 123) is killed
# by signal: Killed." and `dataloader.py`: "DataLoader worker (pid(s) 123, 124) exited unexpectedly"
_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_STRSIGNAL = {"Killed": signal.SIGKILL, "Bus error": signal.SIGBUS, "Segmentation fault":
              signal.SIGSEGV, "Aborted": signal.SIGABRT, "Terminated": signal.SIGTERM,
              "Floating point exception": signal.SIGFPE, "Illegal instruction": signal.SIGILL}


def _deaths_in_error(error: str | None) -> dict[int, int | None]:
    """pid -> exit code (negative: the signal) named in torch's error message."""
    out: dict[int, int | None] = {}
    if not error:
        return out
    for pid, name in _KILLED.findall(error):
        sig = _STRSIGNAL.get(name.strip())
        out[int(pid)] = -int(sig) if sig is not None else None
    for pids in _EXITED.findall(error):
        for pid in pids.replace(" ", "").split(","):
            if pid.isdigit():
                out.setdefault(int(pid), None)
    return out


def worker_died(source: SourceFigures) -> list[Finding]:
    error = source.end.error if source.end is not None and source.end.how == "crashed" else None
    named = _deaths_in_error(error)
    out = []
    reported: set[int | None] = set()
    for w in source.workers:
        code = w.exitcode if w.alive is False else None
        if code is None and w.pid in named:
            code = named[w.pid]
        dead = w.alive is False or w.pid in named
        # Exit 0 is a normal end; SIGTERM is torch's own shutdown of workers that did not stop
        # in time, unless the loop crashed.
        if not dead or code == 0 or (code == -signal.SIGTERM and error is None):
            continue
        if code is None and w.pid not in named:
            continue
        reported.add(w.pid)
        out.append(_death(source, w.id, w.pid, code, error))
    for pid, code in named.items():
        if pid not in reported:
            out.append(_death(source, None, pid, code, error))
    return out


def _death(source: SourceFigures, wid: int | None, pid: int | None, code: int | None,
           error: str | None) -> Finding:
    how = diagnosis.describe_exit(code)
    who = f"worker {wid}" if wid is not None else "a worker"
    summary = f"{who} (pid {pid if pid is not None else '?'}) died: {how}"
    if code == -signal.SIGKILL:
        summary += ", most likely the OOM killer"
    elif code == -signal.SIGBUS:
        summary += ", most likely /dev/shm full"
    evidence = [f"{who} {how}"]
    if error:
        evidence.append(f"the loop ended: {error[:500]}")
    return finding("worker_died", "critical", source.id, wid, summary, evidence,
                   diagnosis.exit_advice(code, pid))


def slow_worker(source: SourceFigures) -> list[Finding]:
    slow = diagnosis.slow_worker(source) if source.config.num_workers > 1 else None
    if slow is None:
        return []
    w = slow.worker
    evidence = [diagnosis.slow_worker_line(slow),
                f"the loop waits {say_fraction(source.wait_fraction or 0.0)} of the time "
                "(in-order delivery: every round waits for the slowest worker)"]
    ratio = diagnosis.slow_ratio_text(slow).replace("far more than", "far")
    return [finding("slow_worker", "warning", source.id, w.id,
                    f"worker {w.id} is {ratio} slower per batch than the others and holds the "
                    "in-order queue back", evidence, [diagnosis.slow_worker_advice(slow)])]


def duplicate_rng(source: SourceFigures) -> list[Finding]:
    out = []
    for share in source.rng.shared:
        workers = ", ".join(str(w) for w in share.workers)
        global_state = share.state in ("random", "numpy global", "torch")
        summary = (f"workers {workers} started with the same {share.state} state: their random "
                   "augmentations repeat")
        evidence = [f"{len(share.workers)} of the {source.rng.checked_workers} workers read "
                    f"started with an identical {share.state} state (digests compared once per "
                    "worker start, never drawn from)"]
        if global_state:
            advice = ["torch seeds random, numpy and torch differently in every worker: a "
                      "worker_init_fn re-seeds them alike; derive the seed from "
                      "torch.initial_seed() (e.g. np.random.seed(torch.initial_seed() % 2**32))"]
        else:
            advice = ["make the generator inside each worker: in __getitem__, "
                      "`if self.rng is None: self.rng = np.random.default_rng(torch.initial_seed())`"
                      " (torch gives every worker its own seed)",
                      "or in a worker_init_fn: `info = torch.utils.data.get_worker_info(); "
                      "info.dataset.rng = np.random.default_rng(info.seed)` (seed §5.3)"]
        out.append(finding("duplicate_rng", "warning", source.id, None, summary, evidence, advice))
    return out


def epoch_start_slow(source: SourceFigures) -> list[Finding]:
    recent = source.epoch_starts_ms[-EPOCH_START_EPOCHS:]
    if len(recent) < EPOCH_START_EPOCHS or min(recent) < EPOCH_START_SLOW_MS:
        return []
    config = source.config
    shown = ", ".join(say_ms(v) for v in source.epoch_starts_ms[-4:])
    evidence = [f"first batch of the last {len(source.epoch_starts_ms[-4:])} epochs: {shown} "
                f"(threshold {say_ms(EPOCH_START_SLOW_MS)} in each of the last "
                f"{EPOCH_START_EPOCHS})"]
    advice = []
    if config.num_workers and not config.persistent_workers:
        evidence.append(f"persistent_workers=False: {config.num_workers} workers are started "
                        f"anew each epoch ({config.worker_context or 'fork'})")
        advice.append("persistent_workers=True keeps the workers (and their open files and "
                      "caches) from one epoch to the next")
    if config.worker_context in ("spawn", "forkserver"):
        advice.append(f"each {config.worker_context} worker imports torch and your script's "
                      "modules again: keep the training script's top level light")
    advice.append("open files / build indexes lazily in the worker, not in the dataset's "
                  "__init__ or worker_init_fn, and cache what the next epoch needs again")
    return [finding("epoch_start_slow", "info", source.id, None,
                    f"each epoch's first batch takes {say_ms(recent[-1])}", evidence, advice)]
