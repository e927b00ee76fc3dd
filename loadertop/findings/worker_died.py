"""worker_died: a worker exited abnormally (or torch's error names one that did)."""

from __future__ import annotations

import re
import signal
from typing import Final

from loadertop import diagnosis
from loadertop.client.document import (
    Finding,
    SourceFigures,
    SystemFigures,
)
from loadertop.findings._common import finding

KIND: Final = "worker_died"


def detect(source: SourceFigures, system: SystemFigures | None) -> list[Finding]:
    return _worker_died(source)


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


def _worker_died(source: SourceFigures) -> list[Finding]:
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
