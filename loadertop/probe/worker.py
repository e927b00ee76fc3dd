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

A worker gets no thread of ours. A second thread in a process forked from torch's (a large address
space, shared copy-on-write) cost that child CPU though it only waited, most of it growing with
the copy-on-write faults that follow (likely each then flushing the TLB of the CPU the thread ran
on: perf put `do_wp_page` and `smp_call_function_many_cond` at the top of instrumented workers'
kernel time, and neither among plain workers' 40 top symbols). faulthandler's
`dump_traceback_later` starts such a thread too (its C watchdog). Every epoch start of a loader
without persistent workers paid both, in every worker (docs/performance.md, "Worker start"). So:
- the socket is made and connected on the worker's own thread (`socket()` plus a non-blocking
  `connect()`, nothing waited for), and not before the first batch: until then everything is
  held (the start message and the first batch's sample), and goes out when torch's
  `_worker_loop` asks for the second batch (`after_first_batch`), or when the worker exits if it
  gets no second task (a `multiprocessing.util.Finalize`);
- hang forensics are a signal handler, not a watchdog: the hook registers CPython's
  `faulthandler.register(STACK_SIGNAL)` with a memfd (`arm_stack_dump`), and the main process,
  which knows from torch's `_task_info` which worker has been inside one batch for
  STACK_AFTER_S, sends that worker STACK_SIGNAL (probe/stacks.py); the C handler then writes the
  interrupted thread's stack, even while it is stuck in C holding the GIL.

This module imports only the standard library (a spawned worker imports it to unpickle the hook),
and the messages are written without msgspec (probe/sample_codec.py). What a fork worker does
before its first batch costs mostly the first touch of pages shared with its parent. Before the
first batch are only what must be: the stack handler (a worker stuck in that very batch is the
classic fork deadlock; the main process finds its memfd without the start message), the fetch
timing, and copying the random states before the dataset draws (probe/rng.py). What each step
of that saved, timed inside real fork workers and on the epoch's clock, is in
docs/performance.md ("Worker start", "Epoch start"); torch's own first fetch kept its page
faults, and where the rest of the hook's cost goes we have not found (no single part of the
hook, made a no-op, resolved on the clock; the hook as a whole did).
"""

from __future__ import annotations

import faulthandler  # here, in the parent: a forked worker inherits it (importing it there is dear)
import os
import signal
import time

# stdlib only (a forked worker has them from its parent; a spawned one imports just these)
from loadertop.probe import rng, sample_codec

TYPE_CHECKING = False  # not typing's: a worker imports this module alone, and little else
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import Any

_perf_ns = time.perf_counter_ns
_cpu_ns = time.process_time_ns  # all threads of the worker: a dataset may decode in a pool

MAX_PENDING = 1000  # samples held while the socket cannot connect yet (a full listen backlog)
SNDBUF_BYTES = 4 << 20  # asked for; Linux caps it at net.core.wmem_max (probe/inbox.py)
CONNECT_RETRY_NS = 10_000_000  # a full backlog (thousands of workers starting at once): retried
CONNECT_TRY_NS = 1_000_000_000  # at the next samples this often, for this long
STACK_AFTER_S = 2.0  # a worker inside one batch this long is asked for its stack (hang_forensics.py)
STACK_REFRESH_S = 1.0  # then again after this, doubling
# SIGURG: its default action is to ignore it, so a signal that reaches a process without our
# handler (a worker that could not register it, a pid just reused) does nothing there; Python
# programs do not use it (only sockets' out-of-band data, with F_SETOWN, raise it).
STACK_SIGNAL = signal.SIGURG
STACK_MEMFD_NAME = "loadertop-stack"  # how the main process finds it (probe/stacks.py)


class _Sender:
    """One socket per worker process (probe/inbox.py), used by the worker's own thread only.

    Connected in the hook; where the main process's listen backlog is full (EAGAIN: thousands of
    workers starting at once), samples are held (up to MAX_PENDING) and the connect is tried again
    at later samples, every CONNECT_RETRY_NS for CONNECT_TRY_NS, never waiting. Every send is
    non-blocking: a full socket, or a main process gone, drops the sample and counts it.
    """

    def __init__(self, endpoint: str, source: str, worker_id: int) -> None:
        self.endpoint = endpoint
        self.source = source
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.socket: socket.socket | None = None
        self.failed = False  # no transport at all: everything is counted as dropped
        self.pending: list[tuple[str, Any]] = []  # ("sample", fields) / ("start", digests), in order
        self.dropped = 0
        self._flags = 0
        self._retry_at = 0
        self._give_up_at = 0
        self._writer = sample_codec.SampleWriter(source, worker_id, self.pid)
        # True until `after_first_batch`: nothing is connected or sent before, all is held.
        self.deferred = False
        # No worker_init_fn of the program ran here (see rng.capture's `untouched`), and the
        # generators the parent found from the dataset before it forked this worker (or None).
        self.no_init_fn = False
        self.generators: list[tuple[str, object]] | None = None

    def send(self, fetch_ns: int, cpu_ns: int, collate_ns: int = 0, done_ns: int = 0,
             generation: int = 0, seq: int = 0, ended: bool = False,
             tensors: int | None = None, tensor_bytes: int | None = None) -> None:
        fields = (fetch_ns, cpu_ns, collate_ns, done_ns, generation, seq, ended, tensors,
                  tensor_bytes)
        if self.socket is None and self._hold("sample", fields):
            return
        self._send_now("sample", fields)

    def send_start(self, dataset: object, stack_file: str | None = None, map_style: bool = False) -> None:
        """Once per worker process, before its first batch (after the user's worker_init_fn):
        the random states it starts with, copied now (read, never drawn from), digested when
        the message is written (after the first batch where sending is deferred). `map_style`:
        torch made this worker's fetcher without calling the dataset (no `iter()` of it)."""
        try:
            captured = rng.capture(dataset, untouched=map_style and self.no_init_fn,
                                   generators=self.generators)
        except Exception:
            captured = []
        payload = (captured, stack_file)
        if self.socket is None and self._hold("start", payload):
            return
        self._send_now("start", payload)

    def after_first_batch(self) -> None:
        """The worker's first batch is in torch's queue: connect and send what was held (its
        start message and first sample), off the way to that batch. Also at the worker's exit
        (`_flush_at_exit`), for a worker that got no second task."""
        if self.deferred and self.pid == os.getpid():  # never from a process forked from it
            self.deferred = False
            if self.socket is None and not self.failed:
                self.connect()

    def _hold(self, kind: str, payload: Any) -> bool:
        """True when the item was held (or counted as dropped) for want of a socket; tries to
        connect again first when a retry is due (never while deferred)."""
        if not self.failed and not self.deferred and self.pid == os.getpid() and \
                _perf_ns() >= self._retry_at:
            self.connect()
            if self.socket is not None:
                return False
        if self.failed or self.pid != os.getpid() or len(self.pending) >= MAX_PENDING:
            self.dropped += 1
        else:
            self.pending.append((kind, payload))
        return True

    def _encode(self, kind: str, payload: Any) -> bytes:
        if kind == "start":
            captured, stack_file = payload
            return sample_codec.worker_start(self.source, self.worker_id, self.pid,
                                             rng.digest(captured), stack_file)
        return self._writer.sample(payload[0], payload[1], self.dropped, *payload[2:])

    def _send_now(self, kind: str, payload: Any) -> None:
        if self.pid != os.getpid():  # a process forked from this worker: not its socket
            self.dropped += 1
            return
        try:
            # Only once connected (connect, flush); a None here raises, which is counted.
            self.socket.send(self._encode(kind, payload), self._flags)  # type: ignore[union-attr]
        except Exception:  # full (EAGAIN), or the main process gone (EPIPE): count, never raise
            self.dropped += 1

    def connect(self) -> None:
        """A non-blocking connect; then what was held is sent. On EAGAIN (the listener's backlog
        is full) the next try is CONNECT_RETRY_NS later; any other failure, or CONNECT_TRY_NS of
        them, gives up: what is held and what follows is counted as dropped."""
        import socket  # torch has imported it already (torch.multiprocessing)

        now = _perf_ns()
        if not self._give_up_at:
            self._give_up_at = now + CONNECT_TRY_NS
        sock = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            except OSError:
                pass  # the default buffer: fewer samples held between two reads
            sock.setblocking(False)
            sock.connect(self.endpoint)
        except Exception as exc:
            if sock is not None:
                sock.close()
            if isinstance(exc, (BlockingIOError, InterruptedError)) and now < self._give_up_at:
                self._retry_at = now + CONNECT_RETRY_NS
            else:
                self.failed = True
                self.dropped += len(self.pending)
                self.pending = []
            return
        self._flags = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
        self.socket = sock
        pending, self.pending = self.pending, []
        for kind, payload in pending:
            self._send_now(kind, payload)

def arm_stack_dump(stack_dir: str | None) -> str | None:
    """Register CPython's faulthandler for STACK_SIGNAL, writing to an anonymous memory file
    (memfd: cheaper in a forked worker than creating a file; docs/performance.md), which the
    main process, this worker's parent, reads as `/proc/<pid>/fd/<fd>`; to `<stack_dir>/<pid>.txt`
    where there is no memfd. Returns the path, or None where the signal is taken (a handler of the
    program's own: left alone) or nothing could be made.

    The handler (C, async-signal-safe) writes the stack of the thread the signal interrupts; the
    process-directed signal goes to the main thread — torch's worker loop — unless that thread
    blocks it. SA_RESTART is set (CPython 3.11 `register` with chain=False): a system call it
    interrupts is restarted, except those POSIX never restarts (poll, nanosleep...), which fail
    with EINTR, and Python retries itself (PEP 475)."""
    pid = os.getpid()
    if _stack[0] == pid or \
            signal.getsignal(STACK_SIGNAL) not in (signal.SIG_DFL, signal.SIG_IGN):
        return None
    try:
        fd = os.memfd_create(STACK_MEMFD_NAME, os.MFD_CLOEXEC)
        path = f"/proc/{pid}/fd/{fd}"
    except (AttributeError, OSError):
        if not stack_dir:
            return None
        path = stack_file_in(stack_dir, pid)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        except OSError:
            return None
    try:
        faulthandler.register(STACK_SIGNAL, file=fd, all_threads=False, chain=False)
    except Exception:
        os.close(fd)
        return None
    _stack[:] = [pid, path, fd]  # fd stays open while the process lives: the handler writes there
    return path


_stack: list[Any] = [0, None, -1]  # [pid, path, fd] of this process's armed stack file


def stack_file_in(stack_dir: str, pid: int) -> str:
    """The stack file of a worker without memfd (probe/stacks.py reads it)."""
    return os.path.join(stack_dir, f"{pid}.txt")


CENSUS_NS = 1_000_000_000  # count a batch's tensors at most once a second per worker
CENSUS_MAX_NODES = 10_000  # and stop walking a huge nested batch there

_generations = [0]  # fetchers this worker process has made (one per epoch of persistent workers)


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

    def __init__(self, collate_fn: Callable[[Any], Any], timing: _FetcherTiming) -> None:
        self.collate_fn = collate_fn
        self.timing = timing

    def __call__(self, data: Any) -> Any:
        t0 = _perf_ns()
        batch = self.collate_fn(data)
        self.timing.collate_ns = _perf_ns() - t0
        return batch


def tensor_census(batch: Any, max_nodes: int = CENSUS_MAX_NODES) -> tuple[int, int] | None:
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

        def timed_fetch(self: Any, possibly_batched_index: Any, _original: Any = original,
                        _map_style: bool = cls is torch_fetch._MapDatasetFetcher) -> Any:
            # torch 2.13 `_worker_loop` makes a fetcher after worker_init_fn and a new one at each
            # `_ResumeIteration` (persistent workers); `fetch` calls `self.collate_fn(data)`.
            timing = self.__dict__.get("_loadertop_timing")
            if timing is None:
                timing = self._loadertop_timing = _FetcherTiming()
                self.collate_fn = _TimedCollate(self.collate_fn, timing)
                if timing.generation == 0:  # this worker process's first batch: before any draw
                    sender.send_start(getattr(self, "dataset", None), _stack_file(), _map_style)
                elif sender.deferred:  # a persistent worker that had one task last epoch
                    sender.after_first_batch()
            elif sender.deferred:  # torch's `_worker_loop` put the previous batch in its queue
                sender.after_first_batch()
            seq = timing.seq
            timing.seq = seq + 1
            timing.collate_ns = 0
            w0 = _perf_ns()
            c0 = _cpu_ns()
            try:
                data = _original(self, possibly_batched_index)
            except StopIteration:  # an iterable dataset ran out: the loop will skip this task
                sender.after_first_batch()  # no batch to wait for: what was held goes now
                sender.send(0, 0, generation=timing.generation, seq=seq, ended=True)
                raise
            c1 = _cpu_ns()
            w1 = _perf_ns()  # the batch is produced: what follows is the handoff
            tensors = tensor_bytes = None
            if w1 >= timing.next_census:
                census = tensor_census(data)
                if census is not None:
                    tensors, tensor_bytes = census
                timing.next_census = _perf_ns() + CENSUS_NS
            sender.send(w1 - w0, c1 - c0, timing.collate_ns, w1, timing.generation, seq,
                        False, tensors, tensor_bytes)
            return data

        # The fetcher class is patched in the worker: attributes mypy does not expect there.
        timed_fetch._loadertop_timed = True  # type: ignore[attr-defined]
        cls.fetch = timed_fetch  # type: ignore[method-assign]
    return True


class WorkerHook:
    """A picklable `worker_init_fn` (spawn pickles it) that installs timing, then runs the
    user's own `worker_init_fn`, whose behaviour and exceptions are unchanged."""

    def __init__(self, user_init_fn: Callable[[int], object] | None, source: str,
                 endpoint: str | None, stack_dir: str | None = None,
                 generators: list[tuple[str, object]] | None = None) -> None:
        self.user_init_fn = user_init_fn
        self.source = source
        self.endpoint = endpoint
        self.stack_dir = stack_dir
        # rng.find_generators(dataset), run by the parent just before it forks the workers (the
        # same objects in a forked worker): see rng.capture. Never pickled (spawn, forkserver):
        # a worker that unpickles its own dataset walks it itself.
        self.generators = generators

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, generators=None)

    def __call__(self, worker_id: int) -> None:
        if self.endpoint:  # the stack handler is announced over the socket: nothing without it
            try:
                _start(self, worker_id)
            except Exception:
                pass  # measuring must never break a worker
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)


