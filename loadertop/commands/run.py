"""`loadertop run [--listen ENDPOINT] [--] COMMAND ...`: COMMAND with every DataLoader instrumented.

How: the child's PYTHONPATH starts with `loadertop/probe/_bootstrap`, whose `sitecustomize`
(every Python started below COMMAND imports it at startup: scripts, `python -m`, torchrun's
ranks) patches `DataLoader.__iter__` when torch's dataloader module is imported — torch is never
imported early — and then chains to any other `sitecustomize` on the path. It is a no-op unless
LOADERTOP_RUN=1, which only this command sets. A Python started with -I, -E or -S (isolated, no
PYTHONPATH, no site) does not read it, and is not instrumented.

`run` itself only waits: the child's exit code is its exit code (128+N when the child was killed
by signal N), and the signals a job is stopped or steered with are forwarded to the child. As it
outlives the child, it tells the child's black box what the child cannot (`launch.ChildWatch`):
the exit code or the signal, and its memory cgroup's OOM kills, read the moment it died.
"""

from __future__ import annotations

import os
import signal
import sys

# Only what every `run` needs is imported here: `run` starts before the job and waits for it, so
# its own start-up is added to every job's (discovery's dataclasses and pathlib, socket and
# subprocess were a third of it: docs/performance.md); the rest is imported where it is used, and
# the job is started with os.posix_spawnp (see _start).
from loadertop import environment
from loadertop.commands import UsageError
from loadertop.launch import ChildWatch, child_env, exit_status

TYPE_CHECKING = False  # not typing's: see above
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

# SIGUSR1/2: SLURM and Lightning use them to ask a job to checkpoint or requeue.
FORWARDED = tuple(getattr(signal, name) for name in
                  ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))
SI_KERNEL = 0x80  # Linux si_code of a signal the kernel sent: a terminal's ^C, ^\, hangup
WAIT_SLICE_S = 0.5  # sigtimedwait's timeout: only a safety net, SIGCHLD wakes us at once

USAGE = """\
usage: loadertop run [--listen ENDPOINT] [--autotune] [--quiet] [--] COMMAND [ARG ...]

Run COMMAND with every torch.utils.data.DataLoader it creates instrumented, no code change:
  loadertop run -- python train.py --epochs 10
  loadertop run -- python -m mypkg.train
  loadertop run -- torchrun --nproc-per-node 4 train.py      (every rank is a source)
Then watch with `loadertop` (same user, same machine) or `loadertop snapshot`.

options:
  --listen ENDPOINT  publish on ENDPOINT instead of a private socket: tcp://HOST:PORT, HOST:PORT,
                     or PORT alone (= tcp://127.0.0.1:PORT). With torchrun, local rank N listens
                     on PORT+N. A host beyond loopback (0.0.0.0) makes the figures reachable from
                     the network: see docs/remote.md (SSH forwarding, CurveZMQ keys).
  --autotune         tune each loader's num_workers between epochs, and inside a long epoch of a
                     map-style loader, during this run (the order and content of batches do not
                     change; which worker makes which batch does: see docs/autotune.md). At exit
                     one line per loader says where it settled.
  -q, --quiet        do not print the one-line hint on stderr
  -h, --help         show this help

The exit code is COMMAND's (128+N if it was killed by signal N); SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 sent to `loadertop run` are passed on to COMMAND.
Names: a loader is named after the variable it is iterated from (train_loader), else loader0,
loader1, ...; loaders wrapped with loadertop.instrument(...) keep their name and are counted once.
"""


