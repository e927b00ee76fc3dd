"""How a training program is started under loadertop: the environment `run`, `tune`'s trials and
`demo` give it, and the exit status they report.

The child's PYTHONPATH starts with `loadertop/probe/_bootstrap`, whose `sitecustomize` (every
Python started below the command imports it at startup: scripts, `python -m`, torchrun's ranks)
patches `DataLoader.__iter__` when torch's dataloader module is imported, and then chains to any
other `sitecustomize` on the path. It is a no-op unless LOADERTOP_RUN=1, which only this
environment sets. Kept free of heavy imports: `run` starts before the job and its own start-up is
added to every job's.
"""

from __future__ import annotations

import os

from loadertop import environment

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe", "_bootstrap")


def child_env(environ, listen: str | None) -> dict:
    """`environ` with the start-up hook first on PYTHONPATH and LOADERTOP_RUN set; `listen`, when
    given, is the endpoint the job publishes on."""
    env = dict(environ)
    env[environment.LOADERTOP_RUN] = "1"
    env.pop(environment.LOADERTOP_RUN_WARNED, None)
    env.pop(environment.LOADERTOP_RUN_PORT_BASE, None)  # a nested run starts from its own --listen
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *parts])
    if listen:
        env[environment.LOADERTOP_ENDPOINT] = listen
    return env


def exit_status(returncode: int) -> int:
    """The shell's convention: a child killed by signal N makes 128+N."""
    return 128 - returncode if returncode < 0 else returncode
