"""Code that runs inside DataLoader worker processes: per-batch stage times and CPU time.

The hook is chained in front of the user's `worker_init_fn` when an instrumented loader creates
its iterator. Inside the worker it wraps the *class* method `fetch` of torch's two fetcher classes
— patched in this worker process only (after fork or spawn), so the parent and other loaders'
workers are untouched, and the dataset object itself is never modified. The fetcher's own
`collate_fn` attribute (torch's object, made in the worker) is wrapped to time the collate apart
from getting the items. Each fetched batch sends one tiny sample to the parent's publisher over a
socket made here, after the fork (probe/inbox.py): its fetch and collate times, CPU time, and the
moment it was produced (`perf_counter_ns`, CLOCK_MONOTONIC on Linux: comparable with the main
process's stamps), named by (pid, fetcher generation, sequence) so the main process can pair it
with the loop's receipt of the same batch.

Nothing before a worker's first batch costs more than a few stamps: this module imports only the
standard library (a spawned worker imports it to unpickle the hook), the messages are written
without msgspec (probe/sample_codec.py), and the socket and the watchdog's loop wait for the
helper thread (`_Sender`, `_Helper`).
"""

from __future__ import annotations

import _thread
import os
import time

# stdlib only (a forked worker has them from its parent; a spawned one imports just these)
from loadertop.probe import rng, sample_codec

_perf_ns = time.perf_counter_ns
_cpu_ns = time.process_time_ns  # all threads of the worker: a dataset may decode in a pool

MAX_PENDING = 1000  # samples held until the socket is ready
SNDBUF_BYTES = 4 << 20  # asked for; Linux caps it at net.core.wmem_max (probe/inbox.py)
CLOSE_WAIT_S = 1.0  # at a spawned worker's exit, the longest wait for the helper to stop
CONNECT_TRY_S = 1.0  # a full backlog (thousands of workers starting at once) is retried this long
FIRST_BATCH_WAIT_S = 1.0  # the helper starts after the first batch, or after this long
STACK_AFTER_S = 2.0  # a worker inside one batch this long writes its stack (and then each second)
WATCHDOG_S = 1.0  # the worker's watchdog (its helper thread) wakes this often
FAULT_AFTER_S = 3.0  # ... and the C watchdog dumps if it has not been re-armed for this long
STACK_AFTER_NS = int(STACK_AFTER_S * 1e9)


