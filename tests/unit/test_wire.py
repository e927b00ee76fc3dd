"""The wire: versioned msgspec frames that decode to typed messages or raise WireError(reason)
(issue 2: "bad input to the reader"). Over a real socket: tests/functional/test_subscriber.py."""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadertop import wire

from fakes import DELETE, goodbye, loader_report, mutated_frame, system_report

REASONS = {"too_large", "not_loadertop", "wrong_version", "malformed"}


def reason_of(frame: bytes) -> str:
    with pytest.raises(wire.WireError) as info:
        wire.decode(frame)
    assert info.value.reason in REASONS
    assert isinstance(info.value, ValueError)  # catchable as a ValueError too
    return info.value.reason


def same(decoded, sent) -> bool:
    """Field by field: the probe builds its sequences as lists, a viewer decodes tuples (wire.py
    says why); both are msgpack arrays."""
    return msgspec.json.encode(decoded) == msgspec.json.encode(sent)


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
    assert same(back, msg)


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
    assert same(wire.decode(wire.encode(msg)), msg)


def test_decimate_bounds_samples_and_keeps_short_lists():
    assert wire.decimate([1, 2, 3]) == [1, 2, 3]
    long = list(range(10 * wire.MAX_SAMPLES))
    short = wire.decimate(long)
    assert len(short) == wire.MAX_SAMPLES and short[0] == 0 and short == sorted(short)
    # what the probe sends after decimation is always accepted
    assert wire.decode(wire.encode(loader_report(wait_us=short))).wait_us == tuple(short)
    # evenly spaced: the (i * n // limit)-th of n, for lengths that do not divide
    for n in (5, 7, 100, 4097):
        assert wire.decimate(list(range(n)), 4) == [i * n // 4 for i in range(4)]
    assert wire.decimate(list(range(4097))) == [i * 4097 // 4096 for i in range(4096)]


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
    (["workers"], [msgspec.to_builtins(wire.WorkerReport(id=0, pid=1, alive=True))] * (wire.MAX_WORKERS + 1)),
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
    (["type"], DELETE),
    (["source"], DELETE),
    (["queue"], DELETE),
])
def test_out_of_range_or_wrong_values_are_malformed(path, value):
    assert reason_of(mutated_frame(path, value)) == "malformed"


@pytest.mark.parametrize("path, value", [
    (["cpu_count"], -1),
    (["per_cpu_percent"], [1.0] * 4097),
    (["gpus"], [msgspec.to_builtins(system_report().gpus[0])] * 65),
    (["gpu_status"], "e" * 257),
    (["mem_total_bytes"], -1),
])
def test_out_of_range_system_values_are_malformed(path, value):
    assert reason_of(mutated_frame(path, value, base=system_report())) == "malformed"


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
    msgspec.msgpack.encode(msgspec.to_builtins(loader_report())) + b"\x00",  # trailing bytes
])
def test_hostile_bodies_are_malformed_and_cheap(body):
    # The decode's own CPU time (this thread's clock): what a hostile body can make the reader
    # spend. Wall time would also count whatever else a loaded machine ran meanwhile.
    started = time.thread_time()
    assert reason_of(wire.FRAME_PREFIX + body) == "malformed"
    assert time.thread_time() - started < 0.5


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




# ---------------------------------------------------------------------------- the worker's codec
# probe/sample_codec.py writes the worker's messages without msgspec; the bytes must be
# msgspec's own for every value a field can take (and for some it cannot: the decoder then
# rejects them as it would msgspec's).
from loadertop.probe import sample_codec  # noqa: E402

_ints = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1), st.integers(-2**63, -1),
                  st.sampled_from([127, 128, 255, 256, 2**16 - 1, 2**16, 2**32 - 1, 2**32,
                                   -32, -33, -128, -129, -2**15, -2**15 - 1, -2**31, -2**31 - 1]))
_texts = st.one_of(st.text(max_size=40), st.text(min_size=250, max_size=300),
                   st.text(alphabet="é水", min_size=20, max_size=100), st.just("x" * 70000))
_maybe = st.one_of(st.none(), _ints)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(source=_texts, worker_id=_ints, pid=_ints, fetch=_ints, cpu=_ints, dropped=_ints,
       collate=_ints, done=_ints, generation=_ints, seq=_ints, ended=st.booleans(),
       tensors=_maybe, tensor_bytes=_maybe)
def test_the_worker_writes_a_sample_as_msgspec_does(source, worker_id, pid, fetch, cpu, dropped,
                                                      collate, done, generation, seq, ended,
                                                      tensors, tensor_bytes):
    fields = (source, worker_id, pid, fetch, cpu, dropped, collate, done, generation, seq, ended,
              tensors, tensor_bytes)
    assert sample_codec.SampleWriter(*fields[:3]).sample(*fields[3:]) == \
        wire.encode_sample(wire.WorkerSample(*fields))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(source=_texts, worker_id=_ints, pid=_ints,
       digests=st.dictionaries(st.text(max_size=40), st.text(max_size=300), max_size=70),
       stack_file=st.one_of(st.none(), _texts))
def test_the_worker_writes_a_start_as_msgspec_does(source, worker_id, pid, digests, stack_file):
    assert sample_codec.worker_start(source, worker_id, pid, digests, stack_file) == \
        wire.encode_sample(wire.WorkerStart(source, worker_id, pid, digests, stack_file))


def test_what_the_worker_writes_decodes_and_the_schema_still_judges_it():
    ok = sample_codec.SampleWriter("h:1:train", 1, 4242).sample(10_000, 9_000, 0, 500, 123456789,
                                                                0, 7, False, 3, 4096)
    assert wire.decode_sample(ok) == wire.WorkerSample("h:1:train", 1, 4242, 10_000, 9_000, 0,
                                                       500, 123456789, 0, 7, False, 3, 4096)
    with pytest.raises(wire.WireError):  # a negative count: written, then refused on decoding
        wire.decode_sample(sample_codec.SampleWriter("h:1:train", 0, 1).sample(-5, 0))
    assert sample_codec.MAX_FRAMES == wire.MAX_FRAMES
    assert (sample_codec.SAMPLE_TAG, sample_codec.START_TAG) == ("wsample", "wstart")
