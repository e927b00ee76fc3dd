"""A W&B run written offline (`WANDB_MODE=offline`), read back from its `run-<id>.wandb` file with
wandb's own record type (`wandb.proto.wandb_internal_pb2.Record`), for the trackers' tests.

The file (wandb 0.31, written by its `wandb-core`) is a LevelDB-style log, as wandb's former Python
`datastore` read it: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then 32 KiB blocks of
records, each with a 7-byte header (CRC-32C, length, type: full/first/middle/last), a block's tail
shorter than a header left as zeros. wandb 0.31 ships no Python reader of it (`wandb sync` uploads
it; nothing prints it), so the framing is read here; every record's bytes are wandb's protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from recorded import needed

try:
    from wandb.proto import wandb_internal_pb2
except ImportError:  # a developer's machine without it: the test skips (fails in CI)
    wandb_internal_pb2 = None

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.startswith(HEADER), data[:8]
    out: list[bytes] = []
    pending = b""
    offset = len(HEADER)
    while offset + 7 <= len(data):
        left = BLOCK - offset % BLOCK
        if left < 7:  # the block's tail: padding
            offset += left
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        if kind == 0 and length == 0:
            break  # zeros: the end of what was written
        payload = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == FULL:
            out.append(payload)
        elif kind == FIRST:
            pending = payload
        elif kind == MIDDLE:
            pending += payload
        elif kind == LAST:
            out.append(pending + payload)
            pending = b""
    return out


def history(run_dir: Path) -> list[dict]:
    """Every `wandb.log` row of an offline run directory (`…/offline-run-…`), in order: its keys
    (nested keys joined by '/', as W&B shows them) and their values."""
    needed(wandb_internal_pb2 is not None, "wandb is not installed (pip install wandb)")
    (path,) = run_dir.glob("run-*.wandb")
    rows = []
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows
