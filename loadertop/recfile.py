"""The recording file: what a viewer received, with its receive times, kept to be watched later.

At the package's top level, beside `wire`, because both the viewer side (`record`, `replay`,
`report`, `snapshot --from`) and the probe (the black box, docs/contract.md §9) write and read it,
and the probe may not import `loadertop.recording` (pyproject.toml's import contracts);
`loadertop.recording.file` re-exports it.

    MAGIC                      b"loadertop-recording\\n" (20 bytes)
    u32 little-endian          length of the header
    header                     msgpack `Header` (format, created_at, loadertop and wire versions, ...)
    raw deflate stream of records, each:
        u32 little-endian      length of the body
        body                   msgpack `Entry`: an endpoint announcement, a frame, or the end

A frame record holds the wire's own frame, byte for byte (prefix, schema version, msgpack body),
so a later loadertop reads an older recording through the same `wire.decode` version check a live
socket gets: a frame of a schema it no longer reads is counted as `wrong_version`, never
misread. Nothing here is pickle; every record is length-bounded and validated into typed Structs,
so a corrupt or hostile file can only end the reading early, with a note.

The writer flushes the deflate stream with Z_SYNC_FLUSH at least every `FLUSH_S`: each flush ends
on a byte boundary the reader can decompress up to, so a recorder killed by SIGKILL loses at most
the records of its last second, and the reader skips the torn tail with a note (the file is
written with plain write(2) calls: the kernel keeps what was written when the process dies).
Compression: a report is mostly small integers that repeat from one report to the next; deflate
keeps an hour of one source at a few MB (docs/recordings.md).
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated

import msgspec
from msgspec import Meta

from loadertop import wire
from loadertop._version import __version__

MAGIC = b"loadertop-recording\n"
FORMAT_VERSION = 1
# A message waits at most this long, plus the time to the receive loop's next poll, before it is in
# the file: `record` polls every 0.1 s, the TUI every 0.5 s while it records; so "at most a second".
FLUSH_S = 0.5
MAX_HEADER_BYTES = 64 * 1024
MAX_RECORD_BYTES = wire.MAX_FRAME_BYTES + 1024  # one frame and its time and endpoint index
MAX_ENDPOINTS = 4096
_LENGTH = struct.Struct("<I")

ShortText = Annotated[str, Meta(max_length=4096)]


class Header(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Who made the recording and when; `format` decides whether this loadertop can read it."""

    format: Annotated[int, Meta(ge=0)]
    created_at: float
    loadertop_version: ShortText = ""
    wire_version: int = wire.SCHEMA_VERSION
    host: ShortText = ""
    argv: Annotated[list[ShortText], Meta(max_length=256)] = []


class EndpointEntry(msgspec.Struct, frozen=True, tag="endpoint", array_like=True):
    """From here on, frames with `index` came from `endpoint`."""

    index: Annotated[int, Meta(ge=0, lt=MAX_ENDPOINTS)]
    endpoint: ShortText


class FrameEntry(msgspec.Struct, frozen=True, tag="frame", array_like=True):
    received_at: float
    endpoint: Annotated[int, Meta(ge=-1, lt=MAX_ENDPOINTS)]  # -1: no endpoint
    frame: Annotated[bytes, Meta(max_length=wire.MAX_FRAME_BYTES)]


class EndEntry(msgspec.Struct, frozen=True, tag="end", array_like=True):
    """The recorder stopped on purpose (`reason`: "stopped", "max_size", "seconds")."""

    at: float
    reason: ShortText


Entry = EndpointEntry | FrameEntry | EndEntry

_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(Entry)
_header_decoder = msgspec.msgpack.Decoder(Header)


class RecordingError(Exception):
    """A file that cannot be read as a recording at all; the message is one line for the user."""


def default_name(now: float | None = None) -> str:
    """loadertop-YYYYmmdd-HHMMSS.ltrec, in local time (what `ls` sorts and a person reads)."""
    return time.strftime("loadertop-%Y%m%d-%H%M%S.ltrec", time.localtime(now))


