"""The model alone at fleet scale: what `Model.advance` costs per refresh, on frames recorded once.

    python tests/benchmarks/model_replay.py --record FRAMES [--sources 128] [--processes 32] [--seconds 40]
    python tests/benchmarks/model_replay.py FRAMES [--refresh 1.0] [--window 3.0] [--rounds 3]
                                            [--documents OUT]

``--record`` starts viewer_cpu.py's fleet (``--processes`` feeder processes publishing ``--sources``
loaders between them, real wire reports at 4 Hz) and writes every frame it receives for
``--seconds``, with its receipt time and endpoint, to FRAMES (a pickle).

Given FRAMES, replays them into a fresh `Model` as the subscriber would (decoded, ingested at their
receipt times) and advances it once per ``--refresh`` of recorded time: prints the thread CPU time
of each round's advances (the first 5 refreshes left out: the window fills) and of ingesting.
Unlike the viewer's own figure (viewer_cpu.py) this leaves out Textual, pyzmq and the rest of the
machine's load, so two versions of the model can be told apart: run each on the same FRAMES,
alternated. ``--documents OUT`` writes every document as JSON, one a line: two versions that
compute the same figures write the same file (``cmp``).

Not a pytest test: its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP_REFRESHES = 5


def record(path: str, sources: int, processes: int, seconds: float) -> None:
    import zmq

    sys.path.insert(0, HERE)
    import viewer_cpu

    from loadertop import wire

    directory = tempfile.mkdtemp(prefix="loadertop-replay-")
    procs, endpoints = viewer_cpu.start_fleet(directory, sources, processes)
    ctx = zmq.Context()
    try:
        viewer_cpu.wait_for_sources(endpoints, directory, sources)
        poller = zmq.Poller()
        by_socket = {}
        for endpoint in endpoints:
            sock = ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, wire.TOPIC)
            sock.connect(endpoint)
            poller.register(sock, zmq.POLLIN)
            by_socket[sock] = endpoint
        frames: list[tuple[float, str, bytes]] = []
        deadline = time.time() + seconds
        while time.time() < deadline:
            for sock, _ in poller.poll(100):
                while True:
                    try:
                        frame = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    frames.append((time.time(), by_socket[sock], frame))
        with open(path, "wb") as f:
            pickle.dump(frames, f)
        print(f"{len(frames)} frames from {sources} sources in {seconds:g} s -> {path}")
    finally:
        ctx.destroy(linger=0)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def replay(frames: list[tuple[float, str, bytes]], refresh: float, window: float,
           documents: list[bytes] | None) -> tuple[list[float], float]:
    """One replay: each refresh's advance CPU time (s), and decoding and ingesting every frame's."""
    import msgspec

    from loadertop import wire
    from loadertop.client.model import Model

    model = Model(window_s=window)
    advances: list[float] = []
    ingest = 0.0
    next_refresh = frames[0][0] + refresh
    for received, endpoint, frame in frames:
        while received >= next_refresh:
            t0 = time.thread_time()
            doc = model.advance(next_refresh)
            advances.append(time.thread_time() - t0)
            if documents is not None:
                documents.append(msgspec.json.encode(doc))
            next_refresh += refresh
        t0 = time.thread_time()
        model.ingest(wire.decode(frame), received, endpoint)
        ingest += time.thread_time() - t0
    return advances, ingest


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("frames", help="the recorded frames (written with --record, read otherwise)")
    p.add_argument("--record", action="store_true", help="record the fleet's frames into FRAMES")
    p.add_argument("--sources", type=int, default=128)
    p.add_argument("--processes", type=int, default=32)
    p.add_argument("--seconds", type=float, default=40.0, help="how long to record")
    p.add_argument("--refresh", type=float, default=1.0, help="advance once per this much recorded time")
    p.add_argument("--window", type=float, default=3.0, help="the model's window (s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--documents", default=None, help="write every document as JSON lines here")
    args = p.parse_args()
    if args.record:
        record(args.frames, args.sources, args.processes, args.seconds)
        return 0
    with open(args.frames, "rb") as f:
        frames = pickle.load(f)
    for i in range(args.rounds):
        documents: list[bytes] | None = [] if args.documents is not None and i == 0 else None
        advances, ingest = replay(frames, args.refresh, args.window, documents)
        steady = sorted(advances[WARMUP_REFRESHES:])
        if not steady:
            raise SystemExit("too few refreshes in the recording for its window to fill")
        print(f"round {i + 1}: {len(steady)} refreshes, advance {1e3 * sum(steady):.1f} ms in all, "
              f"median {1e3 * steady[len(steady) // 2]:.2f} ms, min {1e3 * steady[0]:.2f} ms; "
              f"decoding and ingesting {1e6 * ingest / len(frames):.2f} µs a frame", flush=True)
        if documents is not None:
            with open(args.documents, "wb") as f:
                f.write(b"\n".join(documents) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
