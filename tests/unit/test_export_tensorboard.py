"""`loadertop export --tensorboard` (docs/contract.md §11): the event-file format written by hand,
checked against TensorBoard's own protobuf and CRC; the writer's runs read back by TensorBoard's
own `EventAccumulator`; names from sockets made safe; a failing disk costs one line, never an
exception. Two live jobs, SIGTERM and all: tests/functional/test_e2e_export_tensorboard.py."""

from __future__ import annotations

import msgspec
import pytest

from loadertop.client.tracker_keys import prefix_of, source_metrics
from loadertop.exporter import event_file
from loadertop.exporter.tensorboard import TensorBoardWriter, _Run, run_name

from fakes import finished_doc, healthy_doc, same_name_doc
from tensorboard_runs import scalars

try:
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError:
    event_pb2 = masked_crc32c = None


def tensorboard_needed():
    from recorded import needed

    needed(event_pb2 is not None, "tensorboard is not installed (pip install tensorboard)")


# --------------------------------------------------------------------------- the format
def test_crc32c_is_castagnolis_and_the_mask_tensorboards():
    assert event_file.crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C
    assert event_file.crc32c(b"") == 0
    tensorboard_needed()
    for data in (b"", b"a", bytes(range(256)) * 3, b"\x00" * 8):
        assert event_file.masked_crc(data) == masked_crc32c(data)


def _records(raw: bytes) -> list[bytes]:
    """The events of a TFRecord file, every frame's CRCs checked."""
    out = []
    while raw:
        header, raw = raw[:12], raw[12:]
        length = int.from_bytes(header[:8], "little")
        assert int.from_bytes(header[8:], "little") == event_file.masked_crc(header[:8])
        data, footer, raw = raw[:length], raw[length:length + 4], raw[length + 4:]
        assert int.from_bytes(footer, "little") == event_file.masked_crc(data)
        out.append(data)
    return out


def test_events_decode_as_tensorboards_protobuf():
    tensorboard_needed()
    version = event_pb2.Event.FromString(event_file.version_event(1_700_000_000.25))
    assert version.file_version == "brain.Event:2" and version.wall_time == 1_700_000_000.25
    raw = event_file.scalars_event(1_700_000_001.5, 300_000_000_000, [
        ("loadertop/train/wait_fraction", 0.38), ("loadertop/ünï/x", -2.5),
        ("nan", float("nan")), ("inf", float("inf")), ("huge", 1e39)])
    event = event_pb2.Event.FromString(raw)
    assert event.wall_time == 1_700_000_001.5 and event.step == 300_000_000_000
    values = [(v.tag, v.simple_value) for v in event.summary.value]
    assert values == [("loadertop/train/wait_fraction", pytest.approx(0.38)),
                      ("loadertop/ünï/x", -2.5)]  # what a 32-bit float cannot hold: left out
    framed = event_file.record(raw)
    assert _records(framed) == [raw]


# --------------------------------------------------------------------------- the writer
def written(tmp_path, documents, **kwargs):
    """A writer over `documents` (one per round), closed; and the warnings it gave."""
    docs = list(documents)
    current = [docs[0]]
    warnings: list[str] = []
    writer = TensorBoardWriter(tmp_path, lambda: current[0], warn=warnings.append, **kwargs)
    for doc in docs:
        current[0] = doc
        writer.write()
    writer.close()
    return warnings


def test_one_run_per_source_with_the_tracker_keys_at_the_batches_so_far(tmp_path):
    doc = healthy_doc()
    (src,) = doc.sources
    assert written(tmp_path, [doc]) == []
    run = tmp_path / f"{src.host}-{src.pid}-{src.name}"
    assert [p.name for p in tmp_path.iterdir()] == [run.name]
    got = scalars(run)
    want = source_metrics(src, prefix_of(src))
    assert set(got) == set(want) and "loadertop/train/wait_fraction" in got
    for tag, points in got.items():
        (step, value, wall_time) = points[0]
        assert len(points) == 1  # close() found the document written already
        assert step == src.batches_total
        assert value == pytest.approx(want[tag], rel=1e-6)  # a 32-bit float
        assert wall_time == pytest.approx(doc.taken_at)


