"""The probe's start: quiet_start.call leaves the program's collector as it found it (the effect
on full collections is tested end to end in tests/functional/test_e2e_quiet_start.py), and what it
computes instead of importing agrees with the module it avoids."""

from __future__ import annotations

import gc

import pytest

from loadertop.probe import quiet_start


def test_the_start_runs_paused_and_its_objects_go_to_the_oldest_generation():
    seen = {}

    def start(n):
        seen["enabled"] = gc.isenabled()
        seen["made"] = [[] for _ in range(n)]
        return "started"

    assert gc.isenabled()
    assert quiet_start.call(start, 2000) == "started"
    assert seen["enabled"] is False
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.get_count()[0] < 100  # the paused allocations are not carried into the next one
    oldest = {id(o) for o in gc.get_objects(2)}
    assert all(id(o) in oldest for o in seen["made"][:50])


def test_a_start_that_raises_leaves_the_collector_on():
    def start():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        quiet_start.call(start)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_turned_off_stays_off_and_nothing_is_frozen():
    gc.disable()
    try:
        assert quiet_start.call(lambda: gc.isenabled()) is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_objects_the_program_froze_stay_frozen():
    frozen = [[] for _ in range(10)]
    gc.freeze()
    try:
        assert quiet_start.call(lambda: gc.isenabled()) is True  # left as usual: not paused
        tracked = {id(o) for o in gc.get_objects()}  # generations 0-2: the frozen are not there
        assert gc.get_freeze_count() > 0 and not any(id(o) in tracked for o in frozen)
    finally:
        gc.unfreeze()
    del frozen


def test_the_stack_filters_library_dirs_are_sysconfigs():
    # probe/stacks.py computes them without importing sysconfig (the probe's start)
    import os
    import sysconfig

    from loadertop.probe import stacks

    paths = sysconfig.get_paths()
    assert set(stacks._LIBRARY_DIRS) == {os.path.realpath(paths[k]) + os.sep
                                         for k in ("stdlib", "platstdlib")}
