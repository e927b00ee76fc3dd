"""The worker side's pieces: its socket (connected on the worker's own thread), the random-state
digests (the same in every process; torch's global generator read in real fork workers), and which
stack files the main process accepts from a worker's start message."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys

import pytest
import torch

from loadertop import wire
from loadertop.probe import inbox, rng, stacks, worker


@pytest.fixture
def listener(tmp_path):
    box = inbox.WorkerInbox(str(tmp_path / "inbox.sock"))
    yield box
    box.close()


def _received(box: inbox.WorkerInbox) -> list:
    return [wire.decode_sample(data) for data in box.read(100)]


def test_the_socket_is_connected_at_once_and_every_sample_arrives_in_order(listener):
    sender = worker._Sender(listener.path, "h:1:loader0", 3)
    sender.connect()
    assert sender.socket is not None and not sender.failed
    sender.send_start(None, "/proc/1/fd/3")
    for seq in range(5):
        sender.send(1000 + seq, 10, 5, 99, 0, seq)
    got = _received(listener)
    assert isinstance(got[0], wire.WorkerStart) and got[0].stack_file == "/proc/1/fd/3"
    assert [s.seq for s in got[1:]] == list(range(5))
    assert {s.worker_id for s in got} == {3} and sender.dropped == 0
    sender.socket.close()


def test_a_deferred_sender_holds_everything_until_after_the_first_batch(listener, monkeypatch):
    # A worker's hook makes its sender deferred: its start message and first sample wait (no
    # socket made, no digest computed) until torch has the first batch.
    digested = []
    monkeypatch.setattr(rng, "digest", lambda captured: digested.append(captured) or {"x": "1"})
    sender = worker._Sender(listener.path, "h:1:loader0", 1)
    sender.deferred = True
    sender.send_start(None, "/proc/1/fd/3")
    sender.send(1000, 10, 5, 99, 0, 0)
    assert sender.socket is None and not digested and not _received(listener)
    assert [kind for kind, _ in sender.pending] == ["start", "sample"]
    sender.after_first_batch()
    sender.send(2000, 10, 5, 199, 0, 1)
    got = _received(listener)
    assert isinstance(got[0], wire.WorkerStart) and got[0].digests == {"x": "1"}
    assert got[0].stack_file == "/proc/1/fd/3"
    assert [s.seq for s in got[1:]] == [0, 1] and sender.dropped == 0 and len(digested) == 1
    sender.after_first_batch()  # once only: a second call (the exit's) does nothing
    assert not _received(listener)
    sender.socket.close()


def test_no_listener_at_all_fails_at_once_and_counts_what_follows(tmp_path):
    sender = worker._Sender(str(tmp_path / "missing.sock"), "h:1:loader0", 0)
    sender.connect()  # ENOENT: no main process to wait for
    assert sender.socket is None and sender.failed
    sender.send(1, 1)
    sender.send_start(None)
    assert sender.dropped == 2 and not sender.pending


def test_a_full_backlog_holds_samples_and_retries_without_waiting(tmp_path, monkeypatch):
    sender = worker._Sender(str(tmp_path / "x.sock"), "h:1:loader0", 0)
    calls = []
    # The sender's clock is the test's: CONNECT_RETRY_NS (10 ms) can pass between two lines here
    # on a loaded machine.
    now = [10**12]
    monkeypatch.setattr(worker, "_perf_ns", lambda: now[0])

    def connect_eagain(self, address):
        calls.append(address)
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(socket.socket, "connect", connect_eagain)
    sender.connect()
    assert sender.socket is None and not sender.failed and len(calls) == 1
    now[0] += worker.CONNECT_RETRY_NS - 1
    sender.send(1, 1, seq=0)  # a retry is not due yet: held, no connect
    assert len(calls) == 1 and len(sender.pending) == 1
    now[0] += 1  # due: tried again at this sample, held again
    sender.send(2, 2, seq=1)
    assert len(calls) == 2 and len(sender.pending) == 2 and sender.dropped == 0
    now[0] += worker.CONNECT_TRY_NS  # past CONNECT_TRY_NS since the first try: given up, all counted
    sender.send(3, 3, seq=2)
    assert sender.failed and sender.dropped == 3 and not sender.pending


def test_a_process_forked_from_a_worker_never_sends_on_its_socket(listener):
    sender = worker._Sender(listener.path, "h:1:loader0", 0)
    sender.connect()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        sender.send(1, 1)
        os.write(w, str(sender.dropped).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 10) == b"1"
    assert _received(listener) == []
    sender.socket.close()


DIGEST = """
import random, sys
from loadertop.probe import rng
random.seed(1234)
print(rng.digest(rng.capture(None))["random"])
"""


def test_a_random_state_digests_the_same_in_processes_with_different_hash_salts():
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        outs.add(out.stdout.strip())
    assert len(outs) == 1
    state = random.getstate()
    random.seed(1234)
    assert rng.digest(rng.capture(None))["random"] == outs.pop()
    random.setstate(state)


def test_digests_tell_states_apart_and_never_draw():
    a, b = random.Random(1), random.Random(2)
    before = a.getstate()
    assert rng._digest(a.getstate()) != rng._digest(b.getstate())
    assert rng._digest(a.getstate()) == rng._digest(random.Random(1).getstate())
    assert a.getstate() == before
    # not only numbers (a numpy state's str and bytes): blake2b of its parts, also unsalted
    assert rng._digest(("MT19937", b"\x01\x02", 3)) == rng._digest(("MT19937", b"\x01\x02", 3))
    assert rng._digest(("MT19937", b"\x01\x02", 3)) != rng._digest(("MT19937", b"\x01\x03", 3))
    assert rng._digest(("MT19937", b"\x01\x02", 3)) != rng._digest(("MT19937", b"\x01\x02", 4))
    # parts are length-prefixed: moving a byte from one part to the next changes the digest
    assert rng._digest((b"ab", b"c")) != rng._digest((b"a", b"bc"))
    assert rng._digest(("x", b"")) != rng._digest(("x",))
    assert rng._digest(("M", memoryview(b"\x01"), 3)) == rng._digest(("M", b"\x01", 3))


def test_a_torch_state_reads_the_same_bytes_either_way():
    state = torch.random.get_rng_state()
    assert rng._tensor_bytes(state) == state.numpy().tobytes()
    gen = torch.Generator().manual_seed(5)
    assert rng._state_of(gen) == ("torch Generator", gen.get_state().numpy().tobytes())


class _TorchStateDataset(torch.utils.data.Dataset):
    """Item i, read in the worker that gets it: what names torch's global generator there, and
    whether the cheap path (the seed torch gave this worker) was taken."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        state = dict(rng.capture(None))["torch"]
        info = torch.utils.data.get_worker_info()
        return info.id, rng._digest(state), isinstance(state, tuple)