_started = [0]  # the pid this hook started in (a persistent worker runs the hook once)


def _start(hook: WorkerHook, worker_id: int) -> None:
    pid = os.getpid()
    if _started[0] == pid:
        return
    _started[0] = pid
    arm_stack_dump(hook.stack_dir)
    # SIGTERM is left as torch set it: torch 2.13's `_worker_loop` installs its C handler
    # (`_set_worker_signal_handlers`, before any worker_init_fn), which exits 0 when the parent
    # sends SIGTERM (multiprocessing's atexit terminating the daemonic workers of an iterator
    # still alive at exit), so that the parent's SIGCHLD handler does not report the worker as
    # killed. A forked worker's `signal.getsignal(SIGTERM)` still names the parent's Python
    # handler (publisher._on_sigterm): Python caches it, though the C handler has replaced it.
    # Resetting it to SIG_DFL here, as this hook once did, replaced torch's handler: a program
    # exiting with a live iterator then printed "DataLoader worker (pid N) is killed by signal:
    # Terminated" from atexit in some runs, never in plain ones (docs/performance.md).
    sender = _Sender(hook.endpoint, hook.source, worker_id)  # type: ignore[arg-type]  # set: see __call__
    sender.deferred = True
    if hook.user_init_fn is None:
        sender.no_init_fn = True
        sender.generators = hook.generators
    _flush_at_exit(sender)
    _install_fetch_timing(sender)


