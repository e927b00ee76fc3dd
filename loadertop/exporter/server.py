"""The exporter's two threads: receiving (the caller's, owns the model) and serving HTTP.

    address = parse_listen(DEFAULT_LISTEN)
    exporter = Exporter(subscriber)                  # the receive loop's state
    server = MetricsServer(exporter.latest, address)  # binds now: OSError if it cannot
    server.start()                                   # scrapes on their own threads from here
    exporter.run(stop)                               # until `stop` is set

The receive loop polls the subscriber and, once every ADVANCE_S, advances the model and replaces
`Exporter.document` with the new immutable Document: a reference swap, atomic under the GIL. A
scrape reads that reference and builds its metrics from it without a lock, so a slow scrape never
delays receiving (beyond sharing the GIL) and never sees a model half-way through an advance.
Sharing the GIL is what costs a scrape time, so the advances keep clear of the scrapes: their
grid settles half an advance before each expected scrape (`Exporter.phased`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import ThreadingWSGIServer, gzip_accepted

from loadertop import endpoints
from loadertop.client.document import Document
from loadertop.client.subscriber import MAX_FRAMES_PER_POLL
from loadertop.exporter.collector import DocumentMetrics, ExporterCollector
from loadertop.exporter.exposition import Exposition

ADVANCE_S = 1.0  # the model moves on once a second, as the TUI's default refresh
DRAIN_S = 0.25  # the receive loop reads its sockets this often (the probes report every 0.25 s)
REQUEST_TIMEOUT_S = 10.0  # a client that connects and says nothing holds its thread this long

INDEX = (b"<html><head><title>loadertop exporter</title></head><body><h1>loadertop exporter</h1>"
         b"<p><a href=\"/metrics\">/metrics</a></p></body></html>\n")


class ListenError(ValueError):
    """A --listen value that cannot be served on; the message is one line saying why."""


class ListenAddress:
    """Where the HTTP server binds: `host` as getaddrinfo takes it (no brackets) and `port`."""

    __slots__ = ("host", "port", "loopback")

    def __init__(self, host: str, port: int, loopback: bool) -> None:
        self.host = host
        self.port = port
        self.loopback = loopback

    def url(self, port: int | None = None) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port if port is None else port}/metrics"


def parse_listen(text: str) -> ListenAddress:
    """HOST:PORT, [IPv6]:PORT, *:PORT (every interface) or PORT (= 127.0.0.1:PORT); port 0 picks
    a free one. The grammar is the publisher's (`loadertop.endpoints`), minus its URLs."""
    if "://" in text:
        raise ListenError(f"--listen takes HOST:PORT, not a URL: {text!r}")
    try:
        endpoint = endpoints.parse(text, listen=True)
    except endpoints.EndpointError as exc:
        raise ListenError(str(exc).replace("tcp://HOST:PORT", "HOST:PORT")) from None
    if endpoint.transport != "tcp" or endpoint.host is None:
        raise ListenError(f"--listen takes HOST:PORT: {text!r}")
    if endpoint.port is None:
        raise ListenError(f"--listen needs a port number (0 for any free one): {text!r}")
    host = endpoint.host
    if host == "*":
        host = "0.0.0.0"
    elif host.startswith("["):
        host = host[1:-1]
    return ListenAddress(host, endpoint.port, endpoint.is_loopback)


