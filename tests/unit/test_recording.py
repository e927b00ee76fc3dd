"""The recording file and its playback: real wire frames written by the real writer, read back,
torn, corrupted and played through the real Model."""

from __future__ import annotations

import os
import struct
import zlib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadertop import wire
from loadertop.client.model import Model
from loadertop.recording import file as recfile
from loadertop.recording.file import FORMAT_VERSION, MAGIC, RecordingError, RecordingWriter, read
from loadertop.recording.playback import REBUILD_S, Playback

from fakes import T0, goodbye, io_bound_scenario, loader_report, raw_frame, system_report, write_recording


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def frames_of(n: int) -> list[bytes]:
    return [wire.encode(loader_report(seq=i, batches_total=10 * i)) for i in range(n)]


def test_what_is_written_reads_back_in_order_with_times_and_endpoints(tmp_path):
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path), argv=["loadertop", "record"])
    frames = frames_of(5)
    for i, frame in enumerate(frames):
        assert writer.add(frame, T0 + i, "tcp://a:1" if i % 2 else "ipc:///b")
    writer.add(wire.encode(system_report()), T0 + 5, None)
    writer.close()
    rec = read(str(path))
    assert rec.header.format == FORMAT_VERSION and rec.header.argv == ["loadertop", "record"]
    assert [f.frame for f in rec.frames[:5]] == frames
    assert [f.received_at for f in rec.frames] == [T0 + i for i in range(6)]
    assert [f.endpoint for f in rec.frames] == ["ipc:///b", "tcp://a:1"] * 2 + ["ipc:///b", None]
    assert rec.endpoints == ["ipc:///b", "tcp://a:1"]
    assert rec.end_reason == "stopped" and rec.notes == []
    assert rec.duration_s == 5.0


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "r.ltrec"
    path.write_bytes(b"precious")
    with pytest.raises(FileExistsError):
        RecordingWriter(str(path))
    assert path.read_bytes() == b"precious"


def test_a_flushed_recording_reads_without_close_as_after_sigkill(tmp_path):
    """What `flush_if_due` wrote is in the file for a reader, though the writer never closed:
    the state a recorder killed by SIGKILL leaves behind."""
    clock = FakeClock()
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path), clock=clock)
    frames = frames_of(8)
    for i, frame in enumerate(frames[:6]):
        writer.add(frame, T0 + i)
    writer.flush_if_due()  # not due yet: nothing of the stream is written
    assert read(str(path)).frames == []
    clock.t += recfile.FLUSH_S
    writer.flush_if_due()
    for i, frame in enumerate(frames[6:]):  # added after the last flush: lost with the process
        writer.add(frame, T0 + 6 + i)
    rec = read(str(path))
    assert [f.frame for f in rec.frames] == frames[:6]
    assert rec.end_reason is None
    assert any("no end mark" in n for n in rec.notes)


def test_every_cut_of_the_file_reads_the_records_before_it_or_says_it_is_truncated(tmp_path):
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path))
    frames = frames_of(6)
    offsets = []
    for i, frame in enumerate(frames):
        writer.add(frame, T0 + i)
        writer.flush()  # one flush per frame: each frame ends at a known offset of the file
        offsets.append(writer.written)
    writer.close()
    data = path.read_bytes()
    header_end = len(MAGIC) + 4 + struct.unpack_from("<I", data, len(MAGIC))[0]
    cut_path = tmp_path / "cut.ltrec"
    for cut in range(len(data)):
        cut_path.write_bytes(data[:cut])
        if cut < header_end:
            with pytest.raises(RecordingError, match="truncated"):
                read(str(cut_path))
            continue
        rec = read(str(cut_path))
        whole = sum(1 for o in offsets if o <= cut)
        # a frame whose flush is complete is read; deflate may already yield a frame a few
        # bytes before its flush's end marker
        assert whole <= len(rec.frames) <= whole + 1, cut
        assert [f.frame for f in rec.frames] == frames[:len(rec.frames)]
        if header_end < cut < len(data) - 8:
            assert rec.notes, cut  # never silently short


