"""The viewer's network side: SUB sockets to discovered or given endpoints, feeding a Model.

Every frame is validated by `wire.decode`; a bad one is counted by reason and dropped. `poll()`
never blocks longer than asked, so a timer in the TUI or a loop in `snapshot` can drive it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import zmq

from loadertop import discovery, wire
from loadertop.client.document import Document
from loadertop.client.ending import Ending
from loadertop.client.model import Model
from loadertop.endpoints import is_ipv6

RCVHWM = 10000
RESCAN_S = 1.0  # how often the discovery directory is looked at for new processes
# ... and how often while no process is connected yet: a viewer started before the job (a script
# or CI starting both at once; `snapshot --seconds 4`) connects within 0.1 s of its registering,
# not up to 1 s later. A look at a directory with no live entry is cheap enough to make at 10 Hz
# (docs/performance.md).
EMPTY_RESCAN_S = 0.1
MAX_FRAMES_PER_POLL = 5000  # bound one poll's work so the UI stays responsive under a flood



class Recorder(Protocol):
    """Where the valid frames go as they came (`recording.file.RecordingWriter`): declared here so
    the client does not import the recording package that is one of its clients."""

    def add(self, frame: bytes, received_at: float, endpoint: str | None = None) -> bool: ...

    def flush_if_due(self) -> None: ...

class History(Protocol):
    """What a job's black box tells a viewer (docs/contract.md §9), read by the commands
    (`recording.blackbox`): declared here so the client does not import the recording package."""

    def frames(self, pid: int, host: str, source: str, before: float) -> list[tuple[float, bytes]]:
        """The recorded frames of `source` (and its machine's) received before `before`, oldest
        first; empty without a black box."""
        ...

    def death(self, pid: int, host: str) -> Ending | None:
        """None while `pid` runs (or cannot be judged from here), else how it ended (for a
        process that fell silent: without a black box, a death with no cause known)."""
        ...

    def ended(self, pid: int, host: str) -> Ending | None:
        """How `pid`'s job ended as its black box tells (what its goodbye could not say: a
        signal, its launcher's exit code); None while it runs, or with no black box to tell."""
        ...


#: A source silent this long (reports come every 0.25 s) has its process looked at ...
SILENT_S = 0.75
#: ... at most this often: "a viewer watching a trainer that dies says so at once".
DEATH_CHECK_S = 1.0
#: A source that said goodbye has its job's recorded end asked for this long after: a process
#: exits within a second or two of its goodbyes (docs/blackbox.md: its black box waits at most
#: 1 s), and a loader retired while its process goes on is not the job's end.
ENDED_ASK_S = 10.0


class Subscriber:
    def __init__(self, model: Model, endpoints: list[str] | None = None, *,
                 directory: Path | None = None, discover: bool | None = None,
                 curve: dict[int, bytes] | None = None,
                 clock: Callable[[], float] = time.time, drop_vanished: bool = False,
                 history: History | None = None) -> None:
        self.model = model
        # A source first seen starts from its black box's history (memory trends, findings),
        # and a source that falls silent has its process looked at (docs/contract.md §9).
        self.history = history
        self._pids: dict[str, tuple[int, str]] = {}  # discovered endpoint -> (pid, host)
        self._death_checked: dict[str, float] = {}  # source -> when its process was last looked at
        # Disconnect a discovered endpoint once its process left the discovery directory (or
        # died without removing its entry): a long-running viewer such as `loadertop export`
        # would otherwise keep a socket reconnecting to every job the machine ever ran. What
        # the model knows of its sources stays until the model forgets them.
        self.drop_vanished = drop_vanished
        self._discovered: set[str] = set()
        self.curve = curve or {}  # CurveZMQ socket options (see loadertop.remote)
        self.clock = clock
        self.directory = directory or discovery.discovery_dir()
        self.discover = (not endpoints) if discover is None else discover
        self.ctx = zmq.Context()
        self.poller = zmq.Poller()
        self.sockets: dict[str, zmq.Socket[bytes]] = {}
        self.by_socket: dict[zmq.Socket[bytes], str] = {}
        self._next_scan = 0.0
        self._entries = discovery.EntryCache(self.directory)
        self.recorder: Recorder | None = None  # set by `record` and `--record`
        if self.discover:
            model.discovery_dir = str(self.directory)
        for endpoint in endpoints or ():
            self.connect(endpoint)
        self.rescan()

    def connect(self, endpoint: str) -> None:
        if endpoint in self.sockets:
            return
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.LINGER, 0)
        if is_ipv6(endpoint):  # ZeroMQ connects to an IPv6 address only with this option
            sock.setsockopt(zmq.IPV6, 1)
        for option, value in self.curve.items():
            sock.setsockopt(option, value)
        sock.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)  # all versions: a foreign one is counted
        sock.connect(endpoint)
        self.sockets[endpoint] = sock
        self.by_socket[sock] = endpoint
        self.poller.register(sock, zmq.POLLIN)
        self.model.add_endpoint(endpoint)

    def disconnect(self, endpoint: str) -> None:
        sock = self.sockets.pop(endpoint, None)
        if sock is not None:
            self.poller.unregister(sock)
            del self.by_socket[sock]
            sock.close(0)

    def rescan(self) -> None:
        """Connect to processes that appeared in the discovery directory since the last look."""
        if not self.discover:
            return
        entries = self._entries.entries()
        for entry in entries:
            self._pids[entry.endpoint] = (entry.pid, entry.host)
        listed = {entry.endpoint for entry in entries}
        for endpoint in sorted(listed):
            if endpoint not in self.sockets:
                self._discovered.add(endpoint)
                self.connect(endpoint)
        if self.drop_vanished:
            for endpoint in sorted(self._discovered - listed):
                self._discovered.discard(endpoint)
                self.disconnect(endpoint)
                self.model.endpoints.pop(endpoint, None)
        self._next_scan = time.monotonic() + (RESCAN_S if self.sockets else EMPTY_RESCAN_S)

    def found_any(self) -> bool:
        return bool(self.sockets)

    def poll(self, timeout_ms: float = 0) -> int:
        """Receive what has arrived (waiting up to timeout_ms for the first frame)."""
        if self.discover and time.monotonic() >= self._next_scan:
            self.rescan()
        count = 0
        if not self.sockets:
            if timeout_ms > 0:
                time.sleep(min(timeout_ms, 100) / 1000.0)
            return 0
        # pyzmq 27's Poller.poll takes a float timeout (it truncates it); its stub says int.
        events = self.poller.poll(timeout_ms)  # type: ignore[arg-type]
        # Every frame passes here (hundreds a second from a fleet): what the loop uses is looked
        # up once per poll, not once per frame (docs/performance.md, "The TUI watching many sources").
        model, clock, recorder, history = self.model, self.clock, self.recorder, self.history
        decode, ingest, sources, again = wire.decode, model.ingest, model.sources, zmq.Again
        while events and count < MAX_FRAMES_PER_POLL:
            for sock, _ in events:
                endpoint = self.by_socket.get(sock)
                recv = sock.recv
                for _ in range(1000):
                    try:
                        frame = recv(zmq.NOBLOCK, copy=True)
                    except again:
                        break
                    count += 1
                    try:
                        msg = decode(frame)
                    except wire.WireError as exc:
                        model.reject(exc.reason)
                        continue
                    now = clock()
                    seeded: str | None = None  # the source just started from its black box
                    if (history is not None and isinstance(msg, wire.LoaderReport)
                            and msg.source not in sources):
                        self._seed(msg, now)
                        seeded = msg.source
                    ingest(msg, now, endpoint)
                    if seeded is not None:  # the black box keeps a decimated history: its gaps are not losses
                        sources[seeded].missed = 0
                    if recorder is not None:  # the valid frame as it came: `loadertop record`
                        recorder.add(frame, now, endpoint)
            events = self.poller.poll(0)
        if self.recorder is not None:
            self.recorder.flush_if_due()
        if self.history is not None:
            self._check_deaths()
        return count

    def _seed(self, first: wire.LoaderReport, now: float) -> None:
        """Feed the model what the black box of `first`'s process holds of its source before now."""
        assert self.history is not None
        try:
            frames = self.history.frames(first.pid, first.host, first.source, now)
        except Exception:  # a history that cannot be read never stands in the way of live data
            return
        for received_at, frame in frames:
            try:
                msg = wire.decode(frame)
            except wire.WireError:
                continue
            if isinstance(msg, wire.LoaderReport) and msg.source != first.source:
                continue
            self.model.ingest(msg, received_at)

    def _check_deaths(self) -> None:
        """Mark the sources whose process died without a goodbye (SIGKILL leaves its socket and
        its discovery entry behind: only the process's absence tells), and tell those that said
        goodbye the end their process's black box records once it is gone (one end per job,
        docs/contract.md §9: a SIGTERM the program turned into an exit is not "finished")."""
        assert self.history is not None
        now, mono = self.clock(), time.monotonic()
        for state in list(self.model.sources.values()):
            last = state.last
            if (last is None or now - state.last_received < SILENT_S
                    or state.ending is not None
                    or (state.finished_at is not None and now - state.finished_at > ENDED_ASK_S)
                    or mono - self._death_checked.get(state.source, 0.0) < DEATH_CHECK_S):
                continue
            self._death_checked[state.source] = mono
            if state.finished_at is None:
                ending = self.history.death(last.pid, last.host)
            else:
                ending = self.history.ended(last.pid, last.host)
            if ending is not None:
                self.model.mark_ended(state.source, ending)

    def silent_deaths(self) -> list[str]:
        """For each discovered endpoint that never delivered: how its process ended, where it
        did (`snapshot`'s message instead of "is the trainer running?")."""
        if self.history is None:
            return []
        known = dict(self._pids)
        for endpoint in self.sockets:  # given ones: a pid's private socket names its process
            name = endpoint.rpartition("/")[2]
            if endpoint.startswith("ipc://") and name.endswith(".sock") and name[:-5].isdigit():
                known.setdefault(endpoint, (int(name[:-5]), socket.gethostname()))
        out = []
        for endpoint, (pid, host) in sorted(known.items()):
            if self.model.endpoints.get(endpoint) is None:
                ending = self.history.death(pid, host)
                if ending is not None:
                    out.append(ending.sentence(pid))
        return out

    def close(self) -> None:
        for endpoint in list(self.sockets):
            self.disconnect(endpoint)
        self.ctx.term()


class NetworkFeed:
    """The TUI's feed: a Subscriber and its Model behind the app's `Feed` protocol."""

    def __init__(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber
        self.model = subscriber.model

    def poll(self) -> None:
        self.subscriber.poll(0)

    def advance(self, now: float) -> Document:
        return self.model.advance(now)

    def close(self) -> None:
        self.subscriber.close()