class _Sender:
    """One socket per worker process (probe/inbox.py), made off the batch path.

    The worker's first batch is on the training loop's critical path at every epoch start, and
    a fresh worker process pays for everything it does before it: a started thread
    (threading.Thread.start waits for the new thread to run: 0.5-3 ms in a busy worker), a
    connect. So the worker's loop thread only takes stamps and appends tuples here; the helper
    thread (`_Helper`, started with `_thread.start_new_thread`, which does not wait) connects
    once the first batch is produced, sends what was held, and then hands the socket to the
    loop's thread, which from then on sends each sample itself (one non-blocking send: the
    handover is under `lock`, so the two threads never send at once). The messages are written
    by probe/sample_codec.py: importing msgspec and the schema in a spawned worker took ~7 ms
    on that thread, just as the first batch was being handed over.
    """

    def __init__(self, endpoint: str, source: str, worker_id: int) -> None:
        self.endpoint = endpoint
        self.source = source
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.socket = None  # set once by the helper; then only the loop's thread uses it
        self.failed = False  # no transport at all: everything is counted as dropped
        self.pending: list = []  # ("sample", fields) / ("start", captured states), in order
        self.lock = _thread.allocate_lock()
        self.dropped = 0
        self._flags = 0
        self._writer = sample_codec.SampleWriter(source, worker_id, self.pid)

    def send(self, fetch_ns: int, cpu_ns: int, collate_ns: int = 0, done_ns: int = 0,
             generation: int = 0, seq: int = 0, ended: bool = False,
             tensors: int | None = None, tensor_bytes: int | None = None) -> None:
        fields = (fetch_ns, cpu_ns, collate_ns, done_ns, generation, seq, ended, tensors,
                  tensor_bytes)
        if self.socket is None and self._hold("sample", fields):
            return
        self._send_now("sample", fields)

    def send_start(self, dataset) -> None:
        """Once per worker process, before its first batch (after the user's worker_init_fn):
        the random states it starts with, read now (never drawn from), digested later."""
        try:
            states = rng.capture(dataset)
        except Exception:
            states = []
        if self.socket is None and self._hold("start", states):
            return
        self._send_now("start", states)

    def _hold(self, kind: str, payload) -> bool:
        """True when the item was held (or counted as dropped) because there is no socket yet."""
        with self.lock:
            if self.socket is not None:
                return False
            if self.failed or self.pid != os.getpid() or len(self.pending) >= MAX_PENDING:
                self.dropped += 1
            else:
                self.pending.append((kind, payload))
            return True

    def _encode(self, kind: str, payload) -> bytes:
        if kind == "start":
            return sample_codec.worker_start(self.source, self.worker_id, self.pid,
                                             rng.digest(payload))
        return self._writer.sample(payload[0], payload[1], self.dropped, *payload[2:])

    def _send_now(self, kind: str, payload, sock=None) -> None:
        if self.pid != os.getpid():  # a process forked from this worker: not its socket
            self.dropped += 1
            return
        try:
            (sock or self.socket).send(self._encode(kind, payload), self._flags)
        except Exception:  # full (EAGAIN), or the main process gone (EPIPE): count, never raise
            self.dropped += 1

    def connect(self) -> None:
        """On the helper thread: the socket (probe/inbox.py), then what was held, then the
        handover."""
        try:
            import socket

            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            except OSError:
                pass  # the default buffer: fewer samples held between two reads
            sock.setblocking(False)
            deadline = time.monotonic() + CONNECT_TRY_S
            while True:
                try:
                    sock.connect(self.endpoint)
                    break
                except (BlockingIOError, InterruptedError):  # the listener's backlog is full
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)  # this thread only: nothing waits for it
            self._flags = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
        except Exception:
            with self.lock:
                self.failed = True
                self.dropped += len(self.pending)
                self.pending.clear()
            return
        with self.lock:
            for kind, payload in self.pending:
                self._send_now(kind, payload, sock)
            self.pending.clear()
            self.socket = sock


class _Helper:
    """The worker's one background thread: the sender's socket (after the first batch), then the
    hang watchdog (see probe/stacks.py), waking every WATCHDOG_S. The C watchdog (faulthandler) is
    armed by the hook itself, before the first batch, so a hang there still leaves a stack.

    A spawned or forkserver worker ends with the interpreter's finalization (a forked one with
    os._exit). A thread of ours still running then is killed as it next takes the GIL
    (pthread_exit in CPython 3.11), and with torch loaded that aborted one spawned worker in
    60-120 here ("terminate called without an active exception", SIGABRT: torch's DataLoader
    then raises in the training loop), most often while the thread was still importing. So an
    atexit handler, which runs before finalization, stops the thread and waits for it.
    """

    def __init__(self, sender: _Sender | None, stack_dir: str | None) -> None:
        import atexit

        self.pid = os.getpid()
        self.sender = sender
        self.stopping = False
        self.started = False  # the first batch is made (or failed)
        self.first_batch = _locked()  # released by the fetch wrapper when the first batch is made
        self.stop = _locked()  # released by close(): the watchdog's wait ends at once
        self.finished = _locked()  # released by the thread as it ends
        self.watchdog = None
        if stack_dir:
            try:
                self.watchdog = WorkerWatchdog(stack_dir, _batch_started)
            except Exception:
                self.watchdog = None  # measuring must never break a worker
        _thread.start_new_thread(self._run, ())
        atexit.register(self.close)  # never runs in a forked worker: it leaves by os._exit

    def first_batch_done(self) -> None:
        if not self.started:  # once: persistent workers make a first batch every epoch
            self.started = True
            _release(self.first_batch)

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        if self.pid != os.getpid():
            return
        self.stopping = True
        _release(self.first_batch)
        _release(self.stop)
        self.finished.acquire(timeout=timeout)
        if self.watchdog is not None:
            self.watchdog.disarm()

    def _run(self) -> None:
        try:
            self.first_batch.acquire(timeout=FIRST_BATCH_WAIT_S)
            if self.sender is not None and not self.stopping:
                self.sender.connect()
            if self.watchdog is not None:
                while not self.stopping and not self.stop.acquire(timeout=WATCHDOG_S):
                    if not self.watchdog.tick():
                        break
        except Exception:
            pass  # the helper just stops; the batches never depend on it
        finally:
            _release(self.finished)


