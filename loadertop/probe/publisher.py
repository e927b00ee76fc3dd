"""The one background thread per training process that owns all sockets.

It drains the loaders' records, samples queue depth (~50 Hz), worker liveness/CPU/RSS and the
machine (1 Hz), receives the workers' fetch samples on a PULL socket, and publishes a report per
loader every REPORT_S on an XPUB socket. XPUB lets it see a viewer subscribe and answer with a
report at once, so a late joiner needs no wait. Sends are NOBLOCK onto a bounded HWM: a slow,
frozen or dead viewer costs dropped messages (visible as sequence gaps), never a blocked loop.
"""

from __future__ import annotations

import atexit
import math
import os
import signal
import socket
import sys
import threading
import time

import psutil

from loadertop import discovery, endpoints, environment, wire
from loadertop.probe.record import LoaderRecord

SAMPLE_S = 0.02  # queue-depth sampling period: enough samples per report to see the fill
REPORT_S = 0.25  # one report per loader: 4 Hz keeps the viewer's 1 s refresh fresh
SLOW_S = 1.0  # psutil worker sampling and the system sample
RETIRE_AFTER_S = 10.0  # a loader garbage-collected this long ago says goodbye and stops reporting
SNDHWM = 1000
CLOSE_LINGER_MS = 200  # at exit, let the goodbye messages leave, but never hold exit longer

_lock = threading.Lock()
_publisher: Publisher | None = None
_warned = False


def warn_once(message: str) -> None:
    """The shim's only voice: one line on stderr, once per process."""
    global _warned
    if not _warned:
        _warned = True
        try:
            print(f"loadertop: {message}", file=sys.stderr, flush=True)
        except Exception:
            pass


def get_publisher(endpoint: str | None = None) -> Publisher:
    """The process's publisher, created on first use (and again in a forked child); `endpoint`
    only matters to the call that creates it."""
    global _publisher
    with _lock:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher(endpoint)
        return _publisher


