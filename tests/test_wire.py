"""The wire: versioned msgspec frames that decode to typed messages or raise WireError(reason), and
a viewer (Subscriber + Model on a real ZeroMQ socket) that counts and drops bad frames, never
raising (issue 2: "bad input to the reader")."""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadertop import wire
from loadertop.viewer.model import Model
from loadertop.viewer.subscriber import Subscriber

REASONS = {"too_large", "not_loadertop", "wrong_version", "malformed"}


# --------------------------------------------------------------------------- valid messages
def loader_report(**overrides) -> wire.LoaderReport:
    fields = dict(
        source="host:123:train", seq=0, host="host", pid=123, name="train", rank=None,
        command="python train.py", process_started_at=1_700_000_000.0, sent_at=1_700_000_001.0,
        interval_s=0.25,
        config=wire.LoaderConfig(num_workers=2, batch_size=64, prefetch_factor=2, pin_memory=False,
                                 persistent_workers=False, dataset="MyDataset",
                                 worker_context="fork"),
        epoch=1, batches=10, batches_total=100, wait_ns=1_000_000, step_ns=20_000_000,
        wait_us=[100] * 10, step_us=[2000] * 9, blocked_ms=None,
        queue=wire.QueueReport(capacity=4, ready=3, in_flight=1, samples=12, ready_sum=30,
                               in_flight_sum=10, waiting_samples=2, waiting_ready_samples=1),
        workers=[wire.WorkerReport(id=i, pid=200 + i, alive=True, exitcode=None, cpu_percent=97.0,
                                   rss_bytes=10**8, batches=5, fetch_us=[40_000] * 5,
                                   fetch_wall_ns=200_000_000, fetch_cpu_ns=190_000_000)
                 for i in range(2)],
        loop_fetch_us=[], dropped=0, probe_cpu_fraction=0.01,
    )
    fields.update(overrides)
    return wire.LoaderReport(**fields)


def system_report(**overrides) -> wire.SystemReport:
    fields = dict(
        host="host", seq=3, sent_at=1_700_000_001.0, cpu_count=2, cores_available=2.0,
        cpu_percent=50.0, per_cpu_percent=[40.0, 60.0], iowait_percent=0.5, load_avg_1m=1.0,
        mem_total_bytes=2**34, mem_available_bytes=2**33, mem_used_percent=50.0,
        swap_total_bytes=0, swap_used_bytes=0, swap_in_bytes_per_s=0.0, swap_out_bytes_per_s=0.0,
        disk_read_bytes_per_s=0.0, disk_write_bytes_per_s=0.0,
        cgroup=wire.CgroupReport(version=2, cpu_quota_cores=None, mem_limit_bytes=None,
                                 mem_used_bytes=None),
        gpu_status="ok",
        gpus=[wire.GpuReport(index=0, name="H200", util_percent=90.0, mem_used_bytes=10,
                             mem_total_bytes=100, temperature_c=50.0, power_w=300.0,
                             processes=[wire.GpuProcess(pid=123, used_mem_bytes=10)])],
    )
    fields.update(overrides)
    return wire.SystemReport(**fields)


def goodbye(**overrides) -> wire.Goodbye:
    fields = dict(source="host:123:train", seq=5, sent_at=1_700_000_002.0, batches_total=100)
    fields.update(overrides)
    return wire.Goodbye(**fields)


def raw_frame(obj, version: bytes = str(wire.SCHEMA_VERSION).encode()) -> bytes:
    """A frame with an arbitrary (possibly invalid) body, bypassing the typed encoder."""
    return wire.TOPIC + version + b"\0" + msgspec.msgpack.encode(obj)


def builtins_of(msg) -> dict:
    return msgspec.to_builtins(msg)


def reason_of(frame: bytes) -> str:
    with pytest.raises(wire.WireError) as info:
        wire.decode(frame)
    assert info.value.reason in REASONS
    assert isinstance(info.value, ValueError)  # catchable as a ValueError too
    return info.value.reason


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("msg", [
    loader_report(),
    loader_report(rank=3, blocked_ms=12.5, workers=[], loop_fetch_us=[5, 6, 7],
                  loop_fetch_wall_ns=10, loop_fetch_cpu_ns=5,
                  config=wire.LoaderConfig(num_workers=0, batch_size=None, prefetch_factor=None,
                                           pin_memory=True, persistent_workers=False,
                                           dataset="D", worker_context=None, iterable=True)),
    loader_report(workers=[wire.WorkerReport(id=0, pid=None, alive=False, exitcode=-9)],
                  queue=wire.QueueReport(capacity=None)),
    system_report(),
    system_report(cpu_percent=None, per_cpu_percent=None, iowait_percent=None, cgroup=None,
                  gpu_status="no_nvml", gpus=[]),
    goodbye(),
], ids=["loader", "loader-w0", "loader-dead-worker", "system", "system-unknowns", "goodbye"])
def test_round_trip_every_message_kind(msg):
    frame = wire.encode(msg)
    assert frame.startswith(wire.FRAME_PREFIX)
    assert frame.startswith(wire.TOPIC)  # the subscription topic all versions share
    back = wire.decode(frame)
    assert type(back) is type(msg)
    assert back == msg


