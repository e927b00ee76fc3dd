"""A process that has imported torch once and forks training workloads on request (the tests'
`Workload`), so that each of them does not pay `import torch` again (3.4 s of CPU here, most of
a short job's start-up): the pattern of multiprocessing's forkserver and Android's zygote.

    python tests/workloads/zygote.py SOCKET

Each request on the UNIX socket is one JSON line: {"argv": [script, args...], "env": {...},
"cwd": ..., "stdout": path, "stderr": path}. The zygote forks; the child starts its own session,
points fds 0/1/2 at /dev/null and the two files, takes the environment, and runs the script as
`__main__` (runpy, so multiprocessing's spawn finds the script as the main module, as it would
after `python script.py`). The zygote answers {"pid": N} on the same connection, and when the
child ends, {"returncode": N} (negative: killed by that signal, as subprocess says), then closes.

What differs from `python script.py`: the process's command line is the zygote's (tests that read
it start a real `python script.py`), and torch, numpy and psutil were imported before the
environment was set (none of them reads it at import). The zygote stays single-threaded (one
select loop, children reaped with WNOHANG), so a fork never copies a lock another thread held.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

import numpy  # noqa: F401  (imported for the children)
import psutil  # noqa: F401
import torch
import torch.utils.data  # noqa: F401

MAX_REQUEST = 1 << 20


def _child(request: dict, listener: socket.socket, conns: list[socket.socket]) -> None:
    """In the forked child: become the workload. Ends by raising SystemExit at the top level, so
    the interpreter shuts down as after `python script.py` (atexit handlers run)."""
    import runpy

    listener.close()
    for c in conns:
        c.close()
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(os.open(request["stdout"], os.O_WRONLY | os.O_APPEND), 1)
    os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_APPEND), 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection that asked for it
    pending: dict[socket.socket, bytes] = {}  # connections still sending their request
    while True:
        readable, _, _ = select.select([listener, *pending], [], [], 0.05)
        for sock in readable:
            if sock is listener:
                conn, _ = listener.accept()
                pending[conn] = b""
                continue
            chunk = sock.recv(65536)
            data = pending[sock] + chunk
            if not chunk or len(data) > MAX_REQUEST:
                del pending[sock]
                sock.close()
                continue
            if b"\n" not in data:
                pending[sock] = data
                continue
            del pending[sock]
            request = json.loads(data.split(b"\n", 1)[0])
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, listener, [*pending, *waiting.values(), sock])
                raise SystemExit(0)
            waiting[pid] = sock
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                try:
                    conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    main()
