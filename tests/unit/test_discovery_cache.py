"""`discovery.EntryCache`: what a viewer looking every second lists, against `list_entries`,
with real entry files and real processes (one alive, one that exited)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from loadertop import discovery


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def announce(directory, pid: int, endpoint: str, started_at: float | None = None):
    started = psutil.Process().create_time() if started_at is None else started_at
    return discovery.write_entry(directory, pid=pid, endpoint=endpoint, command="python t.py",
                                 started_at=started, rank=None)


def endpoints(entries) -> list[str]:
    return sorted(e.endpoint for e in entries)


def test_the_cache_lists_what_list_entries_lists(lt_dir):
    announce(lt_dir, os.getpid(), "ipc://a")
    (lt_dir / "9.json").write_text("{not json")
    cache = discovery.EntryCache(lt_dir)
    assert endpoints(cache.entries()) == endpoints(discovery.list_entries(lt_dir)) == ["ipc://a"]


def test_a_file_is_read_again_only_when_it_changed(lt_dir, monkeypatch):
    path = announce(lt_dir, os.getpid(), "ipc://a")
    reads: list[str] = []
    real = discovery.read_entry
    monkeypatch.setattr(discovery, "read_entry", lambda p: reads.append(p.name) or real(p))
    cache = discovery.EntryCache(lt_dir, clock=Clock())
    for _ in range(3):
        assert endpoints(cache.entries()) == ["ipc://a"]
    assert reads == [path.name]
    announce(lt_dir, os.getpid(), "ipc://b")  # rewritten (os.replace: a new inode)
    assert endpoints(cache.entries()) == ["ipc://b"]
    path.unlink()
    assert cache.entries() == []


def test_a_process_that_died_without_removing_its_entry_leaves_within_the_recheck(lt_dir):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        announce(lt_dir, child.pid, "ipc://child", psutil.Process(child.pid).create_time())
        clock = Clock()
        cache = discovery.EntryCache(lt_dir, clock=clock)
        assert endpoints(cache.entries()) == ["ipc://child"]
    finally:
        child.stdin.close()
        child.wait(10)
    clock.now += discovery.ALIVE_RECHECK_S / 2
    assert endpoints(cache.entries()) == ["ipc://child"]  # not read again yet
    clock.now += discovery.ALIVE_RECHECK_S / 2
    assert cache.entries() == []
    assert discovery.list_entries(lt_dir) == []