def parse(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """({listen, quiet, help, autotune}, command) — options stop at `--` or at the first non-option.

    `run`'s parser, written by hand rather than with argparse: `run` starts before the job, and
    its own start-up (argparse and gettext with it) would be added to every job's."""
    opts: dict[str, Any] = {"listen": None, "quiet": False, "help": False, "autotune": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            opts["help"] = True
            return opts, []
        if arg in ("-q", "--quiet"):
            opts["quiet"] = True
        elif arg == "--autotune":
            opts["autotune"] = True
        elif arg == "--listen" or arg.startswith("--listen="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            else:
                i += 1
                if i >= len(argv):
                    raise UsageError("--listen needs an endpoint (tcp://HOST:PORT)")
                value = argv[i]
            from loadertop import endpoints

            try:
                opts["listen"] = str(endpoints.parse_listen(value))
            except endpoints.EndpointError as exc:
                raise UsageError(f"--listen: {exc}") from None
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r} (put the command after `--`)")
        else:
            break
        i += 1
    command = argv[i:]
    if not command:
        raise UsageError("no command given (e.g. loadertop run -- python train.py)")
    return opts, command


def main(argv: list[str]) -> int:
    try:
        opts, command = parse(argv)
    except UsageError as exc:
        print(f"loadertop run: {exc}\n\n{USAGE}", file=sys.stderr, end="")
        return 2
    if opts["help"]:
        sys.stdout.write(USAGE)
        return 0
    env = child_env(os.environ, opts["listen"])
    if opts["autotune"]:
        env[environment.LOADERTOP_AUTOTUNE] = "1"
    if not opts["quiet"]:
        print(_hint(env), file=sys.stderr, flush=True)
    warning = torch_warning(command, env)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    if hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask"):
        return _run_sigwait(command, env)
    return _run_handlers(command, env)  # pragma: no cover - macOS: no sigtimedwait


def _hint(env: dict[str, str]) -> str:
    listen = environment.endpoint(env)
    where = listen or f"private sockets in {environment.discovery_dir(env)}"
    watch = "loadertop"  # discovery: every instrumented process of this user on this machine
    if listen:
        import socket

        from loadertop import endpoints

        try:
            endpoint = endpoints.parse_listen(listen)
        except endpoints.EndpointError:
            endpoint = None  # the job's publisher says what is wrong with it, once
        if endpoint is None:
            watch = f"loadertop {listen}"
        elif endpoint.transport == "tcp" and not endpoint.port:
            pass  # any free port: known once bound, and written in the discovery entry
        elif endpoint.is_wildcard:  # from elsewhere, reached by this host's name
            watch = f"loadertop tcp://{socket.gethostname()}:{endpoint.port}"
        else:
            watch = f"loadertop {endpoint}"
    if env.get(environment.LOADERTOP_CURVE_SECRET):
        watch += " --key VIEWER.key_secret --server-key TRAINER.key"
    return f"loadertop run: this job's DataLoaders publish on {where}; watch with: {watch}"


def torch_warning(command: list[str], env: dict[str, str]) -> str | None:
    """One line when COMMAND is known to run this very Python and this Python has no torch (a
    watching-only install): its DataLoaders cannot be instrumented here.

    `run` itself needs no torch, and COMMAND may run another Python (another virtualenv, a
    script's #! line) that has both torch and loadertop: so this is a warning, given only when
    COMMAND's Python is known to be ours. When it is another one, or cannot be told (a shell
    script), `run` stays silent: a child Python that lacks loadertop says so itself (the start-up
    hook), and one that lacks torch fails at its own `import torch` with Python's clear error."""
    if _importable("torch"):
        return None
    python = python_of(command, env.get("PATH"))
    if python is None or not _is_this_python(python):
        return None
    return (f"loadertop run: torch is not installed in {sys.executable}, the Python that runs "
            f"{command[0]}: its DataLoaders cannot be instrumented (install torch there)")


def _importable(name: str) -> bool:
    """importlib.util.find_spec(name) is not None, for a top-level name, without importing
    importlib.util (and contextlib with it, a part of `run`'s start-up outside an editable
    install, whose finder imports them anyway: docs/performance.md)."""
    if name in sys.modules:
        return True
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            if find is not None and find(name, None) is not None:
                return True
        except Exception:
            continue
    return False


def python_of(command: list[str], search_path: str | None) -> str | None:
    """The Python executable COMMAND starts, when it can be told without running anything:
    COMMAND is a Python itself, or a script whose #! line names one (torchrun and other console
    scripts, `#!/usr/bin/env python3`). None otherwise."""
    import shutil

    program = shutil.which(command[0], path=search_path) if command else None
    if program is None:
        return None
    if os.path.basename(program).startswith("python"):
        return program
    try:
        with open(program, "rb") as f:
            first_line = f.readline(512)
    except OSError:
        return None
    if not first_line.startswith(b"#!"):
        return None
    words = first_line[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if not words or not os.path.basename(words[0]).startswith("python"):
        return None
    return words[0] if os.path.isabs(words[0]) else shutil.which(words[0], path=search_path)


def _is_this_python(path: str) -> bool:
    # A virtualenv is known by its bin directory (its python is a symlink to the base one), and
    # two Pythons of one directory (python3.11, python3.12) by the file the names point to.
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(path)
    return (os.path.dirname(here) == os.path.dirname(there)
            and os.path.realpath(here) == os.path.realpath(there))


def _start(command: list[str], env: dict[str, str],
           sigmask: Iterable[int] | None = None) -> tuple[int, None] | tuple[None, int]:
    """(pid, None), or (None, the exit code a shell would give) for a command it cannot run.

    posix_spawn, not subprocess: `run` starts before the job and its own start-up is the job's
    (subprocess, with selectors and threading, was half of the launcher's imports:
    docs/performance.md).
    The child gets the signal mask `run` had before blocking (`sigmask`) and SIGPIPE and SIGXFSZ
    back at their defaults (Python ignores them; subprocess's restore_signals does the same).
    Descriptors: Python opens its own close-on-exec, so the child gets what `run` was given."""
    defaults = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ")
                     if hasattr(signal, name))
    try:
        if sigmask is None:
            return os.posix_spawnp(command[0], command, env, setsigdef=defaults), None
        return os.posix_spawnp(command[0], command, env, setsigdef=defaults,
                               setsigmask=sigmask), None
    except FileNotFoundError:
        print(f"loadertop run: command not found: {command[0]}", file=sys.stderr)
        return None, 127
    except PermissionError as exc:
        print(f"loadertop run: cannot execute {command[0]}: {exc.strerror}", file=sys.stderr)
        return None, 126
    except OSError as exc:
        print(f"loadertop run: cannot execute {command[0]}: {exc}", file=sys.stderr)
        return None, 126


def _poll(pid: int) -> int | None:
    """The child's return code once it has ended (-N: killed by signal N), else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def _run_sigwait(command: list[str], env: dict[str, str]) -> int:
    """Block the signals and take them with sigtimedwait, which says who sent each one.

    A terminal's ^C (or ^\\, or a hangup) goes to the whole foreground process group, the child
    included: forwarding it as well would interrupt the child twice — the second
    KeyboardInterrupt landing in its cleanup. So a kernel-sent signal is forwarded only when the
    child has left our process group; one sent with kill() to `run` alone is always forwarded.
    """
    watched = set(FORWARDED) | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        started = _start(command, env, sigmask=old_mask)
        if started[0] is None:
            return started[1]  # it could not start: the exit code a shell would give
        pid = started[0]
        watch = ChildWatch(pid, env)  # its cgroup's OOM counters at its start
        while True:
            returncode = _poll(pid)
            if returncode is not None:
                watch.record(returncode)  # at once: the cgroup as the death left it
                return exit_status(returncode)
            info = signal.sigtimedwait(watched, WAIT_SLICE_S)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_code == SI_KERNEL and _same_process_group(pid):
                continue  # the terminal delivered it to the child already
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
    finally:
        # Signals that arrived while the child was exiting must not hit `run` once unblocked
        # (a late SIGINT would turn the child's exit code into a KeyboardInterrupt here).
        while signal.sigtimedwait(watched, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _same_process_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == os.getpgrp()
    except OSError:
        return False


def _run_handlers(command: list[str], env: dict[str, str]) -> int:  # pragma: no cover - non-Linux
    """Without sigtimedwait: handlers forward; a ^C while we are the terminal's foreground
    group already reached the child, so SIGINT is forwarded only otherwise."""
    started = _start(command, env)
    if started[0] is None:
        return started[1]  # it could not start: the exit code a shell would give
    pid = started[0]
    watch = ChildWatch(pid, env)

    def forward(signum: int, frame: object) -> None:
        if signum == signal.SIGINT and _foreground():
            return
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        watch.record(returncode)
        return exit_status(returncode)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _foreground() -> bool:  # pragma: no cover - non-Linux
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
