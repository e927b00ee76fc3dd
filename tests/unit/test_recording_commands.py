"""`record`, `replay` and `snapshot --from` on bad input: one clear line on stderr, a non-zero exit,
never a traceback (the commands are called as the console script calls them: `cli.main(argv)`)."""

from __future__ import annotations

import json
import struct

import msgspec
import pytest

from loadertop import cli, wire
from loadertop.commands import UsageError
from loadertop.commands.record import parse_size
from loadertop.recording.file import FORMAT_VERSION, MAGIC, RecordingWriter

from fakes import T0, io_bound_scenario, raw_frame, system_report, write_recording


def one_line_error(capsys, code: int, argv: list[str], expected: str) -> str:
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and all(line.startswith("loadertop: ") for line in lines), err
    assert expected in lines[-1], err
    return err


@pytest.fixture
def io_recording(tmp_path):
    path = tmp_path / "io.ltrec"
    write_recording(path, io_bound_scenario(), T0 - 30.0, T0)
    return path


def test_snapshot_from_a_recording_at_its_end_and_at_a_point(io_recording, capsys):
    assert cli.main(["snapshot", "--json", "--from", str(io_recording)]) == 0
    end = json.loads(capsys.readouterr().out)
    assert end["taken_at"] == T0 and end["diagnosis"]["category"] == "input_bound_io"
    assert cli.main(["snapshot", "--json", "--from", str(io_recording), "--at", "10"]) == 0
    at = json.loads(capsys.readouterr().out)
    assert at["taken_at"] == round(T0 - 30.0 + 0.25 + 10.0, 3)
    assert cli.main(["snapshot", "--json", "--from", str(io_recording), "--at", "-5"]) == 0
    assert json.loads(capsys.readouterr().out)["taken_at"] == T0 - 5.0
    assert cli.main(["snapshot", "--from", str(io_recording), "--seconds", "10"]) == 0
    text = capsys.readouterr().out
    assert "10 s window" in text and "input_bound_io" in text


def test_bad_recordings_are_one_line_each(tmp_path, capsys):
    missing = tmp_path / "missing.ltrec"
    foreign = tmp_path / "foreign.ltrec"
    foreign.write_bytes(b"\x89PNG\r\n\x1a\n not a recording")
    truncated = tmp_path / "truncated.ltrec"
    truncated.write_bytes(MAGIC[:7])
    future = tmp_path / "future.ltrec"
    header = msgspec.msgpack.encode({"format": FORMAT_VERSION + 1, "created_at": T0})
    future.write_bytes(MAGIC + struct.pack("<I", len(header)) + header)
    empty = tmp_path / "empty.ltrec"
    RecordingWriter(str(empty)).close()
    machine_only = tmp_path / "machine.ltrec"
    writer = RecordingWriter(str(machine_only))
    for i in range(5):
        writer.add(wire.encode(system_report(seq=i)), T0 + i)
    writer.close()
    unreadable = tmp_path / "old-schema.ltrec"
    writer = RecordingWriter(str(unreadable))
    writer.add(raw_frame({"x": 1}, version=b"0"), T0)
    writer.close()
    cases = [
        (missing, "no such file"),
        (foreign, "not a loadertop recording"),
        (truncated, "truncated"),
        (future, "written by a newer loadertop"),
        (empty, "holds no messages"),
        (machine_only, "holds no loader"),
        (unreadable, "none of its 1 messages is readable"),
        (tmp_path, "is a directory"),
    ]
    for path, expected in cases:
        for argv in (["snapshot", "--from", str(path)], ["replay", str(path)]):
            one_line_error(capsys, 1, argv, expected)


def test_snapshot_from_argument_mistakes(io_recording, capsys):
    one_line_error(capsys, 2, ["snapshot", "--at", "3"], "--at needs --from FILE")
    one_line_error(capsys, 2, ["snapshot", "--from", str(io_recording), "tcp://h:1"], "give no ENDPOINT")
    one_line_error(capsys, 1, ["snapshot", "--from", str(io_recording), "--at", "500"],
                   "the recording is 29.8 s long")


def test_replay_needs_a_terminal(io_recording, capsys):
    one_line_error(capsys, 2, ["replay", str(io_recording)], "replay needs a terminal")
    one_line_error(capsys, 2, ["replay", "--speed", "0", str(io_recording)], "--speed must be positive")


def test_record_refuses_to_overwrite_and_says_why(tmp_path, capsys, lt_dir):
    existing = tmp_path / "kept.ltrec"
    existing.write_bytes(b"a colleague's recording")
    one_line_error(capsys, 2, ["record", "-o", str(existing)], "exists: not overwriting it")
    assert existing.read_bytes() == b"a colleague's recording"
    one_line_error(capsys, 2, ["record", "-o", str(tmp_path / "no" / "dir.ltrec")], "cannot write")
    one_line_error(capsys, 2, ["record", "-o", str(tmp_path / "a.ltrec"), "--max-size", "lots"],
                   "is not a size")
    one_line_error(capsys, 2, ["record", "-o", str(tmp_path / "b.ltrec"), "nowhere:x"], "nowhere:x")
    assert not (tmp_path / "b.ltrec").exists()  # nothing recorded: no empty file left behind
    one_line_error(capsys, 2, ["--max-size", "1M"], "--max-size goes with --record FILE")
    one_line_error(capsys, 2, ["--record", str(tmp_path / "c.ltrec")], "--record goes with the live screen")


def test_record_with_nothing_to_receive_says_so(tmp_path, capsys, lt_dir, monkeypatch):
    monkeypatch.setenv("LOADERTOP_DIR", str(lt_dir))
    path = tmp_path / "quiet.ltrec"
    one_line_error(capsys, 1, ["record", "-o", str(path), "--seconds", "0.3"], "nothing was received")
    assert path.exists()


def test_sizes():
    assert parse_size("100000") == 100000
    assert parse_size("500K") == 500 * 1024
    assert parse_size("2g") == 2 * 1024**3
    assert parse_size("1.5MiB") == int(1.5 * 1024**2)
    for bad in ("", "M", "-1", "0", "ten"):
        with pytest.raises(UsageError):
            parse_size(bad)