class RecordingWriter:
    """Appends received frames to a recording file. Not thread-safe: one receiving loop owns it.

    `add` compresses into memory; `flush_if_due` (call it from the receive loop, at least every
    second) writes what is pending. `max_bytes` bounds the file: the record that would pass it is
    not written, the end is marked, and `full` turns true (the caller says so and stops adding).
    """

    def __init__(self, path: str, *, argv: list[str] | None = None, max_bytes: int | None = None,
                 clock: Callable[[], float] = time.monotonic, mode: int = 0o644) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._clock = clock
        header = _encoder.encode(Header(
            format=FORMAT_VERSION, created_at=time.time(), loadertop_version=__version__,
            wire_version=wire.SCHEMA_VERSION, host=os.uname().nodename,
            argv=[a[:4096] for a in (argv or [])][:256]))
        # O_EXCL: never overwrite a recording someone already has (the default name has seconds in
        # it, so two recorders started in one second collide and the second says so).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        self._endpoints: dict[str, int] = {}
        self._pending: list[bytes] = []
        self._pending_raw = 0  # uncompressed bytes since the last flush (a bound for the size check)
        self.written = 0
        self.frames = 0
        self.full = False
        self.closed = False
        self._write(MAGIC + _LENGTH.pack(len(header)) + header)
        self._next_flush = self._clock() + FLUSH_S

    def _write(self, data: bytes) -> None:
        if data:
            self._file.write(data)
            self.written += len(data)

    def _record(self, entry: EndpointEntry | FrameEntry | EndEntry) -> None:
        body = _encoder.encode(entry)
        record = _LENGTH.pack(len(body)) + body
        self._pending.append(self._deflate.compress(record))
        self._pending_raw += len(record)

    def add(self, frame: bytes, received_at: float, endpoint: str | None = None) -> bool:
        """Record one frame (already validated by `wire.decode`); False once the file is full."""
        if self.full or self.closed:
            return False
        # The compressed size is known only at a flush; until then the raw size bounds it (a
        # report compresses; deflate's worst case adds a few bytes per 16 KiB: the 64 of slack).
        if self.max_bytes is not None and \
                self.written + self._pending_raw + len(frame) + 64 > self.max_bytes:
            self.flush()
            if self.written + len(frame) + 64 > self.max_bytes:
                self.full = True
                self._record(EndEntry(at=received_at, reason="max_size"))
                self.flush()
                return False
        index = -1
        if endpoint is not None:
            index = self._endpoints.get(endpoint, -1)
            if index < 0 and len(self._endpoints) < MAX_ENDPOINTS:
                index = self._endpoints[endpoint] = len(self._endpoints)
                self._record(EndpointEntry(index=index, endpoint=endpoint[:4096]))
        self._record(FrameEntry(received_at=received_at, endpoint=index, frame=frame))
        self.frames += 1
        return True

    def flush_if_due(self) -> None:
        if self._clock() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        """Write everything added so far to the file (Z_SYNC_FLUSH: readable up to here)."""
        if self.closed:
            return
        self._next_flush = self._clock() + FLUSH_S
        if not self._pending and not self._pending_raw:
            return
        self._pending.append(self._deflate.flush(zlib.Z_SYNC_FLUSH))
        self._write(b"".join(self._pending))
        self._pending.clear()
        self._pending_raw = 0

    def abandon(self) -> None:
        """Close the file without writing anything more (the disk refused a write)."""
        if not self.closed:
            self.closed = True
            self._pending.clear()
            try:
                self._file.close()
            except OSError:
                pass

    def close(self, reason: str = "stopped") -> None:
        if self.closed:
            return
        if not self.full:
            self._record(EndEntry(at=time.time(), reason=reason))
        self._pending.append(self._deflate.flush(zlib.Z_FINISH))
        self._write(b"".join(self._pending))
        self._pending.clear()
        self.closed = True
        self._file.close()


@dataclass(frozen=True)
class Frame:
    received_at: float
    endpoint: str | None
    frame: bytes


@dataclass
class Recording:
    """Everything readable in a recording file, in the order it was received."""

    path: str
    header: Header
    frames: list[Frame] = field(default_factory=list)
    endpoints: list[str] = field(default_factory=list)
    end_reason: str | None = None  # None: no end mark (the recorder was killed, or still runs)
    notes: list[str] = field(default_factory=list)  # what could not be read, one line each
    size: int = 0

    @property
    def start(self) -> float | None:
        return self.frames[0].received_at if self.frames else None

    @property
    def end(self) -> float | None:
        return self.frames[-1].received_at if self.frames else None

    @property
    def duration_s(self) -> float:
        return (self.frames[-1].received_at - self.frames[0].received_at) if self.frames else 0.0


