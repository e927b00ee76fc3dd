"""Run the bootstrap inside a target at a safe point of its main thread, and read its answer.

The channel is the private discovery directory (0700, the user's own): attach writes
`<pid>-attach-<token>.py` there (the bootstrap with its parameters), the target runs it and
writes `<pid>-attach-<token>.result` (JSON). How the target is made to run it:
- Python >= 3.14 attaching to the same minor version: `sys.remote_exec(pid, file)`, which the
  interpreter runs at its next safe evaluation point in the main thread; no debugger.
- otherwise gdb (`gdb_script.py`): a pending call of `PyRun_SimpleString` on a statement that
  executes the file — run by the interpreter's main thread between two bytecodes.
If the main thread does not get there in time (blocked in C: a `join()`, a read), attach deletes
the file: whoever deletes it first — attach cancelling, or the bootstrap claiming it — decides,
so a pending call that runs later finds nothing and does nothing.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from loadertop import discovery
from loadertop.attach import AttachError, bootstrap
from loadertop.attach.target import Target, ptrace_error, state

GDB_SCRIPT = Path(__file__).with_name("gdb_script.py")
# The x86-64 core and SSE registers, no AVX: gdb's registers where it cannot write the XSAVE area
# (gdb_script.py says why); the features are gdb's own (gdb/features/i386/64bit-*.xml).
SSE_ONLY_TDESC = Path(__file__).with_name("x86-64-sse.xml")
BOOTSTRAP_SOURCE = Path(bootstrap.__file__)
GDB_TIMEOUT_S = 60.0  # gdb itself: startup, attach, two calls, detach; generous for a loaded machine
CLAIMED_GRACE_S = 30.0  # the bootstrap started in time: let it finish (imports, bind)
POLL_S = 0.02
GDB_SETTINGS = (
    "set debuginfod enabled off",  # never download symbols while the target stands still
    "set auto-load off",  # nor run libpython's gdb extensions
    "set auto-solib-add off",  # nor read libtorch's symbol tables: the addresses are known
    # gdb reads libc's symbols whatever auto-solib-add says (for thread debugging), and with its
    # separate debug info that alone kept the target stopped longest (docs/performance.md): no
    # debug files, and no libthread_db (gdb's ptrace attach stops every thread of /proc/PID/task
    # without it).
    "set debug-file-directory /nonexistent-loadertop",
    "set libthread-db-search-path /nonexistent-loadertop",
    "set unwindonsignal on",  # a signal inside a called function unwinds it, the thread intact
    "set pagination off",
    "set confirm off",
    "handle all nostop noprint pass",  # the job's signals (SIGCHLD of its workers...) pass through
    "handle SIGINT nostop noprint pass",  # `all` leaves SIGINT out: a Ctrl-C stays the job's
)


def gdb_path() -> str | None:
    return shutil.which("gdb")


def uses_remote_exec(target: Target) -> bool:
    return hasattr(sys, "remote_exec") and tuple(target.version[:2]) == sys.version_info[:2]


def run(target: Target, mode: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Have the target run the bootstrap in `mode` ("attach" / "detach"); its result dict (with
    "ok"), plus "stopped_ms" (how long gdb held the process stopped) when gdb was used."""
    pid = target.pid
    if target.uid != os.geteuid():
        # The target must read the bootstrap from our private directory, and write its answer.
        raise ptrace_error(pid, f"it runs as uid {target.uid}: run `loadertop attach` as that user")
    remote = uses_remote_exec(target)
    gdb = None if remote else gdb_path()
    if not remote and gdb is None:
        raise AttachError("no_gdb", "gdb is needed to attach (Python < 3.14) and is not installed: "
                                    "apt-get install gdb (Debian, Ubuntu), dnf install gdb (Fedora, "
                                    "RHEL), apk add gdb (Alpine), or conda install -c conda-forge gdb")
    directory = discovery.ensure_private_dir(discovery.discovery_dir())
    token = secrets.token_hex(4)
    script = directory / f"{pid}-attach-{token}.py"
    result_path = directory / f"{pid}-attach-{token}.result"
    wrapper = directory / f"{pid}-attach-{token}-run.py"  # sys.remote_exec runs a file
    params = dict(params, mode=mode, script=str(script), result=str(result_path))
    _write_private(script, f"PARAMS = {json.dumps(params)!r}\nPARAMS = __import__('json').loads("
                           f"PARAMS)\n" + BOOTSTRAP_SOURCE.read_text())
    statement = bootstrap.STATEMENT.format(path=str(script))
    stopped_ms = None
    try:
        if remote:
            _write_private(wrapper, statement)
            _remote_exec(pid, str(wrapper))
        else:
            assert gdb is not None
            stopped_ms = _schedule_with_gdb(gdb, target, statement)
        result = _wait(pid, script, result_path, timeout)
    finally:
        for path in (script, wrapper, result_path, Path(str(result_path) + ".tmp")):
            try:
                path.unlink()
            except OSError:
                pass
    if stopped_ms is not None:
        result["stopped_ms"] = stopped_ms
    return result


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _remote_exec(pid: int, path: str) -> None:
    try:
        sys.remote_exec(pid, path)  # type: ignore[attr-defined]  # Python >= 3.14
    except ProcessLookupError:
        raise AttachError("exited", f"pid {pid} exited during the attach") from None
    except PermissionError as exc:
        raise ptrace_error(pid, str(exc)) from None
    except (OSError, RuntimeError) as exc:
        raise AttachError("failed", f"sys.remote_exec on pid {pid} failed: {exc}") from None


