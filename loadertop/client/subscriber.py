"""The viewer's network side: SUB sockets to discovered or given endpoints, feeding a Model.

Every frame is validated by `wire.decode`; a bad one is counted by reason and dropped. `poll()`
never blocks longer than asked, so a timer in the TUI or a loop in `snapshot` can drive it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import zmq

from loadertop import discovery, wire
from loadertop.client.document import Document
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

class Subscriber:
    def __init__(self, model: Model, endpoints: list[str] | None = None, *,
                 directory: Path | None = None, discover: bool | None = None,
                 curve: dict[int, bytes] | None = None,
                 clock: Callable[[], float] = time.time, drop_vanished: bool = False) -> None:
        self.model = model
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
        listed = {entry.endpoint for entry in self._entries.entries()}
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
        while events and count < MAX_FRAMES_PER_POLL:
            for sock, _ in events:
                endpoint = self.by_socket.get(sock)
                for _ in range(1000):
                    try:
                        frame = sock.recv(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    count += 1
                    try:
                        msg = wire.decode(frame)
                    except wire.WireError as exc:
                        self.model.reject(exc.reason)
                        continue
                    now = self.clock()
                    self.model.ingest(msg, now, endpoint)
                    if self.recorder is not None:  # the valid frame as it came: `loadertop record`
                        self.recorder.add(frame, now, endpoint)
            events = self.poller.poll(0)
        if self.recorder is not None:
            self.recorder.flush_if_due()
        return count

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
