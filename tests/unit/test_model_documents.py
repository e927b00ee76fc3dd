"""The model's documents, byte for byte: a recorded fleet's frames, fed as a viewer receives them,
give the same `document()` JSON at every refresh as the model they were recorded against.

What `loadertop snapshot --json`, the exporter, recordings and replays read must not change when
the model is made faster (docs/performance.md, "The TUI watching many sources"): the digests in
`golden/model_documents.sha256` are those of the model before that work, one per refresh. The
fleet is deterministic (`tests/fakes.py`'s simulators, no clock, no random source) and meant to
take every path of the window's figures: 4, 2 and 0 workers, workers re-made with new pids and
workers without one, a setting that changes, slow readings and their trends, a loop that blocks
and one that crashes, a goodbye, a source that falls silent, lost reports, a clock that steps back,
frames refused on the way, and refreshes from 0.25 s to 3 s apart.

A change that is meant to change the documents (a new figure, another rounding, another verdict)
regenerates the digests — ``pytest tests/unit/test_model_documents.py --snapshot-update`` — and
says so in its commit; a failure names the first refresh that differs and leaves that document
beside the digests for a diff against the previous version's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

from loadertop import wire
from loadertop.client import distributions, model, window
from loadertop.client.model import Model

import fakes
from fakes import MIB, T0, LoaderSim, MachineSim, WorkerSim, raw_frame

GOLDEN = Path(__file__).parent / "golden" / "model_documents.sha256"
REPORT_S = fakes.REPORT_S


def _ranked(rank: int, name: str, host: str, pid: int, **kw: object) -> LoaderSim:
    return LoaderSim(name=name, rank=rank, host=host, pid=pid, wobble=0.1, batches_total=0, **kw)


def fleet() -> tuple[list[LoaderSim], list[MachineSim]]:
    """Two hosts of ranks (train and val each), a straggler, a 0-worker loader, and one whose
    workers have no pid (an older probe's reports)."""
    loaders = []
    for rank in range(4):
        host = f"node-{rank // 2}"
        pid = 5000 + 100 * rank
        straggler = rank == 3
        loaders.append(_ranked(rank, "train", host, pid,
                               wait_fraction=0.4 if straggler else 0.05,
                               wait_p50_ms=30.0 if straggler else 0.5,
                               wait_p95_ms=80.0 if straggler else 2.0))
        loaders.append(_ranked(rank, "val", host, pid, batches_per_s=12.0, worker_pid_base=pid + 50,
                               workers=[WorkerSim(fetch_p50_ms=40.0 + i, fetch_p95_ms=70.0 + 2 * i)
                                        for i in range(2)]))
    loaders.append(LoaderSim(name="loop", host="node-0", pid=7000, workers=[], wobble=0.2,
                             batches_per_s=30.0, wait_fraction=0.7, wait_p50_ms=20.0,
                             wait_p95_ms=45.0))
    loaders.append(LoaderSim(name="old", host="node-1", pid=7100, wobble=0.05))
    machines = [MachineSim(host="node-0", wobble=0.1), MachineSim(host="node-1", cpu_count=8,
                                                                  wobble=0.2)]
    return loaders, machines


def _resources(loader: LoaderSim, at: float, k: int) -> wire.ResourceReport:
    """Slow readings that grow (a copy-on-read worker), every few seconds."""
    return wire.ResourceReport(
        sampled_at=at, rss_bytes=(900 + 3 * k) * MIB, uss_bytes=(700 + 2 * k) * MIB, fds=40 + k,
        fd_limit=1024, threads=12,
        workers=tuple(wire.WorkerResources(id=i, pid=loader.worker_pid(i),
                                           uss_bytes=(60 + 4 * k) * MIB, pss_bytes=(80 + 4 * k) * MIB,
                                           rss_bytes=(400 + 4 * k) * MIB, fds=12, threads=2)
                      for i in range(len(loader.workers))))


def frames() -> list[tuple[float, str | None, bytes]]:
    """(received at, endpoint, frame) of 40 s of the fleet, with what happens to it on the way."""
    loaders, machines = fleet()
    train0, val0, train1, _, _, _, straggler, _, loop, old = loaders
    crash = wire.LoopError(type="RuntimeError", message="DataLoader worker (pid 7001) is killed",
                           at=T0 + 35.0)
    out: list[tuple[float, str | None, bytes]] = []
    ticks = round(40.0 / REPORT_S)
    for k in range(1, ticks + 1):
        t = T0 + k * REPORT_S
        if k == 60:  # val on rank 0 re-made with 4 workers: its 2-worker setting is an earlier one
            val0.workers = [WorkerSim(fetch_p50_ms=35.0, fetch_p95_ms=60.0) for _ in range(4)]
            val0.epoch += 1
        if k in (40, 100):  # a new epoch of non-persistent workers: new pids, same ids
            train1.worker_pid_base = train1.pid + 20 + k
            train1.epoch += 1
        if k == 70:
            straggler.blocked_ms = 9000.0  # the loop waits in next() from here on
        for loader in loaders:
            if loader is train1 and 120 <= k < 132:
                continue  # its process froze for 3 s: gone, then back
            if loader is loop and k > 140:
                continue  # its loop crashed: the process said goodbye and exited
            msg = loader.report(t, t)
            if loader is old:
                msg = msgspec.structs.replace(msg, workers=tuple(
                    msgspec.structs.replace(w, pid=None) for w in msg.workers))
            if loader is train0 and k % 20 == 0:
                msg = msgspec.structs.replace(msg, resources=_resources(loader, t, k // 20))
            if loader is train0 and k == 50:
                msg = msgspec.structs.replace(msg, epoch_starts_ms=(2100.4, 1875.25, 1990.0),
                                              rng_checked=4, rng_shared=(wire.RngShare(
                                                  state="random", workers=(0, 1, 2, 3)),))
            if loader is straggler and k >= 90:
                msg = msgspec.structs.replace(msg, loop_stack=wire.Stack(
                    frames=("train.py:40 in main", "dataloader.py:630 in __next__"), user_frame=0,
                    taken_at=t - 0.5))
            if loader is loop and k == 140:
                msg = msgspec.structs.replace(msg, error=crash)
            if loader is val0 and k % 37 == 0:
                continue  # lost on the way: a sequence gap
            received = t + 0.003 * (loaders.index(loader) % 3)  # not all at once
            if loader is old and k == 80:
                received -= 2.0  # the viewer's clock stepped back
            out.append((received, loader.endpoint, wire.encode(msg)))
        if k % round(fakes.MACHINE_S / REPORT_S) == 0:
            for machine in machines:
                out.append((t + 0.01, None, wire.encode(machine.report(t))))
        if k == 141:
            out.append((t + 0.02, loop.endpoint, wire.encode(wire.Goodbye(
                source=loop.source, seq=loop.seq, sent_at=t, batches_total=loop.batches_total,
                error=crash))))
        if k % 45 == 0:  # refused on the way: another version, not ours, garbage
            out += [(t, None, raw_frame({"type": "loader"}, version=b"9")),
                    (t, None, b"not/loadertop"), (t, None, wire.FRAME_PREFIX + b"\xc1\xc1")]
    return out


def refresh_times() -> list[float]:
    """Every second, a stretch at 4 Hz, and a 3 s gap (a paused screen)."""
    times = [T0 + s for s in range(2, 20)]
    times += [T0 + 20 + 0.25 * i for i in range(1, 17)]
    times += [T0 + s for s in range(27, 41)]
    return times


def documents() -> list[bytes]:
    """The document JSON at each refresh, the frames fed in between as the subscriber feeds them."""
    model = Model(window_s=3.0)
    out = []
    pending = sorted(frames(), key=lambda f: f[0])
    i = 0
    for now in refresh_times():
        while i < len(pending) and pending[i][0] <= now:
            received, endpoint, frame = pending[i]
            i += 1
            try:
                msg = wire.decode(frame)
            except wire.WireError as exc:
                model.reject(exc.reason)
                continue
            model.ingest(msg, received, endpoint)
        out.append(msgspec.json.encode(model.advance(now)))
    return out


# The window's walk and distributions in C (client/_figures.c) where built, and their pure-Python
# twins that run where it is not: both must give the documents of the model before them.
IMPLEMENTATIONS = ["python"] + (["c"] if window._c_walk is not None else [])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_documents_of_a_recorded_fleet_do_not_change_a_byte(
        implementation: str, request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    if implementation == "python":
        monkeypatch.setattr(window, "_c_walk", None)
        monkeypatch.setattr(model, "stats_of_parts", distributions.python_stats_of_parts)
    docs = documents()
    digests = [hashlib.sha256(doc).hexdigest() for doc in docs]
    if request.config.getoption("--snapshot-update", default=False):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(digests) + "\n")
    golden = GOLDEN.read_text().split()
    assert len(golden) == len(digests), "the fleet's refreshes changed: regenerate the digests"
    for n, (want, got) in enumerate(zip(golden, digests)):
        if want != got:
            path = tmp_path / f"refresh{n}.json"
            path.write_bytes(msgspec.json.format(docs[n]))
            pytest.fail(f"the document of refresh {n} (t = T0 + {refresh_times()[n] - T0:g} s) "
                        f"changed; it is in {path}")
    # The fleet takes the paths it is meant to (a check of the test, not of the model).
    last = msgspec.json.decode(docs[-1])
    states = {s["name"] + str(s["rank"]): s["state"] for s in last["sources"]}
    assert states["loopNone"] == "finished" and states["train3"] == "stalled"
    assert states["train1"] == "running" and states["oldNone"] == "running"
    assert last["viewer"]["bad_messages"] > 0 and last["viewer"]["wrong_version"] > 0
    val0 = next(s for s in last["sources"] if s["name"] == "val" and s["rank"] == 0)
    assert val0["earlier_settings"] and val0["dropped"] > 0
