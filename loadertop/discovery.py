"""Where instrumented processes announce themselves, shared by the probe and the viewer.

Each instrumented process writes ``LOADERTOP_DIR/<pid>.json`` (mode 0600, in a 0700 directory)
when its first loader starts and removes it at exit. The default publisher endpoint is an ipc
socket in the same directory, so only the same user can read the training job's figures.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadertop import environment

DISCOVERY_SCHEMA = "loadertop.discovery/1"


def discovery_dir() -> Path:
    """LOADERTOP_DIR, else $XDG_RUNTIME_DIR/loadertop, else /tmp/loadertop-<uid>."""
    return Path(environment.discovery_dir())


def ensure_private_dir(path: Path) -> Path:
    """Create `path` mode 0700; refuse one owned by someone else (another user could read our
    ipc sockets or plant fake entries)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise PermissionError(f"{path} is owned by uid {st.st_uid}, not by you")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


@dataclass(frozen=True)
class Entry:
    """One instrumented process as announced in the discovery directory."""

    pid: int
    host: str
    endpoint: str
    command: str
    started_at: float
    rank: int | None
    path: Path

    def process_alive(self) -> bool:
        """True if the announcing process still runs (only checkable on this host)."""
        if self.host != socket.gethostname():
            return True
        try:
            import psutil

            proc = psutil.Process(self.pid)
            # A recycled pid has a later start time than the one announced.
            return bool(proc.create_time() <= self.started_at + 1.0
                        and proc.status() != psutil.STATUS_ZOMBIE)
        except Exception:
            return False


def entry_path(directory: Path, pid: int) -> Path:
    return directory / f"{pid}.json"


def write_entry(directory: Path, *, pid: int, endpoint: str, command: str, started_at: float,
                rank: int | None) -> Path:
    ensure_private_dir(directory)
    doc = {
        "schema": DISCOVERY_SCHEMA,
        "pid": pid,
        "host": socket.gethostname(),
        "endpoint": endpoint,
        "command": command,
        "started_at": started_at,
        "rank": rank,
        "written_at": time.time(),
    }
    path = entry_path(directory, pid)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)  # atomic: a viewer never reads half a file
    return path


def read_entry(path: Path) -> Entry | None:
    """Parse one discovery file; None for anything malformed (never trusted blindly)."""
    try:
        if path.stat().st_size > 64 * 1024:
            return None
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("schema") != DISCOVERY_SCHEMA:
            return None
        rank = doc.get("rank")
        return Entry(
            pid=int(doc["pid"]),
            host=str(doc["host"]),
            endpoint=str(doc["endpoint"]),
            command=str(doc.get("command", "")),
            started_at=float(doc.get("started_at", 0.0)),
            rank=int(rank) if rank is not None else None,
            path=path,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_entries(directory: Path | None = None, *, alive_only: bool = True) -> list[Entry]:
    directory = directory or discovery_dir()
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    entries = [e for e in (read_entry(p) for p in paths) if e is not None]
    if alive_only:
        entries = [e for e in entries if e.process_alive()]
    return entries


ALIVE_RECHECK_S = 5.0  # a listed process's liveness is read again this often (EntryCache)


class EntryCache:
    """`list_entries(directory)` for a viewer that looks every second (`Subscriber.rescan`).

    An entry's file is read again only when its (inode, size, mtime) changed, and a listed
    process's liveness (psutil: its start time and state) is read again every ALIVE_RECHECK_S
    rather than at each look: the full listing's cost grows with the processes listed
    (docs/performance.md). A process that exits removes its file, which the next look sees;
    only one killed without removing it stays listed up to ALIVE_RECHECK_S longer (its socket
    has gone quiet by then, which is what marks its sources gone)."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        # path -> (file key, entry or None if malformed, alive, when liveness was read)
        self._known: dict[Path, tuple[tuple[int, int, int], Entry | None, bool, float]] = {}

    def entries(self) -> list[Entry]:
        try:
            paths = sorted(self.directory.glob("*.json"))
        except OSError:
            return []
        now = self.clock()
        known: dict[Path, tuple[tuple[int, int, int], Entry | None, bool, float]] = {}
        out = []
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            cached = self._known.get(path)
            if cached is not None and cached[0] == key:
                _, entry, alive, checked = cached
                if entry is not None and now - checked >= ALIVE_RECHECK_S:
                    alive, checked = entry.process_alive(), now
            else:
                entry = read_entry(path)
                alive, checked = (entry.process_alive() if entry is not None else False), now
            known[path] = (key, entry, alive, checked)
            if entry is not None and alive:
                out.append(entry)
        self._known = known
        return out
