"""`loadertop attach PID`: the debugger side (this process), never imported inside the target.

    target.py   what /proc and the ELF files say about PID before anything touches it: alive,
                ptrace permitted, CPython >= 3.10, where its C API and libc's `mmap` are
    inject.py   runs a bootstrap at a safe point of the target's main thread: gdb schedules it
                with `Py_AddPendingCall` (or `sys.remote_exec` on Python >= 3.14), and the
                bootstrap reports back through a file in the private discovery directory
    bootstrap.py   the code that runs inside the target (stdlib only, the target's Python); it
                imports `loadertop.probe.attach` from the target's own sys.path

Every failure is an `AttachError` with one line of text and one of the exit codes below
(docs/attach.md's table lists them).
"""

from __future__ import annotations

EXIT_NO_PROCESS = 3  # no process with that pid (or only its zombie)
EXIT_NOT_PYTHON = 4  # not CPython, or a CPython below 3.10
EXIT_NO_TORCH = 5  # torch.utils.data.dataloader was never imported there
EXIT_PTRACE = 6  # ptrace not permitted (other user, yama, a container, another tracer)
EXIT_NO_GDB = 7  # gdb is needed and missing
EXIT_NO_LOADERTOP = 8  # loadertop (with attach support) or a dependency missing in the target's Python
EXIT_ALREADY = 9  # already attached, or instrumented by `loadertop run` / `instrument()`
EXIT_NOT_ATTACHED = 10  # --detach: loadertop attach is not attached there
EXIT_EXITED = 11  # the process exited during the attach
EXIT_TIMEOUT = 12  # its main thread ran no Python code in time: nothing was changed
EXIT_FAILED = 13  # the injected code failed: the target was put back as it was

EXIT_CODES = {
    "no_process": EXIT_NO_PROCESS, "not_python": EXIT_NOT_PYTHON, "no_torch": EXIT_NO_TORCH,
    "ptrace": EXIT_PTRACE, "no_gdb": EXIT_NO_GDB, "no_loadertop": EXIT_NO_LOADERTOP,
    "already": EXIT_ALREADY, "not_attached": EXIT_NOT_ATTACHED, "exited": EXIT_EXITED,
    "timeout": EXIT_TIMEOUT, "failed": EXIT_FAILED,
}


class AttachError(Exception):
    """One line for the user, and what kind of failure it is (a key of EXIT_CODES)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.kind, EXIT_FAILED)