def test_worker_sample_round_trip_and_is_compact():
    sample = wire.WorkerSample("host:1:train", 3, 4567, 20_000_000, 19_000_000, 2)
    data = wire.encode_sample(sample)
    assert wire.decode_sample(data) == sample
    assert len(data) < 64  # array-like: no field names per batch
    with pytest.raises(wire.WireError) as info:
        wire.decode(data)  # a worker sample is not a viewer frame
    assert info.value.reason == "not_loadertop"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.integers(0, 2**40),
    seq=st.integers(0, 2**63 - 1),
    waits=st.lists(st.integers(0, 10**9), max_size=wire.MAX_SAMPLES),
    name=st.text(max_size=256),
    blocked=st.none() | st.floats(0, 1e9, allow_nan=False),
    exitcode=st.none() | st.integers(-64, 255),
)
def test_round_trip_with_generated_values(batches, seq, waits, name, blocked, exitcode):
    msg = loader_report(batches=batches, seq=seq, wait_us=waits, name=name, blocked_ms=blocked,
                        workers=[wire.WorkerReport(id=0, pid=9, alive=exitcode is None,
                                                   exitcode=exitcode)])
    assert wire.decode(wire.encode(msg)) == msg


def test_decimate_bounds_samples_and_keeps_short_lists():
    assert wire.decimate([1, 2, 3]) == [1, 2, 3]
    long = list(range(10 * wire.MAX_SAMPLES))
    short = wire.decimate(long)
    assert len(short) == wire.MAX_SAMPLES and short[0] == 0 and short == sorted(short)
    # what the probe sends after decimation is always accepted
    assert wire.decode(wire.encode(loader_report(wait_us=short))).wait_us == short


# --------------------------------------------------------------------------- rejected frames
def test_every_truncation_of_a_valid_frame_is_rejected():
    frame = wire.encode(loader_report())
    for cut in range(len(frame)):
        reason = reason_of(frame[:cut])
        if cut < len(wire.TOPIC):
            assert reason == "not_loadertop", cut
        else:
            assert reason == "malformed", cut


@pytest.mark.parametrize("msg", [system_report(), goodbye()], ids=["system", "goodbye"])
def test_truncated_frames_of_other_kinds_are_malformed(msg):
    frame = wire.encode(msg)
    for cut in range(len(wire.FRAME_PREFIX), len(frame)):
        assert reason_of(frame[:cut]) == "malformed"


@pytest.mark.parametrize("version", [b"0", b"2", b"99", b"1x", b"", b"\xff\xfe", b"1" * 40])
def test_wrong_version_prefix(version):
    body = wire.encode(loader_report())[len(wire.FRAME_PREFIX):]
    frame = wire.TOPIC + version + b"\0" + body
    assert reason_of(frame) == "wrong_version"


def test_wrong_version_error_text_is_bounded():
    with pytest.raises(wire.WireError) as info:
        wire.decode(wire.TOPIC + b"9" * 10_000 + b"\0" + b"x")
    assert info.value.reason == "wrong_version" and len(str(info.value)) < 100


@pytest.mark.parametrize("frame", [
    b"", b"l", b"loadertop", b"LOADERTOP/1\0", b"other/1\0\x80", b"\x00" * 32,
    b"\xff" + wire.FRAME_PREFIX,
])
def test_foreign_frames(frame):
    assert reason_of(frame) == "not_loadertop"


def test_missing_version_separator():
    assert reason_of(wire.TOPIC + b"1") == "malformed"
    assert reason_of(wire.TOPIC) == "malformed"


def test_huge_frames():
    assert reason_of(wire.FRAME_PREFIX + b"\x00" * wire.MAX_FRAME_BYTES) == "too_large"
    assert reason_of(b"\x00" * (wire.MAX_FRAME_BYTES + 1)) == "too_large"
    # exactly at the limit it is judged on content, not size
    at_limit = wire.FRAME_PREFIX + b"\x00" * (wire.MAX_FRAME_BYTES - len(wire.FRAME_PREFIX))
    assert reason_of(at_limit) == "malformed"


def _mutated(path: list, value, base=None) -> bytes:
    doc = builtins_of(base if base is not None else loader_report())
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw_frame(doc)


