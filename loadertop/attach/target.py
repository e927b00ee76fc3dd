"""What a pid is, read from /proc and the ELF files, before anything touches the process.

Linux only (/proc). Nothing here stops or changes the target: reading /proc/PID/maps needs the
same permission as ptrace's read mode, so a "permission denied" there is already the answer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from loadertop.attach import AttachError, elf

MIN_VERSION = (3, 10)
CAP_SYS_PTRACE = 19
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_PYTHON_SYMBOLS = frozenset({"Py_AddPendingCall", "PyRun_SimpleString", "Py_Version", "Py_IsNone",
                             "_PyRuntime"})
_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)[a-z]*\.so")
_EXE_VERSION = re.compile(r"python(\d+)\.(\d+)")
_LIBC = re.compile(r"^(libc\.so|libc-[0-9.]+\.so|ld-musl-|libc\.musl-)")


@dataclass(frozen=True)
class Target:
    pid: int
    command: str  # /proc/PID/comm
    exe: str  # what /proc/PID/exe points at (may end in " (deleted)")
    uid: int
    python_path: str  # the file that holds the C API: libpython, or the executable itself
    version: tuple[int, ...]  # (3, 11, 7); (3, 10) when the file does not say the micro version
    add_pending_call: int  # runtime addresses in the target
    run_simple_string: int
    mmap: int

    @property
    def version_text(self) -> str:
        return ".".join(str(v) for v in self.version)


def state(pid: int) -> str:
    """"running", "zombie" (exited, not yet reaped: nothing to attach to) or "gone"."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    except OSError:
        return "running"  # exists; we may just not read it
    # "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
    fields = text[text.rfind(")") + 2:].split()
    return "zombie" if fields and fields[0] in ("Z", "X", "x") else "running"


def _status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def _has_cap_sys_ptrace() -> bool:
    try:
        eff = int(_status(os.getpid()).get("CapEff", "0"), 16)
    except (OSError, ValueError):
        return False
    return bool(eff >> CAP_SYS_PTRACE & 1)


def yama_scope() -> int | None:
    try:
        with open(YAMA_SCOPE) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def ptrace_hint() -> str:
    scope = yama_scope()
    yama = (f"kernel.yama.ptrace_scope is {scope} (`sudo sysctl kernel.yama.ptrace_scope=0` "
            f"allows a same-user attach)" if scope else "check kernel.yama.ptrace_scope")
    return (f"run attach as the same user as the job, or as root / with CAP_SYS_PTRACE; {yama}; "
            f"in a container, start it with --cap-add=SYS_PTRACE")


def ptrace_error(pid: int, why: str) -> AttachError:
    return AttachError("ptrace", f"ptrace not permitted on pid {pid}: {why}; {ptrace_hint()}")


def check_ptrace(pid: int, status: dict[str, str]) -> None:
    """The reasons a ptrace attach would fail that /proc can tell in advance."""
    tracer = status.get("TracerPid", "0")
    if tracer not in ("", "0"):
        raise ptrace_error(pid, f"it is already traced by pid {tracer} (a debugger, or another "
                                f"attach in progress)")
    if _has_cap_sys_ptrace():
        return  # root or CAP_SYS_PTRACE: other users' processes too, and yama 1 or 2 allow it
    try:
        uids = {int(u) for u in status.get("Uid", "").split()}
    except ValueError:
        uids = set()
    me = os.geteuid()
    if uids and uids != {me}:
        owner = status.get("Uid", "?").split()[1] if len(status.get("Uid", "").split()) > 1 else "?"
        raise ptrace_error(pid, f"it runs as uid {owner} and you are uid {me}")
    scope = yama_scope()
    if scope is not None and scope >= 2:
        raise ptrace_error(pid, f"kernel.yama.ptrace_scope={scope} lets only CAP_SYS_PTRACE attach")
    # scope 1 (Ubuntu's default: only a process's ancestors may attach) is left to gdb's answer,
    # since the job may have allowed us with prctl(PR_SET_PTRACER).