def test_points_follow_the_documents_steps_never_go_back_and_an_ended_source_stops(tmp_path):
    first = healthy_doc()
    (src,) = first.sources
    later = msgspec.structs.replace(first, taken_at=first.taken_at + 5, sources=(
        msgspec.structs.replace(src, batches_total=src.batches_total + 200),))
    back = msgspec.structs.replace(first, taken_at=first.taken_at + 10, sources=(
        msgspec.structs.replace(src, batches_total=src.batches_total - 50),))  # never a step back
    ended = finished_doc()
    ended_later = msgspec.structs.replace(ended, taken_at=ended.taken_at + 5)
    assert written(tmp_path, [first, first, later, back, ended, ended_later]) == []
    run = scalars(tmp_path / run_name(src))
    steps = [step for step, _, _ in run["loadertop/train/num_workers"]]
    # the same document once; a step back written at the step reached; the ended source once
    top = src.batches_total + 200
    assert steps == [src.batches_total, top, top, max(top, ended.sources[0].batches_total)]
    assert [value for _, value, _ in run["loadertop/train/workers_alive"]] == [4.0, 4.0, 4.0, 0.0]


def test_run_names_from_sockets_stay_inside_the_directory(tmp_path):
    doc = same_name_doc()
    a, b = doc.sources
    hostile = [msgspec.structs.replace(a, host="..", name="../../etc/passwd"),
               msgspec.structs.replace(b, host="..", pid=a.pid, name="..\\../etc/passwd")]
    names = [run_name(s) for s in hostile]
    assert all("/" not in n and not n.startswith(".") for n in names)
    assert names[0] == names[1]  # both the same once made safe: the second gets a suffix
    doc = msgspec.structs.replace(doc, sources=tuple(hostile))
    assert written(tmp_path, [doc]) == []
    runs = sorted(p.name for p in tmp_path.iterdir())
    assert runs == [names[0], f"{names[0]}-2"]
    assert all(p.parent == tmp_path for p in tmp_path.iterdir())


def test_a_directory_that_cannot_be_made_is_one_line_until_it_can(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    doc = healthy_doc()
    (src,) = doc.sources
    current = [doc]
    warnings: list[str] = []
    writer = TensorBoardWriter(blocked / "runs", lambda: current[0], warn=warnings.append)
    for k in range(3):
        current[0] = msgspec.structs.replace(doc, taken_at=doc.taken_at + k)
        writer.write()  # never raises
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("loadertop export: cannot write TensorBoard events to ")
    blocked.unlink()  # the directory can be made now
    current[0] = msgspec.structs.replace(doc, taken_at=doc.taken_at + 3)
    writer.write()
    writer.close()
    assert len(warnings) == 1
    points = scalars(blocked / "runs" / run_name(src))["loadertop/train/wait_fraction"]
    assert [wall for _, _, wall in points] == [pytest.approx(doc.taken_at + 3)]


def test_a_full_disk_costs_one_line_and_the_next_point_begins_a_new_file(tmp_path, monkeypatch):
    """/dev/full: every write is ENOSPC, as on a full disk (the buffered write fails at the
    flush). One line per time it starts failing; once there is room again, a new file (a partly
    written record would end the one it was in)."""
    doc = healthy_doc()
    (src,) = doc.sources
    real_open = _Run.open
    full = [False]

    def open_maybe_full(run, wall_time):
        if full[0]:
            run.close()
            run.file = open("/dev/full", "ab")
        return real_open(run, wall_time)

    monkeypatch.setattr(_Run, "open", open_maybe_full)
    current = [doc]
    warnings: list[str] = []
    writer = TensorBoardWriter(tmp_path, lambda: current[0], warn=warnings.append)

    def rounds(first: int, full_now: bool, n: int = 3) -> None:
        full[0] = full_now
        for k in range(first, first + n):
            current[0] = msgspec.structs.replace(doc, taken_at=doc.taken_at + k)
            writer.write()

    rounds(0, False)
    rounds(10, True)
    assert len(warnings) == 1 and "No space left on device" in warnings[0]
    rounds(20, False)
    rounds(30, True)
    assert len(warnings) == 2  # failing again after it had recovered
    rounds(40, False, 1)
    writer.close()
    run = tmp_path / run_name(src)
    assert len(list(run.iterdir())) == 3  # begun anew after each failure
    points = scalars(run)["loadertop/train/wait_fraction"]
    assert [round(wall - doc.taken_at) for _, _, wall in points] == [0, 1, 2, 20, 21, 22, 40]
