"""`loadertop run [--listen ENDPOINT] [--] COMMAND ...`: COMMAND with every DataLoader instrumented.

How: the child's PYTHONPATH starts with `loadertop/probe/_bootstrap`, whose `sitecustomize`
(every Python started below COMMAND imports it at startup: scripts, `python -m`, torchrun's
ranks) patches `DataLoader.__iter__` when torch's dataloader module is imported — torch is never
imported early — and then chains to any other `sitecustomize` on the path. It is a no-op unless
LOADERTOP_RUN=1, which only this command sets. A Python started with -I, -E or -S (isolated, no
PYTHONPATH, no site) does not read it, and is not instrumented.

`run` itself only waits: the child's exit code is its exit code (128+N when the child was killed
by signal N), and the signals a job is stopped or steered with are forwarded to the child.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

from loadertop import discovery

ENV_RUN = "LOADERTOP_RUN"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "probe", "_bootstrap")
# SIGUSR1/2: SLURM and Lightning use them to ask a job to checkpoint or requeue.
FORWARDED = tuple(getattr(signal, name) for name in
                  ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                  if hasattr(signal, name))
SI_KERNEL = 0x80  # Linux si_code of a signal the kernel sent: a terminal's ^C, ^\, hangup
WAIT_SLICE_S = 0.5  # sigtimedwait's timeout: only a safety net, SIGCHLD wakes us at once

USAGE = """\
usage: loadertop run [--listen ENDPOINT] [--quiet] [--] COMMAND [ARG ...]

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
  -q, --quiet        do not print the one-line hint on stderr
  -h, --help         show this help

The exit code is COMMAND's (128+N if it was killed by signal N); SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 sent to `loadertop run` are passed on to COMMAND.
Names: a loader is named after the variable it is iterated from (train_loader), else loader0,
loader1, ...; loaders wrapped with loadertop.instrument(...) keep their name and are counted once.
"""

_HOST_PORT = re.compile(r"^[\w.\-]+:\d+$|^\[[0-9a-fA-F:.]+\]:\d+$")


class UsageError(Exception):
    pass


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    """({listen, quiet, help}, command) — options stop at `--` or at the first non-option."""
    opts = {"listen": None, "quiet": False, "help": False}
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
        elif arg == "--listen" or arg.startswith("--listen="):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            else:
                i += 1
                if i >= len(argv):
                    raise UsageError("--listen needs an endpoint (tcp://HOST:PORT)")
                value = argv[i]
            opts["listen"] = listen_endpoint(value)
        elif arg.startswith("-"):
            raise UsageError(f"unknown option {arg!r} (put the command after `--`)")
        else:
            break
        i += 1
    command = argv[i:]
    if not command:
        raise UsageError("no command given (e.g. loadertop run -- python train.py)")
    return opts, command


def listen_endpoint(text: str) -> str:
    text = text.strip()
    if text.isdigit():
        text = f"tcp://127.0.0.1:{text}"  # a bare port stays on this machine
    elif "://" not in text and _HOST_PORT.match(text):
        text = f"tcp://{text}"
    if text.startswith("tcp://") and _HOST_PORT.match(text[len("tcp://"):].replace("*", "0.0.0.0")):
        return text
    if text.startswith("ipc://") and len(text) > len("ipc://"):
        return text
    raise UsageError(f"--listen: not an endpoint: {text!r} (expected tcp://HOST:PORT or PORT)")


def child_env(environ, listen: str | None) -> dict:
    env = dict(environ)
    env[ENV_RUN] = "1"
    env.pop("LOADERTOP_RUN_WARNED", None)
    env.pop("LOADERTOP_RUN_PORT_BASE", None)  # a nested run starts from its own --listen
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    if listen:
        env[discovery.ENV_ENDPOINT] = listen
    return env


def exit_status(returncode: int) -> int:
    """The shell's convention: a child killed by signal N makes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


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
    if not opts["quiet"]:
        print(_hint(env), file=sys.stderr, flush=True)
    if hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask"):
        return _run_sigwait(command, env)
    return _run_handlers(command, env)  # pragma: no cover - macOS: no sigtimedwait


def _hint(env: dict) -> str:
    endpoint = env.get(discovery.ENV_ENDPOINT)
    where = endpoint or f"private sockets in {discovery.discovery_dir()}"
    shown = endpoint
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if endpoint and endpoint.startswith(wildcard):  # from elsewhere: this host's name
            shown = f"tcp://{socket.gethostname()}:{endpoint[len(wildcard):]}"
    watch = f"loadertop {shown}" if endpoint else "loadertop"
    if env.get("LOADERTOP_CURVE_SECRET"):
        watch += " --key VIEWER.key_secret --server-key TRAINER.key"
    return f"loadertop run: this job's DataLoaders publish on {where}; watch with: {watch}"


def _start(command: list[str], env: dict, **kwargs):
    """Popen, or (None, exit code) as a shell would answer for a command it cannot run."""
    try:
        return subprocess.Popen(command, env=env, **kwargs), None
    except FileNotFoundError:
        print(f"loadertop run: command not found: {command[0]}", file=sys.stderr)
        return None, 127
    except PermissionError as exc:
        print(f"loadertop run: cannot execute {command[0]}: {exc.strerror}", file=sys.stderr)
        return None, 126
    except OSError as exc:
        print(f"loadertop run: cannot execute {command[0]}: {exc}", file=sys.stderr)
        return None, 126


def _run_sigwait(command: list[str], env: dict) -> int:
    """Block the signals and take them with sigtimedwait, which says who sent each one.

    A terminal's ^C (or ^\\, or a hangup) goes to the whole foreground process group, the child
    included: forwarding it as well would interrupt the child twice — the second
    KeyboardInterrupt landing in its cleanup. So a kernel-sent signal is forwarded only when the
    child has left our process group; one sent with kill() to `run` alone is always forwarded.
    """
    watched = set(FORWARDED) | {signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        child, code = _start(command, env,
                             preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old_mask))
        if child is None:
            return code
        while True:
            returncode = child.poll()
            if returncode is not None:
                return exit_status(returncode)
            info = signal.sigtimedwait(watched, WAIT_SLICE_S)
            if info is None or info.si_signo == signal.SIGCHLD:
                continue
            if info.si_code == SI_KERNEL and _same_process_group(child.pid):
                continue  # the terminal delivered it to the child already
            try:
                os.kill(child.pid, info.si_signo)
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


def _run_handlers(command: list[str], env: dict) -> int:  # pragma: no cover - non-Linux
    """Without sigtimedwait: handlers forward; a ^C while we are the terminal's foreground
    group already reached the child, so SIGINT is forwarded only otherwise."""
    child, code = _start(command, env)
    if child is None:
        return code

    def forward(signum, frame):
        if signum == signal.SIGINT and _foreground():
            return
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return exit_status(child.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _foreground() -> bool:  # pragma: no cover - non-Linux
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False