def _flush_at_exit(sender: _Sender) -> None:
    """What a worker with one task held goes out when it ends: torch's worker returns from
    `_worker_loop`, and multiprocessing's `Process._bootstrap` (CPython 3.11) runs the process's
    `util.Finalize` callbacks before `os._exit` (atexit would not run).

    Last of them, after multiprocessing removes the worker's temporary directory (exitpriority
    -100). torch 2.13's worker leaves its data queue's feeder thread running at exit
    (`cancel_join_thread`), and the feeder's first tensor sent makes a `resource_sharer`
    listener socket in that directory: a flush run before the removal (connect, digest the
    states, send, holding the GIL) widened, as we read it, the window in which the feeder adds its socket
    while `rmtree` empties the directory, which then printed `OSError: [Errno 39] Directory not
    empty` from the worker. Counted in 2-worker fork epochs dropped after their first batch
    (1,000 a process, the variants alternated): 10 in 5,000 epochs with the flush first
    (exitpriority 100), 3 in 6,000 with it last, 0 in 5,000 plain. What is left is our reading of
    the worker's first batch (the hook's start) leaving the feeder later. A feeder that starts
    after the removal finds the process exiting and drops its error silently (`Queue._feed`)."""
    try:
        from multiprocessing import util

        util.Finalize(None, sender.after_first_batch, exitpriority=-1000)
    except Exception:
        pass


def _stack_file() -> str | None:
    """The armed stack file, announced in the worker's start message (after the user's
    worker_init_fn) only while STACK_SIGNAL is still ours: a handler the program set meanwhile
    must never receive our signal. The main process signals only workers whose stack file it
    knows, from that message or, for a worker stuck before sending it (the message goes after
    the first batch), found among the worker's open files (stacks.find_worker_stack_file); so
    where the program took the signal, the file is also closed (removed), and cannot be found."""
    if _stack[0] != os.getpid():
        return None
    if signal.getsignal(STACK_SIGNAL) not in (signal.SIG_DFL, signal.SIG_IGN):
        _withdraw_stack_file()
        return None
    path: str | None = _stack[1]
    return path


def _withdraw_stack_file() -> None:
    # faulthandler keeps the fd number, but its handler is no longer installed (the program's
    # replaced it), so nothing writes there; unregistering would put SIG_DFL back over theirs.
    pid, path, fd = _stack
    _stack[:] = [0, None, -1]
    try:
        if path is not None and not path.startswith("/proc/"):
            os.unlink(path)
        os.close(fd)
    except OSError:
        pass
