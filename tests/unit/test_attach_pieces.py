"""`loadertop attach`'s pieces that need no debugger: the ELF symbol reader against this very
process, the bootstrap's statement and its answers, the exit codes."""

from __future__ import annotations

import ctypes
import json
import os
import sys

import pytest

from loadertop.attach import EXIT_CODES, AttachError, bootstrap, target

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@linux
@pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's C API")
def test_the_addresses_read_from_the_elf_files_are_the_ones_this_process_uses():
    found = target.inspect(os.getpid())
    assert found.version[:3] == sys.version_info[:3]

    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    assert found.add_pending_call == address(ctypes.pythonapi.Py_AddPendingCall)
    assert found.run_simple_string == address(ctypes.pythonapi.PyRun_SimpleString)
    assert found.mmap == address(ctypes.CDLL(None).mmap)


@linux
def test_what_is_not_a_process_or_not_python_is_said_before_touching_it(tmp_path):
    with pytest.raises(AttachError) as err:
        target.inspect(2 ** 22 + 1)  # above pid_max's default
    assert err.value.kind == "no_process"
    assert target.state(2 ** 22 + 1) == "gone"


def test_exit_codes_are_distinct_and_leave_0_1_2_alone():
    codes = list(EXIT_CODES.values())
    assert len(set(codes)) == len(codes) and min(codes) > 2


def test_the_statement_binds_nothing_in_main_and_swallows_a_cancelled_file(tmp_path):
    namespace: dict = {"__builtins__": __builtins__}
    exec(bootstrap.STATEMENT.format(path=str(tmp_path / "gone.py")), namespace)
    assert set(namespace) == {"__builtins__"}


def test_the_bootstrap_claims_its_file_answers_and_does_nothing_once_cancelled(tmp_path):
    script, result = tmp_path / "b.py", tmp_path / "b.result"
    params = {"mode": "detach", "script": str(script), "result": str(result), "protocol": 1,
              "version": "0", "directory": str(tmp_path), "endpoint": None}
    script.write_text("")
    bootstrap._main(params)
    assert not script.exists()  # claimed
    answer = json.loads(result.read_text())
    assert answer["ok"] is False and answer["error"] == "not_attached", answer
    assert answer["executable"] == sys.executable and answer["pause_ms"] >= 0
    result.unlink()
    bootstrap._main(params)  # the file is gone: attach cancelled it, nothing runs
    assert not result.exists()