def read(path: str) -> Recording:
    """Read a recording; raise RecordingError (one line) when it is not one this loadertop reads.

    A torn or corrupt tail is not an error: what comes before it is returned, with a note."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RecordingError(f"{path}: is a directory, not a recording") from None
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise RecordingError(f"{path}: truncated before its header: not a complete recording")
        raise RecordingError(f"{path}: not a loadertop recording (make one with `loadertop record`)")
    offset = len(MAGIC)
    if len(data) < offset + _LENGTH.size:
        raise RecordingError(f"{path}: truncated before its header: not a complete recording")
    (header_len,) = _LENGTH.unpack_from(data, offset)
    offset += _LENGTH.size
    if header_len > MAX_HEADER_BYTES:
        raise RecordingError(f"{path}: corrupt header (claims {header_len} bytes)")
    if len(data) < offset + header_len:
        raise RecordingError(f"{path}: truncated in its header: not a complete recording")
    try:
        header = _header_decoder.decode(data[offset:offset + header_len])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RecordingError(f"{path}: corrupt header ({str(exc)[:120]})") from None
    if header.format > FORMAT_VERSION:
        raise RecordingError(
            f"{path}: written by a newer loadertop ({header.loadertop_version or '?'}, recording "
            f"format {header.format}); this one ({__version__}) reads format {FORMAT_VERSION}: "
            "upgrade loadertop to read it")
    offset += header_len
    recording = Recording(path=path, header=header, size=len(data))
    inflate = zlib.decompressobj(-15)
    try:
        body = inflate.decompress(data[offset:])
    except zlib.error as exc:
        # Corrupt compressed data: keep what decompresses before it.
        recording.notes.append(f"the compressed data is corrupt after some point ({exc}); "
                               "what comes before it is shown")
        body = _inflate_prefix(data[offset:])
    if data[offset:]:
        _parse_records(body, recording)
    return recording


def iter_frames(path: str, chunk_bytes: int = 64 * 1024) -> Iterator[Frame]:
    """The frames of a recording, read and inflated `chunk_bytes` at a time: what `read` returns,
    without holding the whole file (the black box thins its own recording inside a training
    process, where memory is what a job runs short of). Stops quietly at a torn or corrupt tail;
    raises RecordingError as `read` does for a file that is not a recording at all."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise RecordingError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with f:
        head = f.read(len(MAGIC) + _LENGTH.size)
        if len(head) < len(MAGIC) + _LENGTH.size or not head.startswith(MAGIC):
            raise RecordingError(f"{path}: not a complete loadertop recording")
        (header_len,) = _LENGTH.unpack_from(head, len(MAGIC))
        if header_len > MAX_HEADER_BYTES or len(f.read(header_len)) < header_len:
            raise RecordingError(f"{path}: corrupt header")
        inflate = zlib.decompressobj(-15)
        endpoints: dict[int, str] = {}
        pending = b""
        while True:
            data = f.read(chunk_bytes)
            if not data:
                return
            try:
                pending += inflate.decompress(data)
            except zlib.error:
                return
            offset = 0
            while len(pending) - offset >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(pending, offset)
                if length > MAX_RECORD_BYTES:
                    return
                end = offset + _LENGTH.size + length
                if end > len(pending):
                    break
                try:
                    entry = _entry_decoder.decode(pending[offset + _LENGTH.size:end])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    entry = None
                offset = end
                if isinstance(entry, FrameEntry):
                    yield Frame(entry.received_at, endpoints.get(entry.endpoint), entry.frame)
                elif isinstance(entry, EndpointEntry):
                    endpoints[entry.index] = entry.endpoint
            pending = pending[offset:]


def _inflate_prefix(data: bytes) -> bytes:
    """What a corrupt deflate stream yields before the corruption, in 4 KiB steps."""
    inflate = zlib.decompressobj(-15)
    out = []
    for i in range(0, len(data), 4096):
        try:
            out.append(inflate.decompress(data[i:i + 4096]))
        except zlib.error:
            break
    return b"".join(out)


def _parse_records(body: bytes, recording: Recording) -> None:
    endpoints: dict[int, str] = {}
    offset, size = 0, len(body)
    while offset < size:
        if size - offset < _LENGTH.size:
            recording.notes.append(_torn(size - offset))
            return
        (length,) = _LENGTH.unpack_from(body, offset)
        if length > MAX_RECORD_BYTES:
            recording.notes.append(f"a record claims {length} bytes (corrupt): "
                                   f"{size - offset} bytes after it skipped")
            return
        if size - offset - _LENGTH.size < length:
            recording.notes.append(_torn(size - offset))
            return
        start = offset + _LENGTH.size
        offset = start + length
        try:
            entry = _entry_decoder.decode(body[start:offset])
        except (msgspec.DecodeError, msgspec.ValidationError):
            recording.notes.append("a corrupt record skipped")
            continue
        if isinstance(entry, FrameEntry):
            recording.frames.append(Frame(entry.received_at, endpoints.get(entry.endpoint), entry.frame))
        elif isinstance(entry, EndpointEntry):
            endpoints[entry.index] = entry.endpoint
            recording.endpoints.append(entry.endpoint)
        else:
            recording.end_reason = entry.reason
    if recording.end_reason is None and (recording.frames or not recording.notes):
        recording.notes.append("no end mark: the recorder was killed (or still runs); "
                               "everything it had flushed is here")


def _torn(skipped: int) -> str:
    return (f"the last record is cut off ({skipped} bytes skipped): the recorder was killed "
            "mid-write; everything before it is here")
