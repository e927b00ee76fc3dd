"""How a job's run ended, in the one set of words every screen uses (docs/contract.md §9).

`loadertop ls`, the view of an ended job's black box (its first line and each source's block),
the HTML report, the live viewer (a source's `end` in the document, the TUI's "✖" lines) all say
a job's end with an `Ending` made here, from whatever saw the end:

- `finished(at, exit_code)`: the interpreter exited; an exit code 128+N where N is a signal reads
  as that signal (a handler that turned SIGTERM into `SystemExit(143)`, a shell's convention);
- `signalled(name, at)`: a signal ended it;
- `raised(type, message, at)`: an exception ended it (uncaught, or out of the loop's `next()`):
  `SystemExit` reads as the exit it asked for, `KeyboardInterrupt` as SIGINT (Python's own
  reading of ^C);
- `killed(cause, at, oom=…)`: it died without a goodbye (SIGKILL), its cause as far as the
  evidence tells (`recording.blackbox.ending_of` weighs it).

`Ending.text` is the contract's string (`ended` in `ls --json`); `end_figures` makes a source's
`end` (docs/contract.md §5) of it, so the document says what `ls` says.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from loadertop.client.document import EndFigures
from loadertop.statedir import system_exit_code

EndKind = Literal["running", "finished", "exception", "signal", "killed"]
#: The OOM killer as the evidence names it: its cgroup counted the kill, or memory was near a limit.
OomEvidence = Literal["counted", "likely"]

#: A source's `end.how` (docs/contract.md §5) for each kind of end.
HOW: dict[EndKind, Literal["finished", "crashed", "stopped", "died"]] = {
    "finished": "finished", "exception": "crashed", "signal": "stopped", "killed": "died"}

MESSAGE_CHARS = 200  # an exception's message, on the one line it is said on


@dataclass(frozen=True)
class Ending:
    """How a job's run ended. `text` is the contract's string (what `ls` shows); `cause`, for a
    kill, what the evidence says ("its cgroup's limit 1.1 GiB was reached"); `oom`, whether it
    names the OOM killer (its cgroup counted the kill, or memory was near a limit: likely);
    `note`, for a kill with no cause, why none is known; `evidence`, what else the evidence
    says, one line each ("its cgroup's peak usage 1.1 GiB")."""

    kind: EndKind
    text: str
    cause: str | None = None
    at: float | None = None  # when it ended, as far as known (Unix time)
    oom: OomEvidence | None = None
    note: str | None = None
    evidence: tuple[str, ...] = ()

    def sentence(self, pid: int) -> str:
        """The ending said of `pid` in one line, as a viewer that saw it die says it."""
        if self.kind == "killed":
            if self.oom == "counted":
                return f"pid {pid} died without a goodbye: killed by the OOM killer — {self.cause}"
            if self.oom == "likely":
                return f"pid {pid} died without a goodbye: killed, likely by the OOM killer — {self.cause}"
            if self.note is not None:
                return f"pid {pid} died without a goodbye ({self.note})"
            return (f"pid {pid} died without a goodbye: killed (SIGKILL, or a signal Python could not "
                    "handle), cause unknown — neither its cgroup's OOM-kill counter nor its last "
                    "memory points to the OOM killer")
        if self.kind == "running":
            return f"pid {pid} is running"
        return f"pid {pid} ended: {self.text}"


RUNNING = Ending("running", "running")


def signal_name(number: int) -> str:
    """"SIGTERM" for 15; "signal 99" for a number that names none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def finished(at: float | None = None, exit_code: int | None = None) -> Ending:
    """The interpreter exited with `exit_code` (None: not known, 0 assumed). 128+N, N a signal,
    reads as that signal: the shell's convention, and what a handler raising `SystemExit(128 +
    signum)` means (`loadertop demo`'s job does it; so do many training scripts)."""
    if exit_code is not None and exit_code > 128:
        try:
            return signalled(signal.Signals(exit_code - 128).name, at)
        except ValueError:
            pass
    text = "finished" if not exit_code else f"finished (exit code {exit_code})"
    return Ending("finished", text, at=at)


def signalled(name: str, at: float | None = None) -> Ending:
    return Ending("signal", f"signal: {name}", at=at)


def raised(exc_type: str | None, message: str | None, at: float | None = None) -> Ending:
    """An exception ended it: `SystemExit` as the exit it asked for (`sys.exit(3)`: exit code 3;
    `sys.exit("text")`: 1, as Python exits), `KeyboardInterrupt` as SIGINT."""
    if exc_type == "SystemExit":
        return finished(at, system_exit_code(message))
    if exc_type == "KeyboardInterrupt":
        return signalled("SIGINT", at)
    text = f"exception: {exc_type or 'Exception'}"
    if message:
        text += f": {one_line(message)}"
    return Ending("exception", text, at=at)


def killed(cause: str | None, at: float | None = None, *, oom: OomEvidence | None = None,
           note: str | None = None, evidence: tuple[str, ...] = ()) -> Ending:
    """Died without a goodbye: by the OOM killer (`oom`, `cause` saying why), or `unknown cause`."""
    if oom == "counted":
        text = f"killed: SIGKILL (OOM killer: {cause})"
    elif oom == "likely":
        text = f"killed: SIGKILL (OOM killer: likely — {cause})"
    else:
        text = "killed: unknown cause"
    return Ending("killed", text, cause, at, oom, note, evidence)


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def end_figures(ending: Ending, pid: int, *, error: str | None = None,
                at: float | None = None) -> EndFigures:
    """A source's `end` for `ending` of its process `pid`: `how` by its kind, `ended` its words;
    `error` the exception that left the loop's `next()` ("Type: message"), or for a death without
    a goodbye the line that says it (docs/contract.md §9)."""
    how = HOW.get(ending.kind, "finished")
    if how == "died":
        error = ending.sentence(pid)
    when = at if at is not None else ending.at
    return EndFigures(how=how, error=error[:2000] if error is not None else None,
                      at=round(when, 3) if when is not None else None, ended=ending.text,
                      oom_killer=ending.oom)
