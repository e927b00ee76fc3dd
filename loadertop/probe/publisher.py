"""The one background thread per training process that owns all sockets.

It drains the loaders' records, samples queue depth (only while a loader with workers is iterated
and a viewer is subscribed), worker liveness/CPU/RSS (1 Hz) and the machine (1 Hz, while a viewer
is subscribed), reads the workers' fetch samples (`probe/inbox.py`), and publishes a report per
loader every REPORT_S on an XPUB socket. XPUB lets it see a viewer subscribe and answer with a
report at once, so a late joiner needs no wait. Sends are NOBLOCK onto a bounded HWM: a slow,
frozen or dead viewer costs dropped messages (visible as sequence gaps), never a blocked loop.

What the thread costs is mostly its wake-ups: each one costs this thread CPU however little it
does (timer, scheduler, GIL, cold caches; docs/performance.md gives the figure and the goal). So
all periodic work sits on one grid (every SLOW_S tick is a REPORT_S tick
is a sample tick); queues are sampled in proportion to the batch rate; the workers' samples are
read in bulk before each report instead of waking the thread once per batch; and the only
wake-up off the grid is a viewer subscribing.

Queue samples are taken only while a viewer is subscribed (a socket, or the in-process reader of
`loadertop.metrics()` and the notebook's panel: `add_reader`), and the machine's figures every
SLOW_S only then: they go into reports nobody else reads. A report covers REPORT_S, and the
viewer's window 3 s, so from its first refresh on a new viewer sees the same figures as if they had
been taken all along. The black box (probe/blackbox.py, docs/contract.md §9) is the exception: it
records every report, so with it on the thread takes, with no viewer, what the findings need
(worker liveness, RSS, USS at its CPU share, hang stacks) and the machine's figures every
BLACKBOX_SYSTEM_S.

Longer than this package's other modules (~600 lines) on purpose: the thread's loop is one
schedule, and its pieces (the grid, the due ticks, what each tick samples) read together; the
timetable's arithmetic is in cadence.py and the black box's writing in blackbox.py.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from loadertop import discovery, endpoints, environment, wire
from loadertop.probe import torch_internals
from loadertop.probe.cadence import (
    CONTESTED_READY_SHARE,
    REPORT_S,
    SAMPLES_PER_REPORT,
    SLOW_S,
    count_waiting,
    next_tick,
    samples_per_report,
)
from loadertop.probe.identity import process_identity
from loadertop.probe.inbox import WorkerInbox
from loadertop.probe.record import LoaderRecord
from loadertop.probe.resources import RESOURCE_S, USS_CPU_SHARE_RECORDED, ResourceSampler


class Reader(Protocol):
    """What `Publisher.add_reader` takes: called on the publisher thread only."""

    def add(self, frame: bytes) -> None: ...  # a frame as sent (wire.encode's bytes)

    def refresh(self) -> None: ...


if TYPE_CHECKING:
    from types import FrameType, ModuleType

    from zmq import Socket as _ZmqSocket

    from loadertop.probe.blackbox import BlackBox
    from loadertop.probe.system_feed import SystemFeed
    from loadertop.remote import CurveServer

    Socket = _ZmqSocket[bytes]  # the XPUB socket

# On a subscription the system sampler is read at once to start its rates (its figures are
# deltas between two readings); the first figures go out at a 1 Hz tick at least this long after.
SYSTEM_MIN_GAP_S = 0.2
RETIRE_AFTER_S = 10.0  # a loader garbage-collected this long ago says goodbye and stops reporting
SNDHWM = 1000
BLACKBOX_SYSTEM_S = 10.0  # the machine's figures for the black box alone (a viewer: every SLOW_S)
# The black box loads psutil and the machine's sampler (see _loading) this long after the thread
# starts, not at once: a program's first loader forks its workers right after the probe starts,
# and a fork waits while they load.
BLACKBOX_TOOLS_AFTER_S = 3.0
WORKER_RCVHWM = 10000  # workers' samples read at most at once: this many per REPORT_S
REUSE_WAIT_S = 0.05  # how long a loader re-made under a dropped one's name waits for it to go
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


# What only a viewer needs (psutil for the workers' CPU and memory and for the slow readings, the
# machine's sampler, NVML's dlopen) is loaded by the publisher thread when the first viewer
# subscribes: a program nobody watches never pays for it (psutil and the system sampler were a
# good part of the probe's start at a first loader: docs/performance.md). An import or a dlopen on a
# thread while another thread forks leaves its lock held in the child, which then deadlocks at
# its own import of that module (seen with `import zmq` in a forked DataLoader worker); so a
# fork waits, in os.register_at_fork's `before`, until that loading is done (at most once per
# process, for as long as that loading takes, and only if a fork comes exactly then).
_loading = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_loading.acquire, after_in_parent=_loading.release,
                        after_in_child=_loading.release)


def get_publisher(endpoint: str | None = None, *, directory: str | None = None,
                  sigterm_cleanup: bool = True, how: str | None = None) -> Publisher:
    """The process's publisher, created on first use (and again in a forked child); `endpoint`,
    `directory`, `sigterm_cleanup` and `how` only matter to the call that creates it (`loadertop
    attach` passes the attaching side's discovery directory, leaves the target's SIGTERM alone,
    and says "attach" in the black box's meta)."""
    global _publisher
    with _lock:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher(endpoint, directory=directory, sigterm_cleanup=sigterm_cleanup,
                                   how=how)
        return _publisher


def forget_publisher(publisher: Publisher) -> None:
    """`loadertop attach --detach`: the next get_publisher() makes a new one (after close())."""
    global _publisher
    with _lock:
        if _publisher is publisher:
            _publisher = None


class Publisher:
    def __init__(self, endpoint: str | None = None, *, directory: str | None = None,
                 sigterm_cleanup: bool = True, how: str | None = None) -> None:
        self.pid = os.getpid()
        self.host = socket.gethostname()
        self.rank = environment.rank()
        self.started_at, command = process_identity()
        self.command = command[:wire.MAX_TEXT]
        self.records: list[LoaderRecord] = []
        self._names: set[str] = set()
        self._by_name: dict[str, LoaderRecord] = {}  # the latest record given each name
        self._records_lock = threading.Lock()
        self.directory = Path(directory) if directory else discovery.discovery_dir()
        self._sigterm_cleanup = sigterm_cleanup
        # Given: instrument(endpoint=) or LOADERTOP_ENDPOINT, checked when the publisher starts.
        self.requested_endpoint = endpoint or environment.endpoint()
        self._endpoint_given = bool(endpoint)
        self._ipv6 = False  # an IPv6 address to listen on: ZeroMQ needs the IPV6 option for it
        self.endpoint = self.requested_endpoint or f"ipc://{self.directory}/{self.pid}.sock"
        # The workers' samples: a SOCK_SEQPACKET socket's path (probe/inbox.py), not ZeroMQ.
        self.worker_endpoint: str | None = f"{self.directory}/{self.pid}-workers.sock"
        self.entry_path: Path | None = None
        self.failed: str | None = None
        self.subscriptions = 0  # subscriptions held now (XPUB_VERBOSE/VERBOSER report each)
        self._stop = threading.Event()
        # A pipe the thread's poll also waits on, so that close() wakes it at once: it sleeps up
        # to REPORT_S in zmq's poll, which a threading.Event cannot interrupt, and at exit that
        # wait was on average half of it (docs/performance.md: close() at the end of a job).
        self._wake: tuple[int, int] | None = None
        self._ready = threading.Event()
        self._send_now = False
        self._thread: threading.Thread | None = None
        self._system: SystemFeed | None = None  # once a viewer subscribed
        self._curve: CurveServer | None = None  # when LOADERTOP_CURVE_SECRET is set
        self._resources = ResourceSampler()
        self._viewer_tools = False  # psutil and the machine's sampler loaded (see _loading)
        self.stack_dir: str | None = None  # set at start when the directory can be made
        # The black box (probe/blackbox.py): this process's own recording, started with the thread.
        self.how = how or ("run" if environment.run_hook_enabled() else "instrument")
        self.blackbox: BlackBox | None = None
        # An in-process reader of what is published (`loadertop.metrics()` and the notebook's
        # panel: the integrations' viewer, docs/contract.md §11-12), set once by `add_reader`;
        # it counts as a viewer.
        self.reader: Reader | None = None

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

    def register(self, loader: Any, name: str) -> LoaderRecord:
        record = LoaderRecord(
            loader, name=name, source=f"{self.host}:{self.pid}:{name}", host=self.host,
            rank=self.rank, command=self.command, process_started_at=self.started_at,
        )
        with self._records_lock:
            self.records.append(record)
            self._by_name[name] = record
        self.start()
        record.stack_dir = self.stack_dir
        return record

    def reuse_named(self, loader: Any, name: str) -> LoaderRecord | None:
        """The record of a loader named `name` that has died (garbage-collected, no iterator
        left), handed to `loader`: a loader re-created each epoch (or with another num_workers)
        under the same name stays one source, whose earlier settings the viewer keeps — as
        `run` does for a loader re-created at the same call site. None when there is none."""
        with self._records_lock:
            record = self._by_name.get(name)
        if record is None:
            return None
        if record.alive() and record.loader_dropped():
            # The program dropped the loader, but its iterator lives on for a moment: this
            # thread's reference went, the publisher thread may still hold one (it reads the
            # queue through it) and then runs the iterator's shutdown, during which the weakref
            # stays set. Give it up to REUSE_WAIT_S, sleeping so it gets the GIL.
            deadline = time.monotonic() + REUSE_WAIT_S
            while record.alive() and time.monotonic() < deadline:
                time.sleep(0.001)
        if record.alive():
            return None
        record._loader_ref = weakref.ref(loader)
        self.ensure_registered(record)
        return record

    def ensure_registered(self, record: LoaderRecord) -> None:
        """Report `record` again (a retired one reused for a new loader, see autoinstrument)."""
        with self._records_lock:
            record.retired_since = None
            if record not in self.records:
                self.records.append(record)

    def _retire_dead(self, zmq: ModuleType, pub: Socket, records: list[LoaderRecord],
                     now: float) -> None:
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

    def start(self) -> None:
        """Bind, write the discovery entry and start the thread; once (later calls return)."""
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
        try:  # workers' faulthandler stacks (probe/stacks.py): private, like the directory
            stack_dir = self.directory / f"{self.pid}-stacks"
            stack_dir.mkdir(mode=0o700, exist_ok=True)
            self.stack_dir = str(stack_dir)
        except OSError:
            self.stack_dir = None
        # Everything the thread will import is imported here, on the caller's thread: a fork
        # (DataLoader workers) while another thread holds an import lock deadlocks the child
        # at its next import of that module (seen with `import zmq` in a forked worker).
        # (What only a viewer needs is the exception: see _loading.)
        import zmq  # noqa: F401

        if os.environ.get(environment.LOADERTOP_CURVE_SECRET) or \
                os.environ.get(environment.LOADERTOP_AUTHORIZED_KEYS):
            from loadertop import remote

            try:
                self._curve = remote.curve_server_from_env()  # imports zmq.auth here, see above
            except remote.CurveConfigError as exc:  # never fall back to plaintext
                self.failed = str(exc)
                self.worker_endpoint = None
                warn_once(f"{self.failed}; training continues unobserved")
                return
        try:
            self._wake = os.pipe()  # non-inheritable: a spawned worker never holds it
        except OSError:
            self._wake = None  # out of fds: close() then waits for the poll's timeout
        # Before atexit.register(self.close): the black box's own exit handler then runs after
        # this one (atexit runs them last in, first out), once the goodbyes are in its queue.
        self._start_blackbox()
        self._thread = threading.Thread(target=self._run, name="loadertop-publisher", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        if self._sigterm_cleanup:
            _install_sigterm_cleanup()

    def _start_blackbox(self) -> None:
        from loadertop import statedir

        if not statedir.blackbox_enabled():
            return  # nothing more imported: LOADERTOP_BLACKBOX=0 leaves the probe as it was
        try:
            from loadertop.probe import blackbox

            self.blackbox = blackbox.start(pid=self.pid, started_at=self.started_at, how=self.how,
                                           warn=warn_once)
            # USS more often than a viewer alone needs: the trends are read back later (§9).
            self._resources.set_cpu_share(USS_CPU_SHARE_RECORDED)
        except Exception as exc:  # the shim degrades silently: training must go on
            self.blackbox = None
            warn_once(f"the black box is off: {exc!r}")

    def close(self, timeout: float = 1.0) -> None:
        """At exit: say goodbye, remove the discovery entry. Bounded by `timeout` seconds."""
        if self.pid != os.getpid():
            return
        self._stop.set()
        wake, self._wake = self._wake, None
        if wake is not None:
            try:
                os.write(wake[1], b"\0")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if wake is not None and (self._thread is None or not self._thread.is_alive()):
            for fd in wake:
                os.close(fd)
        self._remove_files()

    def _remove_files(self) -> None:
        if self.pid != os.getpid():
            return
        paths: list[str | Path | None] = [self.entry_path]
        if self.endpoint and self.endpoint.startswith(f"ipc://{self.directory}/"):
            paths.append(self.endpoint[len("ipc://"):])
        if self.worker_endpoint and self.worker_endpoint.startswith(f"{self.directory}/"):
            paths.append(self.worker_endpoint)
        for path in paths:
            if path:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        if self.stack_dir:
            try:
                for name in os.listdir(self.stack_dir):
                    os.unlink(os.path.join(self.stack_dir, name))
                os.rmdir(self.stack_dir)
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
        pub = inbox = auth = None
        try:
            pub = ctx.socket(zmq.XPUB)
            pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscribe, not only the first
            try:  # ... and every unsubscribe (a viewer leaving), so the count of viewers is exact
                pub.setsockopt(zmq.XPUB_VERBOSER, 1)
            except (AttributeError, zmq.ZMQError):
                pass  # an old libzmq: the count may stay above 0 (then sampling goes on: harmless)
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
            if self.blackbox is not None:
                self.blackbox.endpoint = self.endpoint
            if not endpoints.is_loopback(self.endpoint):
                print(f"loadertop: publishing loader figures on {self.endpoint}, reachable beyond "
                      f"this machine", file=sys.stderr, flush=True)
            try:
                # Set: start() returns before this thread is started wherever it is None.
                inbox = WorkerInbox(self.worker_endpoint)  # type: ignore[arg-type]
            except OSError:
                inbox = None
                self.worker_endpoint = None
            try:
                self.entry_path = discovery.write_entry(
                    self.directory, pid=self.pid, endpoint=self.endpoint, command=self.command,
                    started_at=self.started_at, rank=self.rank)
            except OSError as exc:
                warn_once(f"cannot write the discovery entry in {self.directory}: {exc}")
            self._ready.set()
            self._loop(zmq, pub, inbox)
        except Exception as exc:  # the shim degrades silently: training must go on
            self.failed = f"publisher stopped: {exc!r}"
            warn_once(self.failed)
        finally:
            self._ready.set()
            self._goodbye(zmq, pub, inbox)
            if pub is not None:
                pub.close(linger=CLOSE_LINGER_MS)
            if inbox is not None:
                inbox.close()
            if auth is not None:
                auth.stop()
            ctx.term()
            self._remove_files()

    def _loop(self, zmq: ModuleType, pub: Socket, inbox: WorkerInbox | None) -> None:
        # Only the XPUB is polled (a viewer subscribing is answered at once). The workers' inbox
        # is read before each report instead: polling it woke this thread once per batch of every
        # multi-worker loader, at a wake-up's cost each (docs/performance.md).
        poller = zmq.Poller()
        poller.register(pub, zmq.POLLIN)
        if self._wake is not None:
            poller.register(self._wake[0], zmq.POLLIN)  # close() writes to it: see __init__
        clock = time.perf_counter_ns
        report_ns = max(1, round(REPORT_S * 1e9 / 12)) * 12  # so that REPORT_S / k is exact
        slow_ns = max(1, round(SLOW_S / REPORT_S)) * report_ns
        system_gap_ns = round(SYSTEM_MIN_GAP_S * 1e9)
        recorded_system_ns = round(BLACKBOX_SYSTEM_S * 1e9)
        tools_after_ns = round(BLACKBOX_TOOLS_AFTER_S * 1e9)
        sample_ns = report_ns
        origin = clock()
        next_sample = next_report = next_slow = next_resources = origin  # the first tick: at once
        waiting = [0, 0]  # this second's samples taken inside next(), and those with >= 2 ready
        system_at: int | None = None  # the system sampler's last reading (its rates start there)
        totals: dict[int, int] = {}  # id(record) -> batches_total at the last 1 Hz tick
        last_slow_tick = origin
        cpu_mark, wall_mark = time.thread_time(), time.perf_counter()
        probe_cpu = None
        sampling = False
        while not self._stop.is_set():
            # Wake for the next due job: queue samples only while they are taken (see
            # `sampling`), reports and the 1 Hz work always. Rounded up: zmq truncates a timeout
            # to whole ms, and a 0 would spin until the deadline.
            due = min(next_report, next_sample) if sampling else next_report
            timeout_ms = max(0, -((clock() - due) // 1_000_000))
            if poller.poll(timeout_ms):
                self._read_subscriptions(zmq, pub)
            now = clock()
            sample_due = now >= next_sample
            report_due = now >= next_report
            if not (sample_due or report_due or self._send_now):
                continue  # woken early (a timeout rounded), or by an unsubscription
            with self._records_lock:
                records = list(self.records)
            reader = self.reader
            watched = self.subscriptions > 0 or reader is not None
            # The black box takes, with no viewer, what the findings need (worker liveness, CPU,
            # RSS, USS at its CPU share, hang stacks), and the machine's figures every
            # BLACKBOX_SYSTEM_S; queue samples stay a viewer's (no finding rests on them).
            box = self.blackbox
            recording = box is not None and box.on
            if not self._viewer_tools and (watched or (recording and now - origin >= tools_after_ns)):
                self._load_viewer_tools()
            sampling = watched and any(record.has_queue() for record in records)
            if sample_due:
                next_sample = next_tick(origin, sample_ns, now)
                if sampling:
                    for record in records:
                        record.sample_queue()
                        count_waiting(record, waiting)
            slow_due = now >= next_slow
            if slow_due:
                next_slow = next_tick(origin, slow_ns, now)
                for record in records:
                    record.sample_workers()
                if (watched or recording) and self._viewer_tools and now >= next_resources:
                    # The slow readings (USS/PSS, the costly part; fds, threads): every
                    # RESOURCE_S, for a viewer or the black box, on this thread, never the training one.
                    # on the 1 s grid: the tick at RESOURCE_S from now, not the one after it
                    next_resources = now + round(RESOURCE_S * 1e9) - slow_ns // 2
                    for record in records:
                        record.pending_resources = self._resources.sample(record.worker_pid_pairs())
                self._retire_dead(zmq, pub, records, now / 1e9)
                per_report = samples_per_report(records, totals, now - last_slow_tick)
                if waiting[1] and waiting[1] >= CONTESTED_READY_SHARE * waiting[0]:
                    per_report = SAMPLES_PER_REPORT[-1]
                sample_ns = report_ns // per_report
                last_slow_tick = now
                waiting[:] = [0, 0]
                cpu, wall = time.thread_time(), time.perf_counter()
                if wall - wall_mark >= SLOW_S / 2:  # the first tick comes at once: no figure yet
                    probe_cpu = (cpu - cpu_mark) / (wall - wall_mark)
                    cpu_mark, wall_mark = cpu, wall
            if self._system is not None:
                gap = system_gap_ns if watched else recorded_system_ns
                if not (watched or recording):
                    system_at = None  # nobody to send the machine's figures to: read nothing
                elif system_at is None or now - system_at > 2 * max(gap, slow_ns):
                    self._sample_system()  # starts the rates; these figures are not sent
                    system_at = now
                elif slow_due and now - system_at >= gap:
                    self._send_system(zmq, pub)
                    system_at = now
            if report_due or self._send_now:
                self._send_now = False
                if inbox is not None and any(r.config.num_workers for r in records):
                    # Only reports use the workers' samples: read just before, in bulk.
                    self._read_worker_samples(inbox)
                if report_due:
                    next_report = next_tick(origin, report_ns, now)
                now_ns, sent_at = time.perf_counter_ns(), time.time()
                for record in records:
                    self._send(zmq, pub, record.report(now_ns, sent_at, probe_cpu,
                                                       watched or recording))
            if slow_due and reader is not None:
                try:
                    reader.refresh()
                except Exception as exc:
                    self._drop_reader(exc)

    def _send(self, zmq: ModuleType, pub: Socket, msg: wire.Message) -> None:
        frame = wire.encode(msg)
        try:
            pub.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # PUB drops at HWM by itself; this is only defensive
            pass
        box = self.blackbox
        if box is not None:
            box.add(frame, msg)  # a deque append: the black box's thread writes it
        reader = self.reader
        if reader is not None:
            try:
                reader.add(frame)
            except Exception as exc:  # the reader's failure is its own: publishing goes on
                self._drop_reader(exc)

    def add_reader(self, reader: Reader) -> bool:
        """Hand `reader` every frame published from now on, and call its `refresh()` every
        SLOW_S (a viewer's default refresh), on this thread; meanwhile the thread samples what a
        viewer gets (queues, the machine). False if one is set, or the thread is not running."""
        if self.reader is not None or self.failed or self._thread is None:
            return False
        self.reader = reader
        self._send_now = True  # its first figures at the next wake-up, not in <= REPORT_S
        return True

    def _drop_reader(self, exc: Exception) -> None:
        self.reader = None
        warn_once(f"loadertop.metrics() stopped: {exc!r}")

    def _read_subscriptions(self, zmq: ModuleType, pub: Socket) -> None:
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

    def _read_worker_samples(self, inbox: WorkerInbox) -> None:
        by_source = {r.source: r for r in self.records}
        for data in inbox.read(WORKER_RCVHWM):
            try:
                sample = wire.decode_sample(data)
            except wire.WireError:
                continue
            record = by_source.get(sample.source)
            if record is None:
                continue
            if isinstance(sample, wire.WorkerStart):
                record.add_worker_start(sample)
            else:
                record.add_worker_sample(sample)

    def _load_viewer_tools(self) -> None:
        """On this thread, at the first subscription: psutil and the machine's sampler (whose
        first reading starts its rates and dlopens NVML), with forks held off (see _loading)."""
        self._viewer_tools = True
        with _loading:
            try:
                import psutil

                from loadertop.probe import resources
                from loadertop.probe.system_feed import SystemFeed
            except Exception:  # pragma: no cover - hard dependencies
                return
            resources.use_psutil(psutil)  # worker_resources.py's figures read it there too
            try:
                self._system = SystemFeed(self.host)
                self._system.report()
            except Exception:
                self._system = None

    def _sample_system(self) -> wire.SystemReport | None:
        system = self._system
        if system is None:
            return None
        try:
            return system.report()
        except Exception:
            return None

    def _send_system(self, zmq: ModuleType, pub: Socket) -> None:
        """The machine's figures travel from the trainer's side (issue: remote viewers)."""
        if self._system is None:
            return
        msg = self._sample_system()
        if msg is not None:
            self._send(zmq, pub, msg)

    def _goodbye(self, zmq: ModuleType, pub: Socket | None,
                 inbox: WorkerInbox | None = None) -> None:
        if pub is None or not self._ready.is_set() or self.failed:
            return
        if inbox is not None:
            try:
                self._read_worker_samples(inbox)  # the last ones, into the final reports
            except Exception:
                pass
        sent_at = time.time()
        failure = torch_internals.uncaught_worker_failure()
        for record in list(self.records):
            try:
                # How the workers ended, read now: a worker the OOM killer took a moment ago is
                # what made the loop crash, and the last 1 Hz reading still shows it alive.
                record.sample_workers()
                # The program dies of torch's report of this loader's worker, raised outside
                # next() (torch's SIGCHLD handler, mid-step): the loop crashed of it all the same.
                if failure is not None and record.error is None and record.had_worker(failure[1]):
                    record.note_error(failure[0])
                self._send(zmq, pub, record.report(time.perf_counter_ns(), sent_at, None))
                self._send(zmq, pub, record.goodbye(sent_at))
            except Exception:
                pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's default kills without atexit: remove our files, then die as SIGTERM would."""
    pub = _publisher
    if pub is not None and pub.pid == os.getpid():
        pub._remove_files()
        if pub.blackbox is not None:  # how the run ended, said before it dies
            from loadertop import statedir
            from loadertop.probe import blackbox

            pub.blackbox.finish(statedir.Ended(kind="signal", at=time.time(), signal="SIGTERM"),
                                wait_s=blackbox.SIGNAL_WAIT_S)
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