def test_foreign_future_empty_and_missing_files_are_one_line_errors(tmp_path):
    cases = {
        "missing": (None, "no such file"),
        "empty": (b"", "truncated"),
        "foreign": (b"PK\x03\x04 a zip file, not a recording", "not a loadertop recording"),
        "text": (b"loadertop snapshot . 2026-12-01\n", "not a loadertop recording"),
    }
    header = msgspec.msgpack.encode({"format": FORMAT_VERSION + 1, "created_at": T0,
                                     "loadertop_version": "9.0"})
    cases["future"] = (MAGIC + struct.pack("<I", len(header)) + header, "newer loadertop")
    cases["huge header"] = (MAGIC + struct.pack("<I", 2**31), "corrupt header")
    cases["bad header"] = (MAGIC + struct.pack("<I", 3) + b"\xc1\xc1\xc1", "corrupt header")
    for name, (content, expected) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(RecordingError, match=expected) as info:
            read(str(path))
        assert "\n" not in str(info.value), name
    with pytest.raises(RecordingError, match="directory"):
        read(str(tmp_path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_corrupt_bytes_anywhere_never_raise_anything_but_a_recording_error(tmp_path, flips):
    path = tmp_path / "r.ltrec"
    if not path.exists():
        writer = RecordingWriter(str(path))
        for i, frame in enumerate(frames_of(20)):
            writer.add(frame, T0 + i, "tcp://h:1")
            if i % 5 == 4:
                writer.flush()
        writer.close()
    data = bytearray(path.read_bytes())
    for where, value in flips:
        data[where % len(data)] = value
    bad = tmp_path / "bad.ltrec"
    bad.write_bytes(bytes(data))
    try:
        rec = read(str(bad))
    except RecordingError as exc:
        assert "\n" not in str(exc)
        return
    for f in rec.frames:  # whatever was read is what the type says, nothing else
        assert isinstance(f.frame, bytes) and isinstance(f.received_at, float)


def test_max_size_bounds_the_file_and_marks_why_it_ended(tmp_path):
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path), max_bytes=6000)
    added = 0
    for i in range(2000):
        frame = wire.encode(loader_report(seq=i, wait_us=[(i * 7919 + k * 104729) % 90_000
                                                          for k in range(40)]))
        if not writer.add(frame, T0 + i * 0.25):
            break
        added += 1
        writer.flush_if_due()
    assert writer.full and 0 < added < 2000
    writer.close()
    assert os.path.getsize(path) <= 6000
    rec = read(str(path))
    assert len(rec.frames) == added and rec.end_reason == "max_size" and rec.notes == []


def test_the_stream_is_deflate_flushed_so_a_plain_inflater_reads_it(tmp_path):
    """The format is what the module says: a header, then a raw deflate stream of records."""
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path))
    writer.add(frames_of(1)[0], T0)
    writer.close()
    data = path.read_bytes()
    header_len = struct.unpack_from("<I", data, len(MAGIC))[0]
    body = zlib.decompress(data[len(MAGIC) + 4 + header_len:], -15)
    length = struct.unpack_from("<I", body)[0]
    assert msgspec.msgpack.decode(body[4:4 + length])[0] == "frame"


# --------------------------------------------------------------------------- playback


def recorded_io_job(tmp_path, seconds: float = 60.0):
    path = tmp_path / "io.ltrec"
    write_recording(path, io_bound_scenario(), T0 - seconds, T0)
    return read(str(path))


def test_playback_shows_what_a_viewer_watching_live_showed(tmp_path):
    """The same messages at the same times, advanced once a second: the same documents."""
    # The simulated loader's figures depend on how its time is cut into runs: cut both the same.
    times = [T0 - 30.0 + 0.25 + k for k in range(30)]
    recorded, live = io_bound_scenario(), io_bound_scenario()
    writer = write_recording(tmp_path / "io.ltrec", recorded, T0 - 30.0, T0 - 30.0, close=False)
    live_docs = []
    previous = T0 - 30.0
    for t in times:
        recorded.run(previous, t)
        live.run(previous, t)
        previous = t
        live_docs.append(live.document(t))
    writer.close()
    rec = read(str(tmp_path / "io.ltrec"))
    playback = Playback(rec)
    replayed = [playback.document_at(t) for t in times]
    assert replayed == live_docs
    assert replayed[-1].diagnosis.category == "input_bound_io"


def test_seeking_back_and_far_forward_rebuilds_the_same_figures(tmp_path):
    rec = recorded_io_job(tmp_path, 400.0)
    forward = Playback(rec)
    for k in range(0, 400, 1):
        forward.document_at(rec.start + k)
    at = rec.start + 390.0
    straight = forward.document_at(at)
    jumped = Playback(rec)
    jumped.document_at(rec.end)  # to the end, then back
    back = jumped.document_at(at)
    assert back.sources[0].wait_ms == straight.sources[0].wait_ms
    assert back.sources[0].workers == straight.sources[0].workers
    assert back.diagnosis == straight.diagnosis
    assert back.system == straight.system
    # a far jump does not replay everything before it
    far = Playback(rec)
    far.document_at(rec.end)
    assert far.ingested == sum(1 for f in rec.frames if f.received_at >= rec.end - REBUILD_S)