_DELETE = object()


@pytest.mark.parametrize("path, value", [
    (["batches"], -1),
    (["seq"], -5),
    (["wait_ns"], -1),
    (["batches_total"], -100),
    (["pid"], -1),
    (["pid"], 2**32 + 1),
    (["interval_s"], -0.1),
    (["interval_s"], 3601.0),
    (["blocked_ms"], -1.0),
    (["probe_cpu_fraction"], 1e6),
    (["rank"], -1),
    (["wait_us"], [1] * (wire.MAX_SAMPLES + 1)),
    (["step_us"], [-1]),
    (["wait_us"], ["1"]),
    (["workers"], [builtins_of(wire.WorkerReport(id=0, pid=1, alive=True))] * (wire.MAX_WORKERS + 1)),
    (["workers", 0, "id"], -1),
    (["workers", 0, "fetch_us"], [0] * (wire.MAX_SAMPLES + 1)),
    (["workers", 0, "rss_bytes"], -4096),
    (["workers", 0, "cpu_percent"], -1.0),
    (["queue", "ready"], -1),
    (["config", "num_workers"], -2),
    (["config", "dataset"], "D" * 257),
    (["source"], "s" * (wire.MAX_TEXT + 1)),
    (["command"], "c" * (wire.MAX_TEXT + 1)),
    (["name"], "n" * 257),
    (["batches"], "10"),
    (["batches"], 1.5),
    (["batches"], None),
    (["config"], "fork"),
    (["workers"], {"0": {}}),
    (["type"], "evil"),
    (["type"], _DELETE),
    (["source"], _DELETE),
    (["queue"], _DELETE),
])
def test_out_of_range_or_wrong_values_are_malformed(path, value):
    assert reason_of(_mutated(path, value)) == "malformed"


@pytest.mark.parametrize("path, value", [
    (["cpu_count"], -1),
    (["per_cpu_percent"], [1.0] * 4097),
    (["gpus"], [builtins_of(system_report().gpus[0])] * 65),
    (["gpu_status"], "e" * 257),
    (["mem_total_bytes"], -1),
])
def test_out_of_range_system_values_are_malformed(path, value):
    assert reason_of(_mutated(path, value, base=system_report())) == "malformed"


@pytest.mark.parametrize("body", [
    msgspec.msgpack.encode([1, 2, 3]),
    msgspec.msgpack.encode(None),
    msgspec.msgpack.encode(42),
    msgspec.msgpack.encode({}),
    msgspec.msgpack.encode({"type": "loader"}),
    b"\xc1",  # never-used msgpack byte
    b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion elements, with none
    b"\xdf\xff\xff\xff\xff",  # a map claiming 4 billion entries
    b"\xdb\xff\xff\xff\xff" + b"x" * 10,  # a string claiming 4 GiB
    b"\x91" * 100_000 + b"\x00",  # deep nesting
    msgspec.msgpack.encode(builtins_of(loader_report())) + b"\x00",  # trailing bytes
])
def test_hostile_bodies_are_malformed_and_cheap(body):
    started = time.perf_counter()
    assert reason_of(wire.FRAME_PREFIX + body) == "malformed"
    assert time.perf_counter() - started < 0.5


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_raise_anything_but_wire_error(data):
    for frame in (data, wire.TOPIC + data, wire.FRAME_PREFIX + data):
        try:
            msg = wire.decode(frame)
        except wire.WireError as exc:
            assert exc.reason in REASONS
        else:  # astronomically unlikely, but then it must be a fully typed message
            assert isinstance(msg, (wire.LoaderReport, wire.SystemReport, wire.Goodbye))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512))
def test_random_worker_samples_never_raise_anything_but_wire_error(data):
    try:
        sample = wire.decode_sample(data)
    except wire.WireError as exc:
        assert exc.reason == "malformed"
    else:
        assert isinstance(sample, wire.WorkerSample)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_corruption_of_valid_frames(data):
    frame = bytearray(wire.encode(loader_report()))
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(frame) - 1))
        frame[pos] = data.draw(st.integers(0, 255))
    try:
        msg = wire.decode(bytes(frame))
    except wire.WireError as exc:
        assert exc.reason in REASONS
    else:
        assert isinstance(msg, (wire.LoaderReport, wire.SystemReport, wire.Goodbye))