def _locked():
    lock = _thread.allocate_lock()
    lock.acquire()
    return lock


def _release(lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # released already (by another caller in the meantime)
        pass


CENSUS_NS = 1_000_000_000  # count a batch's tensors at most once a second per worker
CENSUS_MAX_NODES = 10_000  # and stop walking a huge nested batch there

_generations = [0]  # fetchers this worker process has made (one per epoch of persistent workers)
_batch_started = [0]  # perf_counter_ns() when the current batch began, 0 between batches


class _FetcherTiming:
    """Per fetcher (torch's object, in this worker only): its batch count and the last collate."""

    __slots__ = ("generation", "seq", "collate_ns", "next_census")

    def __init__(self) -> None:
        self.generation = _generations[0]
        _generations[0] += 1
        self.seq = 0
        self.collate_ns = 0
        self.next_census = 0


class _TimedCollate:
    """Stands in for the fetcher's `collate_fn` attribute: calls it once, returns what it
    returns, lets its exceptions through untouched, and notes how long it took."""

    __slots__ = ("collate_fn", "timing")

    def __init__(self, collate_fn, timing: _FetcherTiming) -> None:
        self.collate_fn = collate_fn
        self.timing = timing

    def __call__(self, data):
        t0 = _perf_ns()
        batch = self.collate_fn(data)
        self.timing.collate_ns = _perf_ns() - t0
        return batch


def tensor_census(batch, max_nodes: int = CENSUS_MAX_NODES) -> tuple[int, int] | None:
    """(tensors, bytes) in a collated batch, walking lists, tuples and dicts; None past
    `max_nodes` (a figure from part of a batch would be a guess). Reads sizes only."""
    try:
        import torch
    except ImportError:
        return None
    tensors = size = nodes = 0
    stack = [batch]
    while stack:
        nodes += 1
        if nodes > max_nodes:
            return None
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            tensors += 1
            size += item.element_size() * item.numel()
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return tensors, size


def _install_fetch_timing(sender: _Sender) -> bool:
    try:
        from torch.utils.data._utils import fetch as torch_fetch

        classes = [torch_fetch._MapDatasetFetcher, torch_fetch._IterableDatasetFetcher]
    except (ImportError, AttributeError):
        return False  # an unknown torch layout: fetch figures become null, training unaffected
    for cls in classes:
        original = cls.__dict__.get("fetch")
        if original is None or getattr(original, "_loadertop_timed", False):
            continue

        def timed_fetch(self, possibly_batched_index, _original=original):
            # torch 2.13 `_worker_loop` makes a fetcher after worker_init_fn and a new one at each
            # `_ResumeIteration` (persistent workers); `fetch` calls `self.collate_fn(data)`.
            timing = self.__dict__.get("_loadertop_timing")
            if timing is None:
                timing = self._loadertop_timing = _FetcherTiming()
                self.collate_fn = _TimedCollate(self.collate_fn, timing)
                if timing.generation == 0:  # this worker process's first batch: before any draw
                    sender.send_start(getattr(self, "dataset", None))
            seq = timing.seq
            timing.seq = seq + 1
            timing.collate_ns = 0
            w0 = _perf_ns()
            c0 = _cpu_ns()
            _batch_started[0] = w0  # for the watchdog thread (hang forensics)
            try:
                data = _original(self, possibly_batched_index)
            except StopIteration:  # an iterable dataset ran out: the loop will skip this task
                _batch_started[0] = 0
                sender.send(0, 0, generation=timing.generation, seq=seq, ended=True)
                raise
            except BaseException:
                _batch_started[0] = 0
                raise
            finally:
                if seq == 0:  # made or failed: the helper may start (once per process)
                    _first_batch_done()
            c1 = _cpu_ns()
            w1 = _perf_ns()  # the batch is produced: what follows is the handoff
            _batch_started[0] = 0
            tensors = tensor_bytes = None
            if w1 >= timing.next_census:
                census = tensor_census(data)
                if census is not None:
                    tensors, tensor_bytes = census
                timing.next_census = _perf_ns() + CENSUS_NS
            sender.send(w1 - w0, c1 - c0, timing.collate_ns, w1, timing.generation, seq,
                        False, tensors, tensor_bytes)
            return data

        timed_fetch._loadertop_timed = True
        cls.fetch = timed_fetch
    return True


class WorkerHook:
    """A picklable `worker_init_fn` (spawn pickles it) that installs timing, then runs the
    user's own `worker_init_fn`, whose behaviour and exceptions are unchanged."""

    def __init__(self, user_init_fn, source: str, endpoint: str | None,
                 stack_dir: str | None = None) -> None:
        self.user_init_fn = user_init_fn
        self.source = source
        self.endpoint = endpoint
        self.stack_dir = stack_dir

    def __call__(self, worker_id: int) -> None:
        if self.endpoint or self.stack_dir:
            try:
                _start_helper(self, worker_id)
            except Exception:
                pass  # measuring must never break a worker
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)