class Exporter:
    """The receive loop: the subscriber's model, advanced once every `advance_s`."""

    def __init__(self, subscriber: Any, *, advance_s: float = ADVANCE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.subscriber = subscriber
        self.advance_s = advance_s
        self.clock = clock
        self.document: Document | None = None
        # Called after each advance with the seconds to the next (Exposition.prepare).
        self.after_advance: Callable[[float], object] | None = None
        # When the next scrape is expected (Exposition.next_scrape, monotonic), None: unknown.
        self.next_scrape: Callable[[], float | None] | None = None

    def latest(self) -> Document | None:
        """The document of the last advance (what a scrape reads; any thread)."""
        return self.document

    def advance(self) -> Document:
        self.document = self.subscriber.model.advance(self.clock())
        return self.document

    def phased(self, next_advance: float, now: float) -> float:
        """`next_advance`, moved (by at most a quarter of an advance each time) towards the grid
        that puts an advance half an advance before the next expected scrape.

        An advance and writing its body after it hold the GIL for a while (docs/performance.md: at
        64 sources); a scrape arriving meanwhile waited for both. Half an advance away,
        the scrape finds its body written and the receive thread idle, and that body is at most
        half an advance old. Prometheus scrapes a target at a fixed offset of its interval, so
        the grid settles after a step or two and then moves only with the scraper's jitter."""
        expected = self.next_scrape() if self.next_scrape is not None else None
        if expected is None:
            return next_advance
        step = self.advance_s
        shift = (expected - step / 2 - next_advance) % step  # in [0, step)
        if shift > step / 2:
            shift -= step  # in (-step/2, step/2]: the nearer way
        shift = max(-step / 4, min(step / 4, shift))
        return max(next_advance + shift, now + step / 2)

    def run(self, stop: threading.Event) -> None:
        """Receive and advance until `stop` is set (on the thread that owns the subscriber).

        The sockets are drained every DRAIN_S rather than on each frame: 64 sources report 256
        times a second, mostly apart, and a wake-up per frame cost more than decoding them (each
        polls every socket; docs/performance.md). A frame waits at most DRAIN_S in
        its socket's queue (RCVHWM frames deep), which no figure of a 3 s window notices."""
        monotonic = time.monotonic
        next_advance = next_drain = monotonic()
        while not stop.is_set():
            now = monotonic()
            if now >= next_drain:
                while self.subscriber.poll(0) >= MAX_FRAMES_PER_POLL:
                    pass  # a flood: everything that waits, before the figures move on
                next_drain = max(next_drain + DRAIN_S, now)
            if now >= next_advance:
                self.advance()
                # On the grid: a late advance does not shift the ones after it, a very late one
                # (a suspended process) does not bunch them either.
                next_advance = self.phased(max(next_advance + self.advance_s, now), now)
                if self.after_advance is not None:
                    self.after_advance(next_advance - monotonic())
            stop.wait(max(0.0, min(next_drain, next_advance) - monotonic()))


class _QuietHandler(WSGIRequestHandler):
    """No line per request on stderr (Prometheus scrapes every few seconds, for months)."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsServer:
    """`/metrics`, prometheus_client's text of the latest document (see `Exposition`), on a thread
    per request. Binds in the constructor: an address in use or not on this machine is an
    OSError there, before anything is started."""

    def __init__(self, latest: Callable[[], Document | None], address: ListenAddress, *,
                 per_worker: bool = False) -> None:
        # The document's series are written by `Exposition` (prometheus_client's text, its
        # per-series parts kept); the exporter's own figures by prometheus_client from this.
        self.others = CollectorRegistry(auto_describe=False)
        self.others.register(ExporterCollector(latest))
        self.others.register(ProcessCollector(registry=None))  # the exporter's own CPU, memory
        self.exposition = exposition = Exposition(self.others, latest,
                                                  metrics=DocumentMetrics(per_worker))

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
                    start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
                    return [b""]
                gzipped = gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", ""))
                body = exposition.scrape(gzipped)
                headers = [("Content-Type", exposition.content_type),
                           ("Content-Length", str(len(body)))]
                if gzipped:
                    headers.append(("Content-Encoding", "gzip"))
                start_response("200 OK", headers)
                return [body] if environ.get("REQUEST_METHOD") == "GET" else [b""]
            if path == "/":
                start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
                return [INDEX]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found: the metrics are at /metrics\n"]

        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]

        class Server(ThreadingWSGIServer):
            address_family = family

        self.address = address
        self.httpd = make_server(str(sockaddr[0]), address.port, app, Server,
                                 handler_class=_QuietHandler)
        self.port: int = self.httpd.server_port
        self._thread: threading.Thread | None = None

    def url(self) -> str:
        return self.address.url(self.port)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="loadertop-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
        self.httpd.server_close()
