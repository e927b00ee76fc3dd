"""The bytes of a worker's two messages (`wire.WorkerSample`, `wire.WorkerStart`), written without
msgspec: exactly what `wire.encode_sample` makes of the same fields (tests/unit/test_wire.py
checks it byte for byte), so that a worker process imports no msgspec.

Why: a spawned or forkserver worker does not inherit its parent's modules, and importing msgspec
and the schema there took milliseconds (docs/performance.md), on the helper thread, right as the
worker handed its first batch to torch's queue (whose feeder thread then waited for the GIL):
each epoch start of such a loader paid for it. The main process decodes with msgspec and the
schema as before: every message is validated there, and one that is not what the schema says is
dropped and counted.

The format is MessagePack as msgspec writes an `array_like`, tagged Struct: an array of the tag
and every field in order, each integer in its smallest form.
"""

from __future__ import annotations

import struct

SAMPLE_TAG = "wsample"  # wire.WorkerSample's tag
START_TAG = "wstart"  # wire.WorkerStart's tag
MAX_FRAMES = 256  # wire.MAX_FRAMES: frames of one stack (the watchdog writes no more)

_pack = struct.pack


_FIXINTS = [bytes((i,)) for i in range(0x80)]


def _int(value: int) -> bytes:
    if 0 <= value <= 0x7F:
        return _FIXINTS[value]
    if value >= 0:
        if value <= 0xFF:
            return b"\xcc" + bytes((value,))
        if value <= 0xFFFF:
            return _pack(">BH", 0xCD, value)
        if value <= 0xFFFFFFFF:
            return _pack(">BI", 0xCE, value)
        return _pack(">BQ", 0xCF, value)  # past 2**64: struct.error, counted as dropped
    if value >= -32:
        return _pack(">b", value)
    if value >= -0x80:
        return _pack(">Bb", 0xD0, value)
    if value >= -0x8000:
        return _pack(">Bh", 0xD1, value)
    if value >= -0x80000000:
        return _pack(">Bi", 0xD2, value)
    return _pack(">Bq", 0xD3, value)


def _str(value: str) -> bytes:
    data = value.encode()
    n = len(data)
    if n <= 31:
        return bytes((0xA0 | n,)) + data
    if n <= 0xFF:
        return b"\xd9" + bytes((n,)) + data
    if n <= 0xFFFF:
        return _pack(">BH", 0xDA, n) + data
    return _pack(">BI", 0xDB, n) + data


def _value(value: object) -> bytes:
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, str):
        return _str(value)
    if isinstance(value, dict):
        n = len(value)
        head = bytes((0x80 | n,)) if n <= 15 else (
            _pack(">BH", 0xDE, n) if n <= 0xFFFF else _pack(">BI", 0xDF, n))
        return head + b"".join(_value(k) + _value(v) for k, v in value.items())
    raise TypeError(f"not a worker message field: {type(value).__name__}")


def _array(items: tuple[object, ...]) -> bytes:
    n = len(items)  # at most 14 here: a fixarray
    return bytes((0x90 | n,)) + b"".join(_value(v) for v in items)


class SampleWriter:
    """wire.encode_sample(wire.WorkerSample(source, worker_id, pid, ...)) for one worker: the
    fields that never change (the array's head, the tag, source, worker id and pid) written once
    (docs/performance.md: against writing them each time, and msgspec's encoder, which a spawned
    worker would have to import first)."""

    __slots__ = ("_head",)

    def __init__(self, source: str, worker_id: int, pid: int) -> None:
        self._head = bytes((0x90 | 14,)) + _str(SAMPLE_TAG) + _str(source) + _int(worker_id) + \
            _int(pid)

    def sample(self, fetch_ns: int, cpu_ns: int, dropped: int = 0, collate_ns: int = 0,
               done_ns: int = 0, generation: int = 0, seq: int = 0, ended: bool = False,
               tensors: int | None = None, tensor_bytes: int | None = None) -> bytes:
        # 14 items in all (the head's array size): the tag and the 13 fields
        return b"".join((self._head, _int(fetch_ns), _int(cpu_ns), _int(dropped),
                         _int(collate_ns), _int(done_ns), _int(generation), _int(seq),
                         b"\xc3" if ended else b"\xc2",
                         b"\xc0" if tensors is None else _int(tensors),
                         b"\xc0" if tensor_bytes is None else _int(tensor_bytes)))


def worker_start(source: str, worker_id: int, pid: int, digests: dict[str, str] | None = None,
                 stack_file: str | None = None) -> bytes:
    """wire.encode_sample(wire.WorkerStart(...)) for the same arguments."""
    return _array((START_TAG, source, worker_id, pid, dict(digests or {}), stack_file))
