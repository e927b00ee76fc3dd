"""The endpoint grammar, parsed in this one place.

Where a publisher listens (`loadertop run --listen`, LOADERTOP_ENDPOINT, `instrument(endpoint=)`):
  tcp://HOST:PORT    HOST a name, an interface (eth0), an IPv4 address, [IPv6] or * (every
                     interface); PORT 0 or * = any free port
  HOST:PORT          = tcp://HOST:PORT
  PORT               = tcp://127.0.0.1:PORT (a bare port stays on this machine)
  ipc://PATH         a Unix socket; ipc://@NAME is an abstract one (Linux, no file)
  inproc://NAME      inside one process (tests)
What a viewer watches (`loadertop ENDPOINT`, `snapshot ENDPOINT`): the same URLs and HOST:PORT
(a concrete host and port: `*` and port 0 only mean something when listening), plus
  PID                the discovery entry of that instrumented process
  FILE.json          a discovery entry
  PATH               an existing socket file (= ipc://PATH)

Every mistake is an `EndpointError` whose message is one line saying what is wrong and what
would work. Imported inside training and by the viewer: stdlib only, cheap to import.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

TRANSPORTS = ("tcp", "ipc", "inproc")
LOOPBACK_HOST = "127.0.0.1"  # where a bare PORT listens
MAX_PORT = 65535
WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]")  # every interface
EXPECTED_URL = "tcp://HOST:PORT, HOST:PORT or ipc://PATH"
EXPECTED_LISTEN = "tcp://HOST:PORT, HOST:PORT, PORT or ipc://PATH"
EXPECTED_WATCH = ("tcp://HOST:PORT, HOST:PORT, ipc://PATH, a socket path, a discovery .json file "
                  "or the pid of an instrumented process")


class EndpointError(ValueError):
    """An endpoint that cannot be used; the message says why and what would work (one line)."""


class Endpoint:
    """One parsed endpoint. `str()` gives the URL ZeroMQ takes.

    tcp: `host` as written (a name, an interface, an IPv4 address, `[IPv6]` with its brackets,
    or `*`), `port` an int (0 = any free port) or None for `*`. ipc: `path` (`@name` when
    abstract). inproc: `path` is the name.
    """

    # A plain class rather than a dataclass: `dataclasses` imports `inspect` (a dear import:
    # docs/performance.md), and
    # this module is imported at the start of every torchrun rank below `loadertop run`.
    __slots__ = ("transport", "host", "port", "path")

    def __init__(self, transport: str, *, host: str | None = None, port: int | None = None,
                 path: str | None = None) -> None:
        self.transport = transport
        self.host = host
        self.port = port
        self.path = path

    def __str__(self) -> str:
        if self.transport == "tcp":
            return f"tcp://{self.host}:{'*' if self.port is None else self.port}"
        return f"{self.transport}://{self.path}"

    def __repr__(self) -> str:
        return f"Endpoint({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Endpoint) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def is_ipv6(self) -> bool:
        """An IPv6 address literal: ZeroMQ needs the socket's IPV6 option set for it."""
        return self.transport == "tcp" and (self.host or "").startswith("[")

    @property
    def is_wildcard(self) -> bool:
        """Listening on every interface (reachable from other machines)."""
        return self.transport == "tcp" and self.host in WILDCARD_HOSTS

    @property
    def is_loopback(self) -> bool:
        """Reachable from this machine only: ipc, inproc, localhost, 127.0.0.0/8, [::1]."""
        if self.transport != "tcp":
            return True
        host = (self.host or "").lower()
        if host in ("localhost", "localhost."):
            return True
        try:
            return ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False  # a name or an interface: may well face the network

    def with_port(self, port: int) -> Endpoint:
        if self.transport != "tcp":
            raise EndpointError(f"{self} has no port")
        if not 0 <= port <= MAX_PORT:
            raise EndpointError(f"port {port} of {self.host} is beyond {MAX_PORT}")
        return Endpoint("tcp", host=self.host, port=port)