_helper: list = []  # this worker process's _Helper (a persistent worker runs the hook once)


def _start_helper(hook: WorkerHook, worker_id: int) -> None:
    if _helper and _helper[0].pid == os.getpid():
        return
    sender = None
    if hook.endpoint:
        _reset_inherited_signal_handlers()
        sender = _Sender(hook.endpoint, hook.source, worker_id)
        _install_fetch_timing(sender)
    _helper[:] = [_Helper(sender, hook.stack_dir)]


def _first_batch_done() -> None:
    if _helper:
        _helper[0].first_batch_done()


class WorkerWatchdog:
    """Inside a worker process: see probe/stacks.py's docstring. `batch_started` is a one-element
    list the fetch wrapper sets to `perf_counter_ns()` when a batch begins and to 0 when it ends.
    Made by the hook (it arms the C watchdog at once); the helper thread calls `tick()`."""

    def __init__(self, stack_dir: str, batch_started: list[int]) -> None:
        import faulthandler

        self.pid = os.getpid()
        self.batch_started = batch_started
        self.py_path = os.path.join(stack_dir, f"{self.pid}.py.txt")
        self.main_thread = _thread.get_ident()  # made on the worker's loop thread
        # A bare descriptor (faulthandler takes one since Python 3.5), kept open while
        # faulthandler may write to it. A file object (os.fdopen) instead cost each short-lived
        # 2-worker loader ~2 ms more here (+2.7 against +0.6 ms over plain, 150 A/B rounds).
        self.fault_fd = os.open(os.path.join(stack_dir, f"{self.pid}.txt"),
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        self._faulthandler = faulthandler
        self._arm()

    def _arm(self) -> None:
        # Re-arming replaces the previous timer: it fires only if this is not called again.
        self._faulthandler.dump_traceback_later(FAULT_AFTER_S, repeat=False, file=self.fault_fd)

    def tick(self) -> bool:
        """One wake-up; False once it has failed (the watchdog then just stops)."""
        try:
            self._arm()
            started = self.batch_started[0]
            if started and time.perf_counter_ns() - started >= STACK_AFTER_NS:
                self._write_stack()
            return True
        except Exception:
            return False  # measuring must never break a worker

    def disarm(self) -> None:
        try:
            self._faulthandler.cancel_dump_traceback_later()
        except Exception:
            pass

    def _write_stack(self) -> None:
        import sys
        import traceback

        frame = sys._current_frames().get(self.main_thread)
        if frame is None:
            return
        lines = ["Timeout (loadertop watchdog)!\n", "Thread 0x0 (most recent call first):\n"]
        for f in reversed(traceback.extract_stack(frame, limit=sample_codec.MAX_FRAMES)):
            lines.append(f'  File "{f.filename}", line {f.lineno or 0} in {f.name}\n')
        tmp = self.py_path + ".tmp"
        with open(tmp, "w") as fh:
            fh.writelines(lines)
        os.replace(tmp, self.py_path)


def _reset_inherited_signal_handlers() -> None:
    # A forked worker inherits the parent's SIGTERM cleanup handler; torch terminates workers
    # with SIGTERM, which must keep its default meaning here.
    # Only a process that has the publisher module can have its handler: a forked worker. A
    # spawned or forkserver worker does not, and importing it there (psutil, the system
    # readers...) cost ~30 ms per worker from bytecode, ~170 ms without.
    import signal
    import sys

    publisher = sys.modules.get("loadertop.probe.publisher")
    if publisher is None:
        return
    if signal.getsignal(signal.SIGTERM) is getattr(publisher, "_on_sigterm", None):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
