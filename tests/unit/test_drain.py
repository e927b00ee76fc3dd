"""The publisher thread's drain: its bulk path (min/max over the stamps, TypeError at an epoch
mark) gives the same figures as the per-stamp loop, for every shape of chunk the hot path makes:
epoch marks first, inside and last, an exception's 0, and a loop inside next() between drains."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loadertop.probe import record as recmod

BASE = 10**12


def _record(name: str) -> recmod.LoaderRecord:
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=1, num_workers=0)
    rec = recmod.LoaderRecord(loader, name=name, source=f"test:{name}", host="test", rank=None,
                              command="", process_started_at=0.0)
    rec._keep = loader  # the record holds its loader weakly
    return rec


def _batches(start: int, n: int, wait: int = 700, step: int = 300) -> list[int]:
    out, t = [], start
    for _ in range(n):
        out += [t, -(t + wait)]
        t += wait + step
    return out


def _script():
    """Chunks (lists of stamps, or "epoch" for an iter()), each followed by a drain."""
    t = BASE
    first = _batches(t, 5)
    t += 10_000
    yield ["epoch", first]                        # a mark first, then batches
    yield [_batches(t, 3), "epoch", _batches(t + 5_000, 4)]   # a mark in the middle
    t += 20_000
    yield [_batches(t, 2), [t + 3_000]]           # a loop inside next() at the drain (odd)
    yield [[-(t + 3_900)], _batches(t + 4_200, 2)]  # ... which returns in the next chunk
    t += 10_000
    yield [_batches(t, 2), "epoch"]               # a mark last (odd length with pending)
    yield [_batches(t + 5_000, 3), [t + 9_000, 0]]  # an exception's exit: 0
    t += 20_000
    yield [[t], "epoch"]                          # inside next(), then a mark
    yield [_batches(t + 2_000, 6)]


def _feed(rec: recmod.LoaderRecord, items) -> None:
    for item in items:
        if item == "epoch":
            rec.attach(iter(rec._keep), BASE)
        else:
            rec.events.extend(item)


def _figures(rec: recmod.LoaderRecord) -> dict:
    return {"batches": rec.batches_total, "epoch": rec.epoch, "wait": rec._wait_ns,
            "step": rec._step_ns, "in_next": rec.in_next_since, "prev_t1": rec._prev_t1,
            "waits": list(rec._wait_samples), "steps": list(rec._step_samples),
            "wait_buckets": list(rec._wait_buckets.counts),
            "step_buckets": list(rec._step_buckets.counts)}


def test_the_bulk_drain_equals_the_per_stamp_loop(monkeypatch):
    bulk, each = _record("bulk"), _record("each")
    calls = {"bulk": 0}
    original = recmod.LoaderRecord._drain_alternating

    def counted(self, chunk):
        done = original(self, chunk)
        calls["bulk"] += done
        return done

    monkeypatch.setattr(recmod.LoaderRecord, "_drain_alternating", counted)
    for items in _script():
        _feed(bulk, items)
        bulk.drain()
        monkeypatch.setattr(each, "_drain_alternating", lambda chunk: False)
        _feed(each, items)
        each.drain()
        assert _figures(bulk) == _figures(each), items
    assert calls["bulk"] >= 2  # the bulk path did take the plain chunks
    assert bulk.epoch == 4 and bulk.batches_total > 20


@pytest.mark.parametrize("chunk", [[None], [BASE, None], [BASE, -(BASE + 5), None],
                                   [None, BASE, -(BASE + 5)], [BASE, 0], [0],
                                   [BASE, -(BASE + 5), BASE + 9, 0]])
def test_the_bulk_path_refuses_marks_and_exceptions_without_consuming(chunk):
    rec = _record("refuse")
    before = _figures(rec)
    assert rec._drain_alternating(list(chunk)) is False
    assert _figures(rec) == before
