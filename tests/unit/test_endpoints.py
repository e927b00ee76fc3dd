"""The endpoint grammar (`loadertop.endpoints`): every form, every error, in one line each."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadertop import discovery, endpoints
from loadertop.endpoints import (
    EndpointError,
    is_ipv6,
    is_loopback,
    parse,
    parse_listen,
    rank_endpoint,
    resolve,
)


# ---------------------------------------------------------------------------- listening
@pytest.mark.parametrize("text, url", [
    ("5555", "tcp://127.0.0.1:5555"),  # a bare port stays on this machine
    (" 5555 ", "tcp://127.0.0.1:5555"),
    ("0", "tcp://127.0.0.1:0"),
    ("localhost:5555", "tcp://localhost:5555"),
    ("0.0.0.0:5555", "tcp://0.0.0.0:5555"),
    ("[::1]:5555", "tcp://[::1]:5555"),
    ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
    ("tcp://*:5555", "tcp://*:5555"),
    ("tcp://0.0.0.0:0", "tcp://0.0.0.0:0"),
    ("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"),
    ("tcp://[::]:5555", "tcp://[::]:5555"),
    ("tcp://[fe80::1%eth0]:5555", "tcp://[fe80::1%eth0]:5555"),
    ("tcp://eth0:5555", "tcp://eth0:5555"),  # ZeroMQ binds to an interface by name
    ("tcp://gpu-box_1.example.com:5555", "tcp://gpu-box_1.example.com:5555"),
    ("ipc:///tmp/lt/train.sock", "ipc:///tmp/lt/train.sock"),
    ("ipc://relative.sock", "ipc://relative.sock"),
    ("ipc://@loadertop-train", "ipc://@loadertop-train"),  # abstract: no file
    ("inproc://tests", "inproc://tests"),
])
def test_listen_forms(text, url):
    assert str(parse_listen(text)) == url


def test_parsed_parts():
    ep = parse_listen("tcp://[::1]:5555")
    assert (ep.transport, ep.host, ep.port, ep.path) == ("tcp", "[::1]", 5555, None)
    assert parse_listen("tcp://*:*").port is None
    ipc = parse_listen("ipc://@name")
    assert (ipc.transport, ipc.host, ipc.port, ipc.path) == ("ipc", None, None, "@name")
    assert parse_listen("5555") == parse("tcp://127.0.0.1:5555")
    assert parse_listen("5555") != parse("tcp://127.0.0.1:5556")
    assert repr(parse_listen("5555")) == "Endpoint('tcp://127.0.0.1:5555')"


# ---------------------------------------------------------------------------- watching
@pytest.mark.parametrize("text, url", [
    ("trainer:5555", "tcp://trainer:5555"),
    ("[::1]:5555", "tcp://[::1]:5555"),
    ("tcp://10.0.0.7:5555", "tcp://10.0.0.7:5555"),
    # What a wildcard listener writes in its discovery entry (ZeroMQ's LAST_ENDPOINT): Linux
    # connects it to this machine.
    ("tcp://0.0.0.0:41234", "tcp://0.0.0.0:41234"),
    ("ipc://@loadertop-train", "ipc://@loadertop-train"),
])
def test_watch_forms(text, url):
    assert str(parse(text)) == url


# ---------------------------------------------------------------------------- errors
LISTEN_ERRORS = [
    ("", "not an endpoint"),
    ("bogus", "not an endpoint: 'bogus' (expected tcp://HOST:PORT, HOST:PORT, PORT or ipc://PATH)"),
    ("/tmp/x.sock", "not an endpoint"),
    ("tcp://", "expected tcp://HOST:PORT"),
    ("tcp://host", "expected tcp://HOST:PORT"),
    ("tcp://:5555", "expected tcp://HOST:PORT"),
    ("tcp://host:", "the port must be a number from 0 to 65535, or *"),
    ("tcp://host:http", "the port must be a number"),
    ("tcp://host:70000", "the port must be a number from 0 to 65535"),
    ("tcp://host:-1", "the port must be a number"),
    ("tcp://host:٥٥", "the port must be a number"),  # Arabic-Indic digits: isdigit() says yes
    ("tcp://::1:5555", "an IPv6 address goes in brackets: tcp://[::1]:5555"),
    ("::1:5555", "an IPv6 address goes in brackets"),
    ("tcp://[::1]", "expected tcp://[IPv6]:PORT"),
    ("tcp://[::1:5555", "expected tcp://[IPv6]:PORT"),
    ("tcp://[::1]5555", "expected tcp://[IPv6]:PORT"),
    ("tcp://[nope]:5555", "[nope] is not an IPv6 address"),
    ("tcp://[]:5555", "[] is not an IPv6 address"),
    ("tcp://a b:5555", "'a b' is not a host name or address"),
    ("tcp://host/x:5555", "'host/x' is not a host name or address"),
    ("udp://host:5555", "unknown transport 'udp'"),
    ("TCP://host:5555", "unknown transport 'TCP'"),
    ("ipc://", "ipc:// needs a path"),
    ("ipc://@", "ipc:// needs a path"),
    ("inproc://", "inproc:// needs a name"),
]

WATCH_ONLY_ERRORS = [
    ("5555", "not an endpoint: '5555'"),  # a bare number to watch is a pid (resolve), not a port
    ("tcp://*:5555", "to watch, give the trainer's host: tcp://HOST:5555"),
    ("*:5555", "* is every interface of a listener"),
    ("tcp://trainer:0", "port 0 is any free port of a listener"),
    ("tcp://trainer:*", "port * is any free port of a listener"),
]


@pytest.mark.parametrize("text, message", LISTEN_ERRORS)
def test_listen_errors(text, message):
    with pytest.raises(EndpointError) as info:
        parse_listen(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, message", LISTEN_ERRORS[2:] + WATCH_ONLY_ERRORS)
def test_watch_errors(text, message):
    with pytest.raises(EndpointError) as info:
        parse(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_endpoint_error_is_a_value_error():
    # Callers that knew the old ValueError-based errors keep catching them.
    assert issubclass(EndpointError, ValueError)


# ---------------------------------------------------------------------------- resolve (viewer)
@pytest.fixture
def short_dir(tmp_path_factory):
    # Unix socket paths are limited to ~100 characters: pytest's tmp_path can be longer.
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="lte", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


def test_resolve_a_pid_and_a_discovery_file(short_dir):
    entry = discovery.write_entry(short_dir, pid=4242, endpoint="tcp://127.0.0.1:5599", command="x",
                                  started_at=0.0, rank=None)
    assert resolve("4242", short_dir) == "tcp://127.0.0.1:5599"
    assert resolve(str(entry), short_dir) == "tcp://127.0.0.1:5599"
    with pytest.raises(EndpointError, match=f"no instrumented process with pid 4243 in {short_dir}"):
        resolve("4243", short_dir)
    bad = short_dir / "bad.json"
    bad.write_text("{}")
    with pytest.raises(EndpointError, match="is not a loadertop discovery file"):
        resolve(str(bad), short_dir)


def test_resolve_a_socket_path(short_dir, monkeypatch):
    sock = _unix_socket(short_dir / "train.sock")
    try:
        assert resolve(str(short_dir / "train.sock"), short_dir) == f"ipc://{short_dir}/train.sock"
        monkeypatch.chdir(short_dir)
        assert resolve("train.sock", short_dir) == f"ipc://{short_dir}/train.sock"  # made absolute
        assert resolve(f"ipc://{short_dir}/train.sock", short_dir) == f"ipc://{short_dir}/train.sock"
    finally:
        sock.close()


def test_resolve_urls_and_host_port(short_dir):
    assert resolve("trainer:5555", short_dir) == "tcp://trainer:5555"
    assert resolve(" tcp://[::1]:5555 ", short_dir) == "tcp://[::1]:5555"
    assert resolve("ipc://@loadertop-train", short_dir) == "ipc://@loadertop-train"  # not checked


@pytest.mark.parametrize("text, message", [
    ("foo", "not an endpoint: 'foo' (expected tcp://HOST:PORT, HOST:PORT, ipc://PATH, a socket path, "
            "a discovery .json file or the pid of an instrumented process)"),
    ("", "not an endpoint: ''"),
    ("/tmp/lt-does-not-exist.sock", "not an endpoint: '/tmp/lt-does-not-exist.sock' (no such socket "
                                    "or discovery file)"),
    ("missing.json", "no such socket or discovery file"),
    ("ipc:///tmp/lt-does-not-exist/x.sock", "no such socket: /tmp/lt-does-not-exist/x.sock (is the "
                                            "training process running?)"),
    ("tcp://", "not an endpoint: 'tcp://' (expected tcp://HOST:PORT)"),
    ("trainer:http", "the port must be a number"),
    ("tcp://*:5555", "to watch, give the trainer's host"),
])
def test_resolve_errors(short_dir, text, message):
    with pytest.raises(EndpointError) as info:
        resolve(text, short_dir)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_resolve_refuses_a_file_that_is_not_a_socket(short_dir):
    plain = short_dir / "notes.txt"
    plain.write_text("hello")
    with pytest.raises(EndpointError, match="notes.txt is not a socket"):
        resolve(str(plain), short_dir)


# ---------------------------------------------------------------------------- questions
@pytest.mark.parametrize("url, loopback", [
    ("tcp://127.0.0.1:5555", True),
    ("tcp://127.1.2.3:5555", True),
    ("tcp://localhost:5555", True),
    ("tcp://LOCALHOST:5555", True),
    ("tcp://[::1]:5555", True),
    ("ipc:///tmp/x.sock", True),
    ("ipc://@abstract", True),
    ("inproc://x", True),
    ("tcp://0.0.0.0:5555", False),
    ("tcp://*:5555", False),
    ("tcp://[::]:5555", False),
    ("tcp://10.0.0.7:5555", False),
    ("tcp://trainer:5555", False),
    ("tcp://127.example.com:5555", False),  # a name, however it starts
    ("tcp://[::ffff:10.0.0.1]:5555", False),
    ("bogus", False),  # unparsable: the caller warns rather than stays silent
])
def test_is_loopback(url, loopback):
    assert is_loopback(url) is loopback


def test_is_wildcard():
    assert parse_listen("tcp://*:5555").is_wildcard
    assert parse_listen("0.0.0.0:0").is_wildcard
    assert parse_listen("tcp://[::]:1").is_wildcard
    assert not parse_listen("5555").is_wildcard
    assert not parse_listen("ipc://@x").is_wildcard


def test_is_ipv6():
    assert is_ipv6("tcp://[::1]:5555") and is_ipv6("[::]:0")
    assert not is_ipv6("tcp://127.0.0.1:5555")
    assert not is_ipv6("ipc://@x")
    assert not is_ipv6("bogus")


@pytest.mark.parametrize("base, local_rank, shifted", [
    ("tcp://0.0.0.0:5555", 3, "tcp://0.0.0.0:5558"),
    ("tcp://0.0.0.0:5555", 0, "tcp://0.0.0.0:5555"),
    ("5555", 1, "tcp://127.0.0.1:5556"),
    ("tcp://[::1]:5555", 2, "tcp://[::1]:5557"),
    ("tcp://127.0.0.1:0", 1, None),  # any free port: each rank gets its own anyway
    ("tcp://*:*", 1, None),
    ("ipc:///tmp/x.sock", 1, None),
    ("ipc://@x", 1, None),
])
def test_rank_endpoint(base, local_rank, shifted):
    assert rank_endpoint(base, local_rank) == shifted


def test_rank_endpoint_errors():
    with pytest.raises(EndpointError, match="port 65536 of 127.0.0.1 is beyond 65535"):
        rank_endpoint("tcp://127.0.0.1:65535", 1)
    with pytest.raises(EndpointError, match="not an endpoint"):
        rank_endpoint("bogus", 1)


def test_with_port():
    assert str(parse_listen("tcp://h:1").with_port(2)) == "tcp://h:2"
    with pytest.raises(EndpointError, match="has no port"):
        parse_listen("ipc://@x").with_port(2)


# ---------------------------------------------------------------------------- import cost
def test_stdlib_only_and_cheap_to_import():
    """Imported inside training (the probe, `loadertop run`'s hook) and by the viewer."""
    code = ("import sys\n"
            "before = set(sys.modules)\n"
            "import loadertop.endpoints, loadertop.environment\n"
            "tops = {m.split('.')[0] for m in set(sys.modules) - before}\n"
            "new = sorted(t for t in tops if t not in sys.stdlib_module_names and t != 'loadertop')\n"
            "print(new)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]", f"non-stdlib modules imported: {out}"
    assert endpoints.__name__ == "loadertop.endpoints"
