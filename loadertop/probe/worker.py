"""Code that runs inside DataLoader worker processes: per-batch fetch time and CPU time.

The hook is chained in front of the user's `worker_init_fn` when an instrumented loader creates
its iterator. Inside the worker it wraps the *class* method `fetch` of torch's two fetcher classes
— patched in this worker process only (after fork or spawn), so the parent and other loaders'
workers are untouched, and the dataset object itself is never modified. Each fetched batch sends
one tiny sample to the parent's publisher over a PUSH socket created here, after the fork: a ZeroMQ
context must never cross a fork.
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

    def send(self, fetch_ns: int, cpu_ns: int) -> None:
        sock = self.socket if self.pid == os.getpid() else None
        try:
            if sock is None:
                sock = self._connect()
            import zmq

            sock.send(
                wire.encode_sample(
                    wire.WorkerSample(self.source, self.worker_id, self.pid, fetch_ns, cpu_ns,
                                      self.dropped)
                ),
                zmq.NOBLOCK,
            )
        except Exception:  # zmq.Again at HWM, or no transport at all: count, never raise
            self.dropped += 1


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
            w0 = _perf_ns()
            c0 = _cpu_ns()
            data = _original(self, possibly_batched_index)  # exceptions pass through untouched
            c1 = _cpu_ns()
            sender.send(_perf_ns() - w0, c1 - c0)
            return data

        timed_fetch._loadertop_timed = True
        cls.fetch = timed_fetch
    return True


class WorkerHook:
    """A picklable `worker_init_fn` (spawn pickles it) that installs timing, then runs the
    user's own `worker_init_fn`, whose behaviour and exceptions are unchanged."""

    def __init__(self, user_init_fn, source: str, endpoint: str | None) -> None:
        self.user_init_fn = user_init_fn
        self.source = source
        self.endpoint = endpoint

    def __call__(self, worker_id: int) -> None:
        if self.endpoint:
            try:
                _reset_inherited_signal_handlers()
                _install_fetch_timing(_Sender(self.endpoint, self.source, worker_id))
            except Exception:
                pass  # measuring must never break a worker
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)


def _reset_inherited_signal_handlers() -> None:
    # A forked worker inherits the parent's SIGTERM cleanup handler; torch terminates workers
    # with SIGTERM, which must keep its default meaning here.
    import signal

    from loadertop.probe import publisher

    if signal.getsignal(signal.SIGTERM) is publisher._on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