def _torch_states(init=None) -> dict[int, set]:
    loader = torch.utils.data.DataLoader(_TorchStateDataset(), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork", worker_init_fn=init)
    out: dict[int, set] = {}
    for wid, digest, by_seed in loader:
        out.setdefault(wid, set()).add((digest, by_seed))
    return out


def _same_seed(worker_id: int) -> None:
    torch.manual_seed(1234)


_SHARED = torch.Generator().manual_seed(99).get_state()


def _same_state(worker_id: int) -> None:
    torch.set_rng_state(_SHARED)


@pytest.mark.parametrize("init, shared", [(None, False), (_same_seed, True), (_same_state, True)])
def test_torch_global_generator_is_named_by_its_worker_seed_until_a_worker_reseeds_it(init, shared):
    # Left as torch seeded it (base_seed + worker id), the seed names it; re-seeded alike in
    # every worker (manual_seed, set_rng_state), its state is read, and the workers match.
    states = _torch_states(init)
    assert sorted(states) == [0, 1], states
    for wid, seen in states.items():
        assert {by_seed for _, by_seed in seen} == {not shared}, (wid, seen)
    first = {min(seen)[0] for seen in states.values()}
    assert (len(first) == 1) == shared, states


def test_only_the_stack_files_a_worker_makes_for_its_own_pid_are_accepted(tmp_path):
    d = str(tmp_path)
    assert stacks.is_worker_stack_file("/proc/42/fd/7", 42, d)
    assert stacks.is_worker_stack_file(os.path.join(d, "42.txt"), 42, d)
    for path in ("/proc/43/fd/7", "/proc/42/fd/7/../../1/environ", "/proc/42/fd/x",
                 "/etc/passwd", os.path.join(d, "43.txt"), "/proc/42/fd/1234567890"):
        assert not stacks.is_worker_stack_file(path, 42, d), path
    assert not stacks.is_worker_stack_file(os.path.join(d, "42.txt"), 42, None)


def test_a_signal_dump_and_a_timeout_dump_both_parse():
    signal_dump = ('Stack (most recent call first):\n'
                   '  File "/data/ds.py", line 9 in read\n'
                   '  File "/data/ds.py", line 20 in __getitem__\n')
    assert stacks.parse_dump(signal_dump) == [("/data/ds.py", 20, "__getitem__"),
                                              ("/data/ds.py", 9, "read")]
    timeout_dump = ("Timeout (0:00:03)!\nThread 0x0000000000000002 (most recent call first):\n"
                    '  File "/x.py", line 1 in other\n\n'
                    "Thread 0x0000000000000001 (most recent call first):\n"
                    '  File "/data/ds.py", line 9 in read\n')
    assert stacks.parse_dump(timeout_dump) == [("/data/ds.py", 9, "read")]
    # two dumps: the one before the last (which may still be being written)
    assert stacks.parse_dump(signal_dump + signal_dump.replace("9 in read", "10 in read")) == \
        [("/data/ds.py", 20, "__getitem__"), ("/data/ds.py", 9, "read")]


def test_a_workers_flush_at_exit_runs_after_multiprocessing_removes_its_temporary_directory():
    # torch's data-queue feeder thread may still be sending the worker's first tensor at exit,
    # making a resource_sharer socket in that directory: a flush run before the removal widened
    # the window in which rmtree found the directory not empty (see worker._flush_at_exit).
    from multiprocessing import util

    util.get_temp_dir()  # registers the removal, as a worker's first tensor sent does
    removal = [key for key, finalizer in util._finalizer_registry.items()
               if getattr(finalizer, "_callback", None) is util._remove_temp_dir]
    assert removal, "multiprocessing registers no removal of its temporary directory"
    flushed: list[bool] = []

    class Held:
        def after_first_batch(self) -> None:
            flushed.append(True)

    before = set(util._finalizer_registry)
    worker._flush_at_exit(Held())
    (key,) = set(util._finalizer_registry) - before
    try:
        assert key[0] < removal[0][0]  # (exitpriority, order): lower runs later
    finally:
        util._finalizer_registry[key]()  # run (and so unregister) it now, not at this exit
    assert flushed == [True]
