"""TensorBoard's event-file format, written by hand: scalars with no TensorFlow, torch or protobuf.

An event file (`events.out.tfevents.*`) is a TFRecord file of `Event` protocol buffers
(tensorboard/compat/proto/event.proto, summary.proto):

    record = uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes
             | the Event's bytes | uint32 masked CRC32C of them
    Event   { double wall_time = 1; int64 step = 2;
              oneof what { string file_version = 3; Summary summary = 5; } }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

The first event of a file says its version (`brain.Event:2`); each later one holds one point of
several scalars. TensorBoard reads `simple_value` as a scalar (its data_compat migrates it to the
scalars plugin), which is all `loadertop export --tensorboard` writes.

Encoding only the few fields above costs a few dozen lines; torch.utils.tensorboard would bring
torch into the viewer (which never imports it) and TensorBoard's own writer protobuf and numpy.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Final

FILE_VERSION: Final = "brain.Event:2"
_MASK_DELTA: Final = 0xA282EAD8
_FLOAT32_MAX: Final = 3.4028234663852886e38


def _crc32c_table() -> tuple[int, ...]:
    poly = 0x82F63B78  # Castagnoli, reflected
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE: Final = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`, as TFRecord frames use it."""
    table = _TABLE
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def record(event: bytes) -> bytes:
    """One TFRecord frame holding `event`."""
    length = struct.pack("<Q", len(event))
    return (length + struct.pack("<I", masked_crc(length)) + event
            + struct.pack("<I", masked_crc(event)))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, what: bytes) -> bytes:
    # wall_time: field 1, 64-bit (wire type 1); step: field 2, varint (a negative int64 would
    # take ten bytes of two's complement: steps here are counts, never negative).
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(max(0, step)) + what


def version_event(wall_time: float) -> bytes:
    """The first event of every file: `file_version`."""
    return _event(wall_time, 0, _length_delimited(3, FILE_VERSION.encode()))


def scalars_event(wall_time: float, step: int, scalars: Iterable[tuple[str, float]]) -> bytes:
    """One event holding one point of each scalar (tag, value); a value a 32-bit float cannot
    hold (not finite, or beyond its range) is left out."""
    values = b"".join(
        _length_delimited(1, _length_delimited(1, tag.encode("utf-8"))
                          + b"\x15" + struct.pack("<f", value))
        for tag, value in scalars if math.isfinite(value) and abs(value) <= _FLOAT32_MAX)
    return _event(wall_time, step, _length_delimited(5, values))
