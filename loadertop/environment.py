"""Every environment variable loadertop reads or sets, and the rules for reading them.

Imported inside training (the probe, `loadertop run`'s start-up hook) and by the viewer: stdlib
only, and nothing but `os`. The README's "Environment" list documents the same names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# ---- read by the training process (documented for users, docs/contract.md §1)
LOADERTOP_DISABLE = "LOADERTOP_DISABLE"  # set (not "0"): instrument() returns the loader untouched
LOADERTOP_DIR = "LOADERTOP_DIR"  # the discovery directory (see loadertop.discovery)
LOADERTOP_ENDPOINT = "LOADERTOP_ENDPOINT"  # where the publisher listens instead of its ipc socket
LOADERTOP_CURVE_SECRET = "LOADERTOP_CURVE_SECRET"  # the trainer's CurveZMQ secret key file
LOADERTOP_AUTHORIZED_KEYS = "LOADERTOP_AUTHORIZED_KEYS"  # directory of the viewers' public keys
LOADERTOP_SHM_PATH = "LOADERTOP_SHM_PATH"  # the file system shm_low watches (default /dev/shm)
LOADERTOP_RESOURCE_S = "LOADERTOP_RESOURCE_S"  # test hook: slow readings every S s (probe.resources)
# test hook: `run --autotune` switches num_workers where told, "EPOCH:BATCH:COUNT,..." (probe.autotune)
LOADERTOP_AUTOTUNE_SCHEDULE = "LOADERTOP_AUTOTUNE_SCHEDULE"
LOADERTOP_BLACKBOX_MIB = "LOADERTOP_BLACKBOX_MIB"  # the black box's budget per process, in MiB

# ---- set by `loadertop run` for the programs below it (internal)
LOADERTOP_RUN = "LOADERTOP_RUN"  # "1": the start-up hook instruments DataLoaders
LOADERTOP_RUN_WARNED = "LOADERTOP_RUN_WARNED"  # the "cannot import loadertop" line was printed
LOADERTOP_RUN_PORT_BASE = "LOADERTOP_RUN_PORT_BASE"  # --listen before the per-rank port offset
LOADERTOP_AUTOTUNE = "LOADERTOP_AUTOTUNE"  # "1": `run --autotune` tunes num_workers between epochs

# ---- set by `loadertop tune` for the program of one trial (internal)
LOADERTOP_TUNE_NUM_WORKERS = "LOADERTOP_TUNE_NUM_WORKERS"  # every DataLoader gets this num_workers

# ---- other programs' conventions that loadertop follows
NO_COLOR = "NO_COLOR"  # https://no-color.org
RANK = "RANK"  # torchrun: the global rank
LOCAL_RANK = "LOCAL_RANK"  # torchrun: the rank on this machine
SLURM_PROCID = "SLURM_PROCID"  # SLURM: the task's rank
RANK_VARIABLES = (RANK, LOCAL_RANK, SLURM_PROCID)  # a source's rank: the first one set

LOADERTOP_VARIABLES = (LOADERTOP_DISABLE, LOADERTOP_DIR, LOADERTOP_ENDPOINT, LOADERTOP_CURVE_SECRET,
                       LOADERTOP_AUTHORIZED_KEYS, LOADERTOP_RUN, LOADERTOP_RUN_WARNED,
                       LOADERTOP_RUN_PORT_BASE, LOADERTOP_SHM_PATH, LOADERTOP_RESOURCE_S,
                       LOADERTOP_TUNE_NUM_WORKERS, LOADERTOP_BLACKBOX_MIB, LOADERTOP_AUTOTUNE,
                       LOADERTOP_AUTOTUNE_SCHEDULE)


def disabled(environ: Mapping[str, str] = os.environ) -> bool:
    """LOADERTOP_DISABLE is set to anything but "" or "0"."""
    return environ.get(LOADERTOP_DISABLE, "") not in ("", "0")


def endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """LOADERTOP_ENDPOINT as given (None when unset or empty); loadertop.endpoints parses it."""
    return environ.get(LOADERTOP_ENDPOINT) or None


def run_hook_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a program started by `loadertop run` (it sets LOADERTOP_RUN=1)."""
    return environ.get(LOADERTOP_RUN) == "1"


def autotune(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a program started by `loadertop run --autotune` (docs/contract.md §10)."""
    return environ.get(LOADERTOP_AUTOTUNE) == "1"


def autotune_schedule(environ: Mapping[str, str] = os.environ) -> list[tuple[int, int, int]] | None:
    """LOADERTOP_AUTOTUNE_SCHEDULE, a test hook: (epoch, batch, num_workers) triples — `run
    --autotune` switches to that count when the loop has had that many batches of that epoch
    (from 0), and does nothing else of its own. None when unset or malformed."""
    raw = environ.get(LOADERTOP_AUTOTUNE_SCHEDULE)
    if not raw:
        return None
    out = []
    for part in raw.split(","):
        values = [_index(f) for f in part.split(":")]
        if len(values) != 3:
            return None
        epoch, batch, count = values
        if epoch is None or batch is None or not count:
            return None
        out.append((epoch, batch, count))
    return out


def tune_num_workers(environ: Mapping[str, str] = os.environ) -> int | None:
    """The num_workers `loadertop tune` imposes on this trial's DataLoaders (a non-negative
    integer), None when unset or not such a number (then nothing is overridden)."""
    return _index(environ.get(LOADERTOP_TUNE_NUM_WORKERS))


def no_color(flag: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """Colours off: `--no-color` given, or NO_COLOR present. Present counts even when empty,
    because Textual 8.2.8 (App.__init__) turns the screen monochrome on presence alone: deciding
    otherwise here would be contradicted on screen."""
    return flag or NO_COLOR in environ


def _index(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank: RANK (torchrun), else LOCAL_RANK, else SLURM_PROCID; None if none
    holds a non-negative integer."""
    for name in RANK_VARIABLES:
        value = _index(environ.get(name))
        if value is not None:
            return value
    return None


def local_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """LOCAL_RANK (torchrun's rank on this machine), None when unset or not an integer."""
    return _index(environ.get(LOCAL_RANK))


def discovery_dir(environ: Mapping[str, str] = os.environ) -> str:
    """LOADERTOP_DIR, else $XDG_RUNTIME_DIR/loadertop, else /tmp/loadertop-<uid>
    (`discovery.discovery_dir` as a Path; here so that `loadertop run`'s hint imports no more)."""
    env = environ.get(LOADERTOP_DIR)
    if env:
        return env
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "loadertop")
    import tempfile

    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"loadertop-{uid}")