# --------------------------------------------------------------------------- over a real socket
def _poll_until(sub: Subscriber, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        sub.poll(timeout_ms=20)


@contextlib.contextmanager
def _pub_and_subscriber(lt_dir, name: str, sndhwm: int | None = None):
    """A PUB bound in the test and a real Subscriber + Model connected to it, torn down after."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    if sndhwm is not None:
        pub.setsockopt(zmq.SNDHWM, sndhwm)
    endpoint = f"ipc://{lt_dir}/{name}.sock"
    pub.bind(endpoint)
    model = Model()
    sub = Subscriber(model, [endpoint], directory=lt_dir)
    try:
        yield pub, sub, model
    finally:
        sub.close()
        pub.close(0)
        ctx.term()


def test_subscriber_counts_and_drops_bad_frames_and_keeps_valid_ones(lt_dir):
    with _pub_and_subscriber(lt_dir, "pub") as (pub, sub, model):
        assert not sub.discover
        # the slow joiner: keep sending a probe source until one frame arrives
        probe = 0
        deadline = time.monotonic() + 10
        while model.received == 0:
            assert time.monotonic() < deadline, "the subscription never got through"
            pub.send(wire.encode(loader_report(source="host:1:probe", name="probe", pid=1, seq=probe)))
            probe += 1
            sub.poll(timeout_ms=20)
        # frames sent before the subscription was up are lost; one sent now arrives after all
        # those still in flight (ZeroMQ keeps order): then the count is stable
        pub.send(wire.encode(loader_report(source="host:1:probe", name="probe", pid=1, seq=10**6)))
        _poll_until(sub, lambda: model.sources["host:1:probe"].last.seq == 10**6, 5, "the marker")
        base = model.received
        assert not model.rejected

        valid = [loader_report(seq=s, batches=10) for s in range(10) if s != 5]  # a gap at 5
        bad = {
            "malformed": [wire.TOPIC + b"1\0" + b"\xc1", wire.TOPIC + b"1\0",
                          wire.encode(loader_report())[:40], raw_frame({"type": "loader"}),
                          _mutated(["batches"], -1), wire.TOPIC + b"no separator",
                          wire.TOPIC + b"1\0" + bytes(range(256))],
            "wrong_version": [wire.TOPIC + b"2\0" + wire.encode(loader_report())[len(wire.FRAME_PREFIX):],
                              wire.TOPIC + b"0\0garbage"],
            "too_large": [wire.FRAME_PREFIX + b"\x00" * (wire.MAX_FRAME_BYTES + 1)],
        }
        expected = Counter({reason: len(frames) for reason, frames in bad.items()})
        sends = [f for frames in bad.values() for f in frames]
        # interleave: bad frames between the valid ones, in both orders
        for i, msg in enumerate(valid):
            pub.send(wire.encode(msg))
            if i < len(sends):
                pub.send(sends[i])
        for frame in sends[len(valid):]:
            pub.send(frame)
        # a multipart message: the second part is not a loadertop frame
        pub.send_multipart([wire.TOPIC + b"1\0\xc1", b"tail"])
        expected["malformed"] += 1
        expected["not_loadertop"] += 1
        pub.send(wire.encode(system_report(host="host")))
        pub.send(wire.encode(goodbye(seq=10)))

        total_bad = sum(expected.values())
        _poll_until(sub, lambda: model.received - base == len(valid) + 2
                    and sum(model.rejected.values()) == total_bad, 10, "every frame")
        assert model.rejected == expected
        doc = model.document(time.time(), window_s=3.0)
        assert doc["viewer"]["wrong_version"] == expected["wrong_version"]
        assert doc["viewer"]["bad_messages"] == total_bad - expected["wrong_version"]
        src = {s["id"]: s for s in doc["sources"]}["host:123:train"]
        assert src["batches_total"] == 100
        assert src["dropped"] == 1  # the sequence gap at 5 is visible
        assert src["state"] == "finished"  # the goodbye was kept too
        assert doc["system"] is not None and doc["system"]["cpu_count"] == 2


def test_subscriber_survives_a_flood_of_garbage(lt_dir):
    with _pub_and_subscriber(lt_dir, "flood", sndhwm=100_000) as (pub, sub, model):
        deadline = time.monotonic() + 10
        while model.received == 0:
            assert time.monotonic() < deadline
            pub.send(wire.encode(loader_report(seq=0)))
            sub.poll(timeout_ms=20)
        import random

        rng = random.Random(0)
        n = 3000
        for _ in range(n):
            pub.send(wire.TOPIC + rng.randbytes(rng.randint(0, 300)))
        pub.send(wire.encode(loader_report(seq=1000)))
        started = time.monotonic()
        # one poll handles a bounded amount of work: it returns, then the rest comes next time
        # ZeroMQ keeps order: once the valid frame sent last is in, all the garbage was handled
        _poll_until(sub, lambda: model.sources["host:123:train"].last.seq == 1000, 20, "the flood")
        assert time.monotonic() - started < 20
        assert sum(model.rejected.values()) == n
        assert set(model.rejected) <= REASONS
