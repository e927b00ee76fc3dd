"""A viewer (Subscriber + Model) on a real ZeroMQ socket counts and drops bad frames, never raising,
and keeps every valid one (issue 2: "bad input to the reader")."""

from __future__ import annotations

import contextlib
import time
from collections import Counter

import zmq

from loadertop import wire
from loadertop.client.model import Model
from loadertop.client.subscriber import Subscriber

from fakes import goodbye, loader_report, mutated_frame, raw_frame, system_report

REASONS = {"too_large", "not_loadertop", "wrong_version", "malformed"}


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
                          mutated_frame(["batches"], -1), wire.TOPIC + b"no separator",
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
        doc = model.advance(time.time())
        assert doc.viewer.wrong_version == expected["wrong_version"]
        assert doc.viewer.bad_messages == total_bad - expected["wrong_version"]
        src = {s.id: s for s in doc.sources}["host:123:train"]
        assert src.batches_total == 100
        assert src.dropped == 1  # the sequence gap at 5 is visible
        assert src.state == "finished"  # the goodbye was kept too
        assert doc.system is not None and doc.system.cpu_count == 2


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