class Publisher:
    def __init__(self, endpoint: str | None = None) -> None:
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.rank = environment.rank()
        try:
            proc = psutil.Process()
            self.started_at = proc.create_time()
            self.command = " ".join(proc.cmdline())[:wire.MAX_TEXT]
        except psutil.Error:
            self.started_at = time.time()
            self.command = " ".join(sys.argv)[:wire.MAX_TEXT]
        self.records: list[LoaderRecord] = []
        self._names: set[str] = set()
        self._records_lock = threading.Lock()
        self.directory = discovery.discovery_dir()
        # Given: instrument(endpoint=) or LOADERTOP_ENDPOINT, checked when the publisher starts.
        self.requested_endpoint = endpoint or environment.endpoint()
        self._endpoint_given = bool(endpoint)
        self._ipv6 = False  # an IPv6 address to listen on: ZeroMQ needs the IPV6 option for it
        self.endpoint = self.requested_endpoint or f"ipc://{self.directory}/{self.pid}.sock"
        self.worker_endpoint: str | None = f"ipc://{self.directory}/{self.pid}-workers.sock"
        self.entry_path = None
        self.failed: str | None = None
        self.subscriptions = 0  # viewers subscribed now (XPUB_VERBOSE reports each one)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._send_now = False
        self._thread: threading.Thread | None = None
        self._system = None
        self._curve = None  # loadertop.remote.CurveServer when LOADERTOP_CURVE_SECRET is set

    # ------------------------------------------------------------ training thread side
    def unique_name(self, name: str | None) -> str:
        with self._records_lock:
            if name is None:
                name = f"loader{len(self.records)}"
            base, n = name, 2
            while name in self._names:
                name = f"{base}-{n}"
                n += 1
            self._names.add(name)
            return name

    def register(self, loader, name: str) -> LoaderRecord:
        record = LoaderRecord(
            loader, name=name, source=f"{self.host}:{self.pid}:{name}", host=self.host,
            rank=self.rank, command=self.command, process_started_at=self.started_at,
        )
        with self._records_lock:
            self.records.append(record)
        self._start()
        return record

    def ensure_registered(self, record: LoaderRecord) -> None:
        """Report `record` again (a retired one reused for a new loader, see autoinstrument)."""
        with self._records_lock:
            record.retired_since = None
            if record not in self.records:
                self.records.append(record)

    def _retire_dead(self, zmq, pub, records: list[LoaderRecord], now: float) -> None:
        """Loaders created anew each epoch would otherwise pile up as sources reported forever."""
        for record in records:
            if not record.alive():
                if record.retired_since is None:
                    record.retired_since = now
                elif now - record.retired_since >= RETIRE_AFTER_S:
                    sent_at = time.time()
                    self._send(zmq, pub, record.report(time.perf_counter_ns(), sent_at, None))
                    self._send(zmq, pub, record.goodbye(sent_at))
                    with self._records_lock:
                        if record in self.records and record.retired_since is not None:
                            self.records.remove(record)
            else:
                record.retired_since = None

    def _start(self) -> None:
        if self._thread is not None:
            return
        if self.requested_endpoint is not None:
            try:
                endpoint = endpoints.parse_listen(self.requested_endpoint)
            except endpoints.EndpointError as exc:
                origin = "instrument(endpoint=...)" if self._endpoint_given else \
                    environment.LOADERTOP_ENDPOINT
                self.failed = f"{origin}: {exc}"
                self.worker_endpoint = None
                warn_once(f"{self.failed}; training continues unobserved")
                return
            self.endpoint = str(endpoint)
            self._ipv6 = endpoint.is_ipv6
        try:
            discovery.ensure_private_dir(self.directory)
        except OSError as exc:
            self.failed = f"cannot use {self.directory}: {exc}"
            self.worker_endpoint = None
            warn_once(f"{self.failed}; training continues unobserved")
            return
        # Everything the thread will import is imported here, on the caller's thread: a fork
        # (DataLoader workers) while another thread holds an import lock deadlocks the child
        # at its next import of that module (seen with `import zmq` in a forked worker).
        import zmq  # noqa: F401

        from loadertop import remote

        try:
            self._curve = remote.curve_server_from_env()  # imports zmq.auth here, see above
        except remote.CurveConfigError as exc:  # never fall back to plaintext
            self.failed = str(exc)
            self.worker_endpoint = None
            warn_once(f"{self.failed}; training continues unobserved")
            return
        try:
            from loadertop.probe.system_feed import SystemFeed

            self._system = SystemFeed(self.host)
            self._system.report()  # primes the rates; NVML's dlopen happens here, not in the thread
        except Exception:
            self._system = None
        self._thread = threading.Thread(target=self._run, name="loadertop-publisher", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        _install_sigterm_cleanup()

    def close(self, timeout: float = 1.0) -> None:
        """At exit: say goodbye, remove the discovery entry. Bounded by `timeout` seconds."""
        if self.pid != os.getpid():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._remove_files()

    def _remove_files(self) -> None:
        if self.pid != os.getpid():
            return
        paths = [self.entry_path]
        for ep in (self.endpoint, self.worker_endpoint):
            if ep and ep.startswith("ipc://") and ep.startswith(f"ipc://{self.directory}/"):
                paths.append(ep[len("ipc://"):])
        for path in paths:
            if path:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    # ------------------------------------------------------------ publisher thread
    def _run(self) -> None:
        try:
            import zmq
        except ImportError as exc:  # pragma: no cover - a hard dependency
            self.failed = str(exc)
            return
        ctx = zmq.Context()  # our own, never the global instance the user may also use
        pub = pull = auth = None
        try:
            pub = ctx.socket(zmq.XPUB)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscribe, not only the first
            pub.setsockopt(zmq.SNDHWM, SNDHWM)
            pub.setsockopt(zmq.LINGER, 0)
            if self._ipv6:
                pub.setsockopt(zmq.IPV6, 1)
            if self._curve is not None:
                from loadertop import remote

                auth = remote.start_curve_server(ctx, pub, self._curve)
            try:
                pub.bind(self.endpoint)
            except zmq.ZMQError as exc:
                self.failed = f"cannot listen on {self.endpoint}: {exc}"
                warn_once(f"{self.failed}; training continues unobserved")
                return
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT) or self.endpoint
            if not endpoints.is_loopback(self.endpoint):
                print(f"loadertop: publishing loader figures on {self.endpoint}, reachable beyond "
                      f"this machine", file=sys.stderr, flush=True)
            pull = ctx.socket(zmq.PULL)
            pull.setsockopt(zmq.RCVHWM, 10000)
            pull.setsockopt(zmq.LINGER, 0)
            try:
                pull.bind(self.worker_endpoint)
            except zmq.ZMQError:
                pull.close()
                pull = None
                self.worker_endpoint = None
            try:
                self.entry_path = discovery.write_entry(
                    self.directory, pid=self.pid, endpoint=self.endpoint, command=self.command,
                    started_at=self.started_at, rank=self.rank)
            except OSError as exc:
                warn_once(f"cannot write the discovery entry in {self.directory}: {exc}")
            self._ready.set()
            self._loop(zmq, pub, pull)
        except Exception as exc:  # the shim degrades silently: training must go on
            self.failed = f"publisher stopped: {exc!r}"
            warn_once(self.failed)
        finally:
            self._ready.set()
            self._goodbye(zmq, pub)
            for sock in (pub, pull):
                if sock is not None:
                    sock.close(linger=CLOSE_LINGER_MS if sock is pub else 0)
            if auth is not None:
                auth.stop()
            ctx.term()
            self._remove_files()

    def _loop(self, zmq, pub, pull) -> None:
        poller = zmq.Poller()
        poller.register(pub, zmq.POLLIN)
        if pull is not None:
            poller.register(pull, zmq.POLLIN)
        clock = time.perf_counter
        next_sample = next_report = next_slow = clock()
        cpu_mark, wall_mark = time.thread_time(), clock()
        probe_cpu = None
        sampling = False
        while not self._stop.is_set():
            # Wake for the next due job: queue samples only while a loader with workers is being
            # iterated (nothing to sample otherwise), reports and the 1 Hz work always. Rounded
            # up: zmq truncates a timeout to whole ms, and a 0 would spin until the deadline.
            due = min(next_report, next_slow, next_sample if sampling else next_report)
            timeout_ms = max(0, math.ceil((due - clock()) * 1000))
            for sock, _ in poller.poll(timeout_ms):
                if sock is pub:
                    self._read_subscriptions(zmq, pub)
                else:
                    self._read_worker_samples(zmq, pull)
            now = clock()
            with self._records_lock:
                records = list(self.records)
            sampling = any(record.has_queue() for record in records)
            if sampling and now >= next_sample:
                next_sample = max(next_sample + SAMPLE_S, now)
                for record in records:
                    record.sample_queue()
            if now >= next_slow:
                next_slow = now + SLOW_S
                for record in records:
                    record.sample_workers()
                self._retire_dead(zmq, pub, records, now)
                self._send_system(zmq, pub)
                cpu, wall = time.thread_time(), clock()
                if wall - wall_mark >= SLOW_S / 2:  # the first tick comes at once: no figure yet
                    probe_cpu = (cpu - cpu_mark) / (wall - wall_mark)
                    cpu_mark, wall_mark = cpu, wall
            if now >= next_report or self._send_now:
                self._send_now = False
                next_report = now + REPORT_S
                now_ns, sent_at = time.perf_counter_ns(), time.time()
                for record in records:
                    self._send(zmq, pub, record.report(now_ns, sent_at, probe_cpu))

    def _send(self, zmq, pub, msg) -> None:
        try:
            pub.send(wire.encode(msg), zmq.NOBLOCK)
        except zmq.Again:  # PUB drops at HWM by itself; this is only defensive
            pass

    def _read_subscriptions(self, zmq, pub) -> None:
        while True:
            try:
                msg = pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":  # a viewer subscribed: answer at once, not in <= REPORT_S
                self._send_now = True
                self.subscriptions += 1
            elif msg[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)

    def _read_worker_samples(self, zmq, pull) -> None:
        by_source = {r.source: r for r in self.records}
        for _ in range(10000):
            try:
                data = pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                sample = wire.decode_sample(data)
            except wire.WireError:
                continue
            record = by_source.get(sample.source)
            if record is not None:
                record.add_worker_sample(sample)

    def _send_system(self, zmq, pub) -> None:
        """The machine's figures travel from the trainer's side (issue: remote viewers)."""
        if self._system is None:
            return
        try:
            msg = self._system.report()
        except Exception:
            return
        if msg is not None:
            self._send(zmq, pub, msg)

    def _goodbye(self, zmq, pub) -> None:
        if pub is None or not self._ready.is_set() or self.failed:
            return
        sent_at = time.time()
        for record in list(self.records):
            try:
                self._send(zmq, pub, record.report(time.perf_counter_ns(), sent_at, None))
                self._send(zmq, pub, record.goodbye(sent_at))
            except Exception:
                pass


def _on_sigterm(signum, frame) -> None:
    """SIGTERM's default kills without atexit: remove our files, then die as SIGTERM would."""
    pub = _publisher
    if pub is not None and pub.pid == os.getpid():
        pub._remove_files()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_cleanup() -> None:
    # Only where nobody else handles SIGTERM (never override the user's or a framework's), and
    # only from the main thread (signal.signal raises elsewhere).
    try:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        pass