def _schedule_with_gdb(gdb: str, target: Target, statement: str) -> float | None:
    """Schedule the statement as a pending call; the milliseconds the target was stopped (in
    all: twice where gdb could not write the XSAVE area the first time)."""
    first = _run_gdb(gdb, target, statement, sse_only=False)
    if first.scheduled:
        return first.stopped_ms
    # gdb could not have written the registers back: nothing was done to the target. A new gdb
    # (the first remembers that PTRACE_GETREGSET works and would use it again) with the core
    # and SSE registers only. It leaves AVX's upper halves and AVX-512's registers as the two
    # calls leave them: glibc's mmap wrapper and a CPython built for baseline x86-64 use no
    # VEX-encoded instruction, so they are the thread's own.
    second = _run_gdb(gdb, target, statement, sse_only=True)  # checks nothing: scheduled or raises
    return (first.stopped_ms or 0.0) + (second.stopped_ms or 0.0)


class _GdbRun:
    __slots__ = ("scheduled", "stopped_ms", "message")

    def __init__(self, scheduled: bool, stopped_ms: float | None, message: str) -> None:
        self.scheduled = scheduled
        self.stopped_ms = stopped_ms
        self.message = message


def _run_gdb(gdb: str, target: Target, statement: str, *, sse_only: bool) -> _GdbRun:
    """One gdb: scheduled, or an unwritable XSAVE area (not scheduled, the target untouched);
    any other failure raises AttachError."""
    pid = target.pid
    params = {"pid": pid, "code": statement, "mmap": target.mmap,
              "add_pending_call": target.add_pending_call,
              "run_simple_string": target.run_simple_string, "probe_xstate": not sse_only}
    command = [gdb, "-nx", "-batch", "-q"]
    for setting in GDB_SETTINGS:
        command += ["-iex", setting]
    if sse_only:
        command += ["-iex", f"set tdesc filename {SSE_ONLY_TDESC}"]
    command += ["-x", str(GDB_SCRIPT)]
    env = dict(os.environ, LOADERTOP_GDB_PARAMS=json.dumps(params))
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=GDB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Interrupt, never kill, a gdb inside a call: SIGINT makes it stop the call and unwind it
        # (unwindonsignal), then the script detaches. A gdb killed mid-call would leave its
        # breakpoint in the target.
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            raise AttachError("failed", f"gdb did not finish within {GDB_TIMEOUT_S + 15:g} s "
                                        f"(gdb pid {proc.pid} left running)") from None
    answers = [line[len("LOADERTOP "):].split(" ", 1) for line in out.splitlines()
               if line.startswith("LOADERTOP ")]
    stopped = next((a[1] for a in answers if a[0] == "stopped-ms" and len(a) > 1), None)
    stopped_ms = float(stopped.split()[0]) if stopped else None
    for answer in answers:
        kind, rest = answer[0], (answer[1] if len(answer) > 1 else "")
        if kind == "scheduled":
            return _GdbRun(True, stopped_ms, "")
        if kind in ("attach-failed", "error", "xstate-unwritable"):
            try:
                message = json.loads(rest)
            except ValueError:
                message = rest
            if kind == "xstate-unwritable" and state(pid) == "running":
                return _GdbRun(False, stopped_ms, str(message))
            raise _gdb_error(pid, kind, str(message))
    tail = " ".join((err or out).strip().splitlines()[-2:])
    if state(pid) != "running":
        raise AttachError("exited", f"pid {pid} exited during the attach")
    raise AttachError("failed", f"gdb could not attach to pid {pid} (exit {proc.returncode}): "
                                f"{tail or 'no output'}")


def _gdb_error(pid: int, kind: str, message: str) -> AttachError:
    if state(pid) != "running" or "No such process" in message:
        return AttachError("exited", f"pid {pid} exited during the attach")
    if "not permitted" in message or "Permission denied" in message:
        return ptrace_error(pid, f"gdb: {message.rstrip('.')}")
    where = "attach" if kind == "attach-failed" else "schedule the bootstrap in"
    return AttachError("failed", f"gdb could not {where} pid {pid}: {message}")


def _wait(pid: int, script: Path, result_path: Path, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    claimed = False
    while True:
        if result_path.exists():
            try:
                result: dict[str, Any] = json.loads(result_path.read_text())
                return result
            except (OSError, ValueError):
                pass  # replaced atomically: cannot be half-written; an odd error, retry once more
        if state(pid) != "running":
            raise AttachError("exited", f"pid {pid} exited during the attach")
        if time.monotonic() >= deadline:
            if claimed:
                raise AttachError("failed", f"pid {pid} started the attach but gave no answer "
                                            f"within {timeout + CLAIMED_GRACE_S:g} s")
            try:
                script.unlink()
            except FileNotFoundError:  # the bootstrap claimed it: it is running, let it finish
                claimed = True
                deadline = time.monotonic() + CLAIMED_GRACE_S
                continue
            raise AttachError("timeout", f"the main thread of pid {pid} ran no Python code within "
                                         f"{timeout:g} s (blocked in C: a join(), a read?); nothing "
                                         f"was changed")
        time.sleep(POLL_S)