def test_documents_cover_the_recording_and_clamp_outside_it(tmp_path):
    rec = recorded_io_job(tmp_path, 20.0)
    playback = Playback(rec)
    docs = playback.documents(5.0)
    assert [d.taken_at for d in docs] == [round(rec.start + 5 * k, 3) for k in range(4)] + \
        [round(rec.end, 3)]
    assert playback.document_at(rec.end + 1000).taken_at == round(rec.end, 3)
    assert playback.document_at(rec.start - 1000).taken_at == round(rec.start, 3)


def test_frames_of_a_schema_this_loadertop_no_longer_reads_are_counted_not_misread(tmp_path):
    path = tmp_path / "old.ltrec"
    writer = RecordingWriter(str(path))
    for i in range(8):
        writer.add(wire.encode(loader_report(seq=i, sent_at=T0 + i * 0.25)), T0 + i * 0.25, "tcp://h:1")
    writer.add(raw_frame({"x": 1}, version=b"0"), T0 + 2.1, "tcp://h:1")
    writer.add(wire.encode(goodbye(sent_at=T0 + 2.2)), T0 + 2.2, "tcp://h:1")
    writer.close()
    doc = Playback(read(str(path))).document_at(T0 + 2.5)
    assert doc.viewer.wrong_version == 1
    assert doc.sources[0].state == "finished"
    model = Model()  # the model was fed exactly the valid frames
    for i in range(8):
        model.ingest(loader_report(seq=i, sent_at=T0 + i * 0.25), T0 + i * 0.25, "tcp://h:1")
    assert doc.sources[0].batches_total == model.advance(T0 + 2.5).sources[0].batches_total


def test_iter_frames_reads_what_read_reads_a_chunk_at_a_time_and_stops_at_a_torn_tail(tmp_path):
    path = tmp_path / "r.ltrec"
    writer = RecordingWriter(str(path))
    for i in range(300):
        writer.add(b"loadertop/1\0" + bytes([i % 251]) * (i % 97 + 1), 1000.0 + i, f"ipc://e{i % 3}")
        if i % 50 == 0:
            writer.flush()
    writer.close()
    whole = read(str(path))
    streamed = list(recfile.iter_frames(str(path), chunk_bytes=37))
    assert streamed == whole.frames
    data = path.read_bytes()
    (tmp_path / "torn.ltrec").write_bytes(data[: len(data) * 2 // 3])
    torn = read(str(tmp_path / "torn.ltrec"))
    assert list(recfile.iter_frames(str(tmp_path / "torn.ltrec"))) == torn.frames
    with pytest.raises(RecordingError):
        list(recfile.iter_frames(str(tmp_path / "missing.ltrec")))


def test_a_job_killed_right_after_its_last_report_showed_a_hang_keeps_the_hang(tmp_path):
    """The black box's last report is the first to show a worker hung past the threshold, and the
    job is SIGKILLed before the next: played with its end, that report is still judged as a viewer
    watching it live judged it (before it noticed the death), so the post-mortem names the hang."""
    from loadertop.client.ending import killed

    path = tmp_path / "bb.ltrec"
    writer = RecordingWriter(str(path), argv=["loadertop", "run"])
    for i in range(10):
        writer.add(wire.encode(loader_report(seq=i, sent_at=T0 + i, batches_total=100 + 10 * i)),
                   T0 + i, None)
    hung = [msgspec.structs.replace(w, busy_ms=6000.0 if w.id == 0 else None,
                                    stack=wire.Stack(("lt_data.py:90 in hang_forever",), 0, T0 + 10)
                                    if w.id == 0 else None,
                                    batches=0, fetch_us=[])
            for w in loader_report().workers]
    writer.add(wire.encode(loader_report(seq=10, sent_at=T0 + 10, batches_total=190, batches=0,
                                         wait_us=[], step_us=[], workers=hung)), T0 + 10, None)
    writer.close()
    playback = Playback(read(str(path)), ending=(123, killed(None)))
    doc = playback.document_at(T0 + 10)
    assert doc.sources[0].state == "gone"  # killed
    hangs = [f for f in doc.findings if f.kind == "worker_hung"]
    assert [(f.worker, f.stack) for f in hangs] == [(0, ("lt_data.py:90 in hang_forever",))], \
        doc.findings
    assert not playback.model.rejected
