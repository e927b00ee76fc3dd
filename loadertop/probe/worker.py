"""Code that runs inside DataLoader worker processes: per-batch stage times and CPU time.

The hook is chained in front of the user's `worker_init_fn` when an instrumented loader creates
its iterator. Inside the worker it wraps the *class* method `fetch` of torch's two fetcher classes
— patched in this worker process only (after fork or spawn), so the parent and other loaders'
workers are untouched, and the dataset object itself is never modified. The fetcher's own
`collate_fn` attribute (torch's object, made in the worker) is wrapped to time the collate apart
from getting the items. Each fetched batch sends one tiny sample to the parent's publisher over a
PUSH socket created here, after the fork (a ZeroMQ context must never cross a fork): its fetch and
collate times, CPU time, and the moment it was produced (`perf_counter_ns`, CLOCK_MONOTONIC on
Linux: comparable with the main process's stamps), named by (pid, fetcher generation, sequence)
so the main process can pair it with the loop's receipt of the same batch.
"""

from __future__ import annotations

import os
import time

from loadertop import wire

_perf_ns = time.perf_counter_ns
_cpu_ns = time.process_time_ns  # all threads of the worker: a dataset may decode in a pool


class _Sender:
    """One PUSH socket per worker process, created lazily in that process; never blocks."""

    def __init__(self, endpoint: str, source: str, worker_id: int) -> None:
        self.endpoint = endpoint
        self.source = source
        self.worker_id = worker_id
        self.pid = -1
        self.socket = None
        self.dropped = 0

    def _connect(self):
        import zmq

        ctx = zmq.Context()  # a fresh context owned by this worker process
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)  # a dying worker must not hang on unsent samples
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.connect(self.endpoint)
        self.pid = os.getpid()
        self.socket = sock
        return sock

    def send(self, fetch_ns: int, cpu_ns: int, collate_ns: int = 0, done_ns: int = 0,
             generation: int = 0, seq: int = 0, ended: bool = False,
             tensors: int | None = None, tensor_bytes: int | None = None) -> None:
        if self.pid != os.getpid() and not self._connected():
            return
        self._send(wire.WorkerSample(self.source, self.worker_id, self.pid, fetch_ns, cpu_ns,
                                     self.dropped, collate_ns, done_ns, generation, seq, ended,
                                     tensors, tensor_bytes))

    def send_start(self, dataset) -> None:
        """Once per worker process, before its first batch (after the user's worker_init_fn):
        the random states it starts with."""
        try:
            from loadertop.probe import rng

            digests = rng.digests(dataset)
        except Exception:
            digests = {}
        if self.pid != os.getpid() and not self._connected():
            return
        self._send(wire.WorkerStart(self.source, self.worker_id, self.pid, digests))

    def _connected(self) -> bool:
        try:
            self._connect()
            return True
        except Exception:  # no transport at all: count, never raise
            self.dropped += 1
            return False

    def _send(self, msg: wire.WorkerMessage) -> None:
        try:
            import zmq

            self.socket.send(wire.encode_sample(msg), zmq.NOBLOCK)
        except Exception:  # zmq.Again at HWM: count, never raise
            self.dropped += 1


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
        if self.endpoint:
            try:
                _reset_inherited_signal_handlers()
                _install_fetch_timing(_Sender(self.endpoint, self.source, worker_id))
            except Exception:
                pass  # measuring must never break a worker
        if self.stack_dir:
            try:
                _start_watchdog(self.stack_dir)
            except Exception:
                pass
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)


_watchdog: list = []  # this worker process's WorkerWatchdog (one per process)


def _start_watchdog(stack_dir: str) -> None:
    """Once per worker process (a persistent worker runs this hook once): its stacks go to
    `<stack_dir>/<pid>*.txt` when it hangs, where the main process reads them (probe/stacks.py)."""
    if _watchdog and _watchdog[0].pid == os.getpid():
        return
    from loadertop.probe import stacks

    _watchdog[:] = [stacks.WorkerWatchdog(stack_dir, _batch_started)]


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
