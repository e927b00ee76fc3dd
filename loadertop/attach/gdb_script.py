# Runs inside gdb's own Python (`gdb -batch -x gdb_script.py`), not in loadertop's: only the `gdb`
# module and the stdlib, and syntax old gdb builds still read. Parameters come as JSON in
# LOADERTOP_GDB_PARAMS (Python >= 3.6); every answer is one line starting with "LOADERTOP " on stdout.
#
# While the target is stopped it does as little as it can, and only things that are safe at any
# instruction of an interrupted thread:
#   1. attach (every thread stops);
#   2. call mmap() for one private page: a system-call wrapper, no lock, no malloc (a call to
#      malloc from an interrupted malloc would deadlock);
#   3. write the C string of the Python statement to run into that page;
#   4. call Py_AddPendingCall(PyRun_SimpleString, page): it takes only the pending-call lock, and
#      the interpreter's main thread runs the call between two bytecodes, with the GIL, once it
#      is resumed. That is the safe point: no Python code runs from the interrupted thread;
#   5. detach.
# Before step 2, on x86-64, it checks that gdb can write the thread's registers back (flipping
# one bit of xmm0 and restoring it): gdb 13 cannot on a CPU with AMX (Sapphire Rapids) under a
# kernel >= 5.16, whose PTRACE_SETREGSET takes the XSAVE area only at its full size (with the
# 8 KiB of tile data) and answers EFAULT ("Couldn't write extended state status: Bad address")
# to gdb's smaller buffer. A call made anyway sets the registers for the call, fails, cannot
# restore them and detaches: the target dies (seen in a CI run). So it says "xstate-unwritable"
# and detaches untouched, and loadertop runs a new gdb with a target description of the core
# and SSE registers only (x86-64-sse.xml), which makes gdb use PTRACE_GETFPREGS/SETFPREGS.
# No symbol is loaded (auto-solib-add off): the addresses were read from the ELF files by
# loadertop beforehand, so gdb spends no time on libtorch's symbol tables while the target waits.
import json
import os
import time

import gdb

PROT_READ_WRITE = 3
MAP_PRIVATE_ANONYMOUS = 0x22  # MAP_PRIVATE | MAP_ANONYMOUS on Linux x86-64 and aarch64
PAGE = 4096


def say(*words):
    print("LOADERTOP " + " ".join(str(w) for w in words), flush=True)


def call(expression):
    return int(gdb.parse_and_eval(expression))


def xstate_unwritable():
    """None if gdb can write the vector registers back; else gdb's message. Writing a value a
    register already holds is skipped by gdb's regcache, so one bit is flipped and restored: if
    the first write fails nothing was written, and if it succeeded the second does too."""
    original = int(gdb.parse_and_eval("$xmm0.v2_int64[0]"))
    try:
        gdb.execute(f"set var $xmm0.v2_int64[0] = {original ^ 1}", to_string=True)
    except gdb.error as exc:
        if "extended state" in str(exc):
            return str(exc)
        raise
    gdb.execute(f"set var $xmm0.v2_int64[0] = {original}", to_string=True)
    return None


def main():
    params = json.loads(os.environ["LOADERTOP_GDB_PARAMS"])
    pid = int(params["pid"])
    code = params["code"].encode() + b"\0"
    if len(code) > PAGE:
        say("error", "bootstrap statement longer than a page")
        return
    started = time.monotonic()
    try:
        gdb.execute(f"attach {pid}", to_string=True)
    except gdb.error as exc:
        say("attach-failed", json.dumps(str(exc)))
        return
    attached = time.monotonic()
    try:
        inferior = gdb.selected_inferior()
        main_thread = None
        for thread in inferior.threads():
            if thread.ptid[1] == pid:
                main_thread = thread
        if main_thread is not None:
            main_thread.switch()
        if params.get("probe_xstate") and inferior.architecture().name() == "i386:x86-64":
            failure = xstate_unwritable()
            if failure is not None:
                say("xstate-unwritable", json.dumps(failure))
                return
        page = call(f"((void *(*)(void *, unsigned long, int, int, int, long)){params['mmap']})"
                    f"(0, {PAGE}, {PROT_READ_WRITE}, {MAP_PRIVATE_ANONYMOUS}, -1, 0)")
        if page in (-1, 0xFFFFFFFFFFFFFFFF, 0):
            say("error", json.dumps("mmap failed in the target"))
            return
        inferior.write_memory(page, code)
        rc = call(f"((int (*)(void *, void *)){params['add_pending_call']})"
                  f"((void *){params['run_simple_string']}, (void *){page})")
        if rc != 0:
            say("error", json.dumps("Py_AddPendingCall refused (its queue is full)"))
            return
        say("scheduled", page)
    except gdb.error as exc:
        say("error", json.dumps(str(exc)))
    finally:
        try:
            gdb.execute("detach", to_string=True)
        except gdb.error:
            pass
        now = time.monotonic()
        # From the attach command on (the threads stop inside it) to the end of the detach.
        say("stopped-ms", round((now - started) * 1000, 1), round((attached - started) * 1000, 1))


main()