def inspect(pid: int) -> Target:
    """Everything attach needs to know before touching `pid`; AttachError otherwise."""
    st = state(pid)
    if st == "gone":
        raise AttachError("no_process", f"no process with pid {pid}")
    if st == "zombie":
        raise AttachError("no_process", f"pid {pid} has exited (only its zombie is left)")
    try:
        status = _status(pid)
    except FileNotFoundError:
        raise AttachError("no_process", f"no process with pid {pid}") from None
    except OSError as exc:
        raise ptrace_error(pid, f"cannot read /proc/{pid}/status ({exc.strerror})") from None
    check_ptrace(pid, status)
    command = status.get("Name", "?")
    try:
        maps = elf.mappings(pid)
        exe = os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise AttachError("exited", f"pid {pid} exited while being inspected") from None
    except PermissionError as exc:
        raise ptrace_error(pid, f"cannot read its memory map ({exc.strerror})") from None
    except OSError as exc:
        raise AttachError("no_process", f"cannot inspect pid {pid}: {exc.strerror or exc}") from None
    uid = int(status.get("Uid", "0").split()[1]) if status.get("Uid") else os.geteuid()
    return _locate_python(pid, command, exe, uid, maps)


def _open_path(pid: int, path: str) -> str:
    """A file the target maps, seen through its own root (a container's file system)."""
    inside = f"/proc/{pid}/root{path}"
    return inside if os.path.exists(inside) else path


def _locate_python(pid: int, command: str, exe: str, uid: int, maps: list[elf.Mapping]) -> Target:
    not_python = AttachError("not_python", f"pid {pid} ({command}, {exe}) is not a CPython process")
    paths = list(dict.fromkeys(m.path for m in maps))
    libpython = next((p for p in paths if _LIBPYTHON.search(os.path.basename(p))), None)
    if libpython is not None:
        python_path, read_path = libpython, _open_path(pid, libpython)
    else:
        # A statically linked python: the C API lives in the executable (exported, for
        # extension modules). Read it through /proc/PID/exe (works even if it was replaced).
        python_path, read_path = exe.removesuffix(" (deleted)"), f"/proc/{pid}/exe"
    try:
        py = elf.read(read_path, _PYTHON_SYMBOLS)
    except elf.ElfError:
        raise not_python from None
    if not {"Py_AddPendingCall", "PyRun_SimpleString", "_PyRuntime"} <= py.symbols.keys():
        raise not_python
    version = _version(py, libpython or exe)
    if version is None:
        raise AttachError("not_python", f"pid {pid} ({command}) runs a CPython older than 3.10 "
                                        f"(loadertop attach needs 3.10 or later)")
    if version[:2] < MIN_VERSION:
        raise AttachError("not_python", f"pid {pid} ({command}) runs Python {'.'.join(map(str, version))}"
                                        f"; loadertop attach needs 3.10 or later")
    libc_path = next((p for p in paths if _LIBC.search(os.path.basename(p))), None)
    try:
        bias = elf.load_bias(py, maps, python_path)
        mmap_addr = _libc_mmap(pid, libc_path, maps) if libc_path else None
        if mmap_addr is None:  # a static executable with its own C library
            static = elf.read(read_path, {"mmap"}).symbols.get("mmap")
            mmap_addr = bias + static.value if static is not None else None
    except elf.ElfError as exc:
        raise AttachError("not_python", f"pid {pid}: {exc}") from None
    if mmap_addr is None:
        raise AttachError("not_python", f"pid {pid} ({command}): no C library with mmap found")
    return Target(pid=pid, command=command, exe=exe, uid=uid, python_path=python_path,
                  version=version, add_pending_call=bias + py.symbols["Py_AddPendingCall"].value,
                  run_simple_string=bias + py.symbols["PyRun_SimpleString"].value, mmap=mmap_addr)


def _libc_mmap(pid: int, libc_path: str, maps: list[elf.Mapping]) -> int | None:
    libc = elf.read(_open_path(pid, libc_path), {"mmap"})
    sym = libc.symbols.get("mmap")
    return None if sym is None else elf.load_bias(libc, maps, libc_path) + sym.value


def _version(py: elf.ElfFile, name: str) -> tuple[int, ...] | None:
    """From `Py_Version` (3.11+: PY_VERSION_HEX, a constant in the file); 3.10 has `Py_IsNone`
    but no `Py_Version`; older ones neither (None)."""
    hexversion = py.read_constant("Py_Version") if "Py_Version" in py.symbols else None
    if hexversion:
        return (hexversion >> 24 & 0xFF, hexversion >> 16 & 0xFF, hexversion >> 8 & 0xFF)
    if "Py_IsNone" in py.symbols:
        return (3, 10)
    match = _LIBPYTHON.search(os.path.basename(name)) or _EXE_VERSION.search(os.path.basename(name))
    if match and (int(match[1]), int(match[2])) < MIN_VERSION:
        return (int(match[1]), int(match[2]))
    return None
