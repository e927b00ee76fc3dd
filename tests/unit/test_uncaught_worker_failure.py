"""What the probe reads at exit when the program dies of torch's report of a dead worker (raised
by torch's SIGCHLD handler, often outside next()): the exception and the pids it names."""

from __future__ import annotations

import sys

import pytest

from loadertop.probe.torch_internals import uncaught_worker_failure


@pytest.fixture
def last_value(monkeypatch):
    monkeypatch.delattr(sys, "last_exc", raising=False)

    def set_to(exc):
        monkeypatch.setattr(sys, "last_value", exc, raising=False)
        return exc
    return set_to


@pytest.mark.parametrize("message, pids", [
    # torch 2.13's three messages (torch/csrc/DataLoader.cpp, dataloader.py `_try_get_data`)
    ("DataLoader worker (pid 4321) is killed by signal: Killed. ", {4321}),
    ("DataLoader worker (pid 77) exited unexpectedly with exit code 1. Details are lost due to "
     "multiprocessing. Rerunning with num_workers=0 may give better error trace.", {77}),
    ("DataLoader worker (pid(s) 12, 345) exited unexpectedly", {12, 345}),
])
def test_torch_s_messages_name_their_workers(last_value, message, pids):
    exc = last_value(RuntimeError(message))
    assert uncaught_worker_failure() == (exc, pids)


@pytest.mark.parametrize("exc", [
    RuntimeError("CUDA out of memory"),
    ValueError("DataLoader worker (pid 4321) is killed by signal: Killed."),  # not torch's type
    None,  # the program did not die of an exception
])
def test_anything_else_is_none(last_value, exc):
    last_value(exc)
    assert uncaught_worker_failure() is None