# ---------------------------------------------------------------------------- parsing
def parse(text: str, *, listen: bool = False) -> Endpoint:
    """The URL grammar and HOST:PORT (with `listen`, a bare PORT too); no file system access."""
    text = text.strip()
    expected = EXPECTED_LISTEN if listen else EXPECTED_URL
    if "://" in text:
        scheme, _, rest = text.partition("://")
        if scheme not in TRANSPORTS:
            raise EndpointError(f"not an endpoint: {text!r} (unknown transport {scheme!r}; "
                                f"expected {expected})")
        if scheme == "tcp":
            return _tcp(text, rest, listen=listen)
        if not rest or rest == "@":
            what = "a path" if scheme == "ipc" else "a name"
            raise EndpointError(f"not an endpoint: {text!r} ({scheme}:// needs {what})")
        return Endpoint(scheme, path=rest)
    if listen and _is_number(text):
        return _tcp(text, f"{LOOPBACK_HOST}:{text}", listen=True)
    if ":" in text and "/" not in text:
        return _tcp(text, text, listen=listen)
    raise EndpointError(f"not an endpoint: {text!r} (expected {expected})")


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _tcp(text: str, rest: str, *, listen: bool) -> Endpoint:
    """`rest` is the HOST:PORT part of `text` (which errors quote)."""
    def bad(why: str) -> EndpointError:
        return EndpointError(f"not an endpoint: {text!r} ({why})")

    if rest.startswith("["):  # [IPv6]:PORT
        host, bracket, after = rest.partition("]")
        host += bracket
        if not bracket or not after.startswith(":"):
            raise bad("expected tcp://[IPv6]:PORT")
        port_text = after[1:]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise bad(f"{host} is not an IPv6 address") from None
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon or not host:
            raise bad("expected tcp://HOST:PORT")
        if ":" in host:
            raise bad("an IPv6 address goes in brackets: tcp://[::1]:5555")
        if host != "*" and not all(c.isascii() and (c.isalnum() or c in "-._") for c in host):
            raise bad(f"{host!r} is not a host name or address")
    if port_text == "*":
        port = None
    elif _is_number(port_text) and int(port_text) <= MAX_PORT:
        port = int(port_text)
    else:
        raise bad(f"the port must be a number from 0 to {MAX_PORT}, or *")
    if not listen:
        if host == "*":
            raise bad(f"* is every interface of a listener; to watch, give the trainer's host: "
                      f"tcp://HOST:{port_text}")
        if not port:
            raise bad(f"port {port_text} is any free port of a listener; to watch, give the port "
                      f"the trainer listens on")
    return Endpoint("tcp", host=host, port=port)


def parse_listen(text: str) -> Endpoint:
    """Where a publisher binds: `loadertop run --listen`, LOADERTOP_ENDPOINT, instrument(endpoint=)."""
    return parse(text, listen=True)


def resolve(text: str, directory: Path) -> str:
    """A viewer's ENDPOINT argument as the URL to connect to (the forms: module docstring).

    `directory` is the discovery directory that pids are looked up in. An ipc socket must
    exist (an abstract `ipc://@name` has no file to check)."""
    # Only the pid and .json forms need it; stdlib only too, but more to import than this module.
    from loadertop import discovery

    text = text.strip()
    if _is_number(text):
        entry = discovery.read_entry(discovery.entry_path(directory, int(text)))
        if entry is None:
            raise EndpointError(f"no instrumented process with pid {text} in {directory}")
        return entry.endpoint
    if "://" not in text and os.path.exists(text):
        if text.endswith(".json"):
            entry = discovery.read_entry(Path(text))
            if entry is None:
                raise EndpointError(f"{text} is not a loadertop discovery file")
            return entry.endpoint
        try:
            is_socket = stat.S_ISSOCK(os.stat(text).st_mode)
        except OSError as exc:
            raise EndpointError(f"cannot use {text}: {exc.strerror}") from None
        if not is_socket:
            raise EndpointError(f"{text} is not a socket (expected {EXPECTED_WATCH})")
        return f"ipc://{os.path.abspath(text)}"
    try:
        endpoint = parse(text)
    except EndpointError:
        if "://" in text or (":" in text and "/" not in text):
            raise  # a URL or HOST:PORT: parse's own reason says what is wrong with it
        looks_like_a_file = "/" in text or text.endswith((".sock", ".json"))
        reason = "no such socket or discovery file" if looks_like_a_file else f"expected {EXPECTED_WATCH}"
        raise EndpointError(f"not an endpoint: {text!r} ({reason})") from None
    if endpoint.transport == "ipc" and not (endpoint.path or "").startswith("@") \
            and not os.path.exists(endpoint.path or ""):
        raise EndpointError(f"no such socket: {endpoint.path} (is the training process running?)")
    return str(endpoint)


# ---------------------------------------------------------------------------- questions
def is_loopback(text: str) -> bool:
    """True when an endpoint (URL) is reachable from this machine only; an unparsable one counts
    as reachable from elsewhere, so that the caller warns rather than stays silent."""
    try:
        return parse(text, listen=True).is_loopback
    except EndpointError:
        return False


def is_ipv6(text: str) -> bool:
    """True for a tcp endpoint with an IPv6 address literal (then set the socket's IPV6 option:
    without it ZeroMQ 4.3 binds nothing and connects nowhere)."""
    try:
        return parse(text, listen=True).is_ipv6
    except EndpointError:
        return False


def rank_endpoint(base: str, local_rank: int) -> str | None:
    """torchrun under `loadertop run --listen tcp://H:P`: local rank N listens on P+N, since every
    rank would otherwise bind the same port. None when `base` needs no offset: not tcp, or any
    free port (0 / *) — then each rank gets its own port anyway."""
    endpoint = parse_listen(base)
    if endpoint.transport != "tcp" or not endpoint.port:
        return None
    return str(endpoint.with_port(endpoint.port + local_rank))
