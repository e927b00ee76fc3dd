"""How loadertop starts a program: the environment `run` and `tune`'s trials give it, the
session `tune`'s trials and `demo`'s job run in, and the exit status `run` reports.

The child's PYTHONPATH starts with `loadertop/probe/_bootstrap`, whose `sitecustomize` (every
Python started below the command imports it at startup: scripts, `python -m`, torchrun's ranks)
patches `DataLoader.__iter__` when torch's dataloader module is imported, and then chains to any
other `sitecustomize` on the path. It is a no-op unless LOADERTOP_RUN=1, which only this
environment sets. Kept free of heavy imports (subprocess is imported where a session is started):
`run` starts before the job and its own start-up is added to every job's.
"""

from __future__ import annotations

import os

from loadertop import environment

TYPE_CHECKING = False  # not typing's: `run` imports this module, and typing costs its start-up
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Mapping, Sequence
    from typing import IO

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe", "_bootstrap")


def child_env(environ: Mapping[str, str], listen: str | None) -> dict[str, str]:
    """`environ` with the start-up hook first on PYTHONPATH and LOADERTOP_RUN set; `listen`, when
    given, is the endpoint the job publishes on."""
    env = dict(environ)
    env[environment.LOADERTOP_RUN] = "1"
    env.pop(environment.LOADERTOP_RUN_WARNED, None)
    env.pop(environment.LOADERTOP_RUN_PORT_BASE, None)  # a nested run starts from its own --listen
    env.pop(environment.LOADERTOP_AUTOTUNE, None)  # only `run --autotune` sets it, for its own child
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    if listen:
        env[environment.LOADERTOP_ENDPOINT] = listen
    return env


def start_in_session(command: Sequence[str], env: Mapping[str, str], *, stdout: IO[bytes] | int,
                     stderr: IO[bytes] | int) -> subprocess.Popen[bytes]:
    """COMMAND in a session of its own, stdin from /dev/null. Its own session (and so its own
    process group, whose id is its pid) keeps a terminal's signals (Ctrl-C, SIGHUP) to us, who
    stop it in order, and lets the whole group — its DataLoader workers, torchrun's ranks — be
    signalled with `signal_group`. OSError (not found, not executable) is the caller's to word."""
    import subprocess

    return subprocess.Popen(list(command), env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=stderr, start_new_session=True)


def signal_group(pgid: int, sig: int) -> None:
    """os.killpg, quiet when the group is gone (or was never ours to signal)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_status(returncode: int) -> int:
    """The shell's convention: a child killed by signal N makes 128+N."""
    return 128 - returncode if returncode < 0 else returncode
