"""A feed that replays fixed documents, and builders for realistic synthetic ones.

Used by the TUI tests and snapshots (and handy for working on the screen without a training job).
Every number here is fixed: no randomness, no wall clock, so screenshots are reproducible.

The documents follow CONTRACT §3 plus the viewer extras (per-source ``command``, ``endpoint``,
``started_at``, ``age_s``, ``dropped``, ``probe_cpu_fraction``, ``blocked_ms``, ``loop``, queue means;
``system`` host/cgroup/GPU extras; top-level ``viewer``).
"""

from __future__ import annotations

import copy
from typing import Any

SCHEMA = "loadertop.snapshot/1"

#: The fixed "now" of every synthetic document (2025-11-29 17:23:20 UTC).
T0 = 1764437000.0

GIB = 1024**3
MIB = 1024**2


class FakeFeed:
    """Replays documents: a list is returned one per ``document()`` call, the last one repeating.

    ``poll()`` and ``close()`` only count calls, so tests can check the app drives the feed.
    """

    def __init__(self, documents: list[dict] | dict) -> None:
        if isinstance(documents, dict):
            documents = [documents]
        if not documents:
            raise ValueError("FakeFeed needs at least one document")
        self._documents = list(documents)
        self._next = 0
        self.polls = 0
        self.document_calls = 0
        self.closed = False

    def poll(self) -> None:
        self.polls += 1

    def document(self) -> dict:
        self.document_calls += 1
        doc = self._documents[min(self._next, len(self._documents) - 1)]
        self._next += 1
        return doc

    def push(self, document: dict) -> None:
        """Make ``document`` the next (and from then on repeating) document."""
        self._documents = self._documents[: self._next] + [document]

    def close(self) -> None:
        self.closed = True


# --------------------------------------------------------------------------- building blocks


def stats(mean: float, p50: float, p95: float, p99: float, max_: float) -> dict:
    return {"mean": mean, "p50": p50, "p95": p95, "p99": p99, "max": max_}


def diagnosis(category: str, summary: str, evidence: list[str], advice: list[str],
              source: str | None = None, top_level: bool = False) -> dict:
    d: dict[str, Any] = {"category": category, "summary": summary,
                         "evidence": list(evidence), "advice": list(advice)}
    if top_level:
        d["source"] = source
    return d


def worker(wid: int, pid: int, *, cpu_percent: float = 95.0, rss_mib: float = 410.0,
           batches: int = 300, fetch_p50: float = 92.0, fetch_p95: float = 120.0,
           cpu_fraction: float | None = 0.93, alive: bool = True,
           exitcode: int | None = None) -> dict:
    return {
        "id": wid, "pid": pid, "alive": alive, "exitcode": exitcode,
        "cpu_percent": cpu_percent, "rss_bytes": int(rss_mib * MIB), "batches": batches,
        "fetch_ms": stats(fetch_p50 * 1.04, fetch_p50, fetch_p95, fetch_p95 * 1.1, fetch_p95 * 1.2),
        "cpu_fraction": cpu_fraction,
    }


def healthy_diagnosis() -> dict:
    return diagnosis(
        "compute_bound",
        "The loader keeps up: the training step is the limit.",
        ["wait fraction 1.2 % (loop rarely waits)", "queue full on 97 % of next() calls",
         "GPU 0 util 96 %"],
        ["Nothing to fix in loading."],
    )


def source(name: str = "train", *, pid: int = 41234, host: str = "gpu-node-1",
           rank: int | None = None, state: str = "running", num_workers: int = 4,
           batch_size: int = 64, batches: int = 5120, batches_total: int | None = 12500,
           batches_per_s: float | None = 41.6, wait: dict | None = None, step: dict | None = None,
           wait_fraction: float | None = 0.012, queue: dict | None = None,
           workers: list[dict] | None = None, diag: dict | None = None,
           started_at: float = T0 - 3725.0, age_s: float | None = 0.2, dropped: int = 0,
           probe_cpu_fraction: float | None = 0.004, blocked_ms: float | None = None,
           command: str = "python train.py --config configs/resnet50.yaml",
           loop: dict | None = None) -> dict:
    if workers is None:
        workers = [worker(i, pid + 10 + i, cpu_percent=94.0 + i, rss_mib=400.0 + 12 * i,
                          batches=1280 + i, fetch_p50=90.0 + 2 * i, fetch_p95=118.0 + 3 * i)
                   for i in range(num_workers)]
    capacity = num_workers * 2
    if queue is None:
        queue = {"ready": capacity - 1 if capacity else 0, "in_flight": 1 if capacity else 0,
                 "capacity": capacity, "ready_mean": capacity * 0.85 if capacity else None,
                 "in_flight_mean": 1.2 if capacity else None, "ready_when_waiting": 0.1}
    return {
        "id": f"{host}:{pid}:{name}", "host": host, "pid": pid, "rank": rank, "name": name,
        "state": state,
        "config": {"num_workers": num_workers, "batch_size": batch_size,
                   "prefetch_factor": 2 if num_workers else None, "pin_memory": True,
                   "persistent_workers": False, "dataset": "ImageFolder",
                   "worker_context": "fork" if num_workers else None},
        "batches": batches, "batches_total": batches_total, "batches_per_s": batches_per_s,
        "samples_per_s": None if batches_per_s is None else batches_per_s * batch_size,
        "wait_ms": wait if wait is not None else stats(0.3, 0.08, 0.9, 2.4, 3.1),
        "step_ms": step if step is not None else stats(23.7, 23.5, 25.1, 27.9, 31.0),
        "wait_fraction": wait_fraction,
        "queue": queue,
        "workers": workers,
        "diagnosis": diag if diag is not None else healthy_diagnosis(),
        "command": command,
        "endpoint": f"ipc:///run/user/1000/loadertop/{pid}.sock",
        "started_at": started_at, "age_s": age_s, "dropped": dropped,
        "probe_cpu_fraction": probe_cpu_fraction, "blocked_ms": blocked_ms,
        "loop": loop if loop is not None else {"fetch_ms": None, "cpu_fraction": None},
    }


def gpu(index: int = 0, *, util: float = 96.0, mem_used_gib: float = 61.2,
        mem_total_gib: float = 80.0, temp: float = 71.0, power: float = 388.0,
        power_limit: float = 400.0, name: str = "NVIDIA A100-SXM4-80GB") -> dict:
    return {"index": index, "name": name, "util_percent": util,
            "mem_used_bytes": int(mem_used_gib * GIB), "mem_total_bytes": int(mem_total_gib * GIB),
            "temperature_c": temp, "power_w": power, "power_limit_w": power_limit,
            "mem_util_percent": 41.0, "uuid": f"GPU-0000000{index}-fake",
            "processes": [{"pid": 41234, "used_bytes": int(mem_used_gib * GIB)}]}


def system(*, cpu_count: int = 16, cpu_percent: float = 38.0, per_cpu: list[float] | None = None,
           iowait: float | None = 0.4, load: float | None = 6.1, mem_total_gib: float = 125.7,
           mem_available_gib: float = 88.4, swap_total_gib: float = 8.0, swap_used_gib: float = 0.0,
           swap_in: float | None = 0.0, swap_out: float | None = 0.0,
           disk_read: float | None = 2.1 * MIB, disk_write: float | None = 0.3 * MIB,
           gpu_status: str = "ok", gpus: list[dict] | None = None,
           host: str = "gpu-node-1") -> dict:
    if per_cpu is None:
        pattern = [97.0, 95.0, 93.0, 96.0, 12.0, 8.0, 31.0, 5.0]
        per_cpu = [pattern[i % len(pattern)] for i in range(cpu_count)]
    if gpus is None:
        gpus = [gpu(0)] if gpu_status == "ok" else []
    mem_total = int(mem_total_gib * GIB)
    mem_available = int(mem_available_gib * GIB)
    return {
        "cpu_count": cpu_count, "cpu_percent": cpu_percent, "per_cpu_percent": per_cpu,
        "iowait_percent": iowait, "load_avg_1m": load,
        "mem_total_bytes": mem_total, "mem_available_bytes": mem_available,
        "mem_used_percent": round(100.0 * (1 - mem_available / mem_total), 1),
        "swap_total_bytes": int(swap_total_gib * GIB), "swap_used_bytes": int(swap_used_gib * GIB),
        "swap_in_bytes_per_s": swap_in, "swap_out_bytes_per_s": swap_out,
        "disk_read_bytes_per_s": disk_read, "disk_write_bytes_per_s": disk_write,
        "gpu_status": gpu_status, "gpus": gpus,
        "host": host, "cores_available": float(cpu_count), "cgroup": None,
    }


def document(sources: list[dict], *, sys: dict | None | str = "default",
             diag: dict | None = None, connected: bool = True, taken_at: float = T0,
             bad_messages: int = 0, wrong_version: int = 0) -> dict:
    if sys == "default":
        sys = system()
    if diag is None:
        most = sources[0]["diagnosis"] if sources else diagnosis(
            "idle", "No instrumented DataLoader found yet.", [], [])
        diag = dict(most)
        diag["source"] = sources[0]["id"] if sources else None
    return {
        "schema": SCHEMA, "taken_at": taken_at, "window_s": 3.0,
        "sources": sources, "system": sys, "diagnosis": diag,
        "viewer": {"endpoints": [s["endpoint"] for s in sources], "connected": connected,
                   "bad_messages": bad_messages, "wrong_version": wrong_version,
                   "discovery_dir": "/run/user/1000/loadertop"},
    }


# --------------------------------------------------------------------------- ready-made documents


def healthy_doc() -> dict:
    """One loader keeping up with a busy GPU: compute-bound (healthy)."""
    return document([source()], sys=system(gpus=[gpu(0)]))


def gpu_doc() -> dict:
    """Like :func:`healthy_doc` with two GPUs."""
    return document([source()], sys=system(gpus=[gpu(0), gpu(1, util=93.0, temp=68.0,
                                                             power=371.0, mem_used_gib=60.8)]))


def no_gpu_doc() -> dict:
    """A CPU-only machine: NVML missing."""
    return document([source()], sys=system(cpu_count=8, gpu_status="no_nvml", gpus=[]))


def _io_diag() -> dict:
    return diagnosis(
        "input_bound_io",
        "The loop waits for data 62 % of the time; workers wait on storage.",
        ["wait fraction 62 % (p95 wait 212 ms)", "worker cpu_fraction 0.07 (they wait, not compute)",
         "iowait 31 %, disk read 184 MiB/s"],
        ["Use faster storage or a packed format (WebDataset, LMDB); cache decoded samples.",
         "Raise num_workers to 8 to hide latency."],
    )


def io_bound_doc(step: int = 0) -> dict:
    """Waiting on storage; ``step`` varies the figures a little (for history)."""
    wobble = [0, 14, -9, 22, 5, -12, 31, 3, -6, 18, 40, -3][step % 12]
    p95 = 212.0 + wobble * 2
    mean = 96.0 + wobble
    workers = [worker(i, 41244 + i, cpu_percent=6.0 + i, rss_mib=380.0 + 5 * i, batches=210 + i,
                      fetch_p50=480.0 + 10 * i, fetch_p95=730.0 + 15 * i, cpu_fraction=0.07)
               for i in range(4)]
    src = source(batches_per_s=9.4 + (wobble % 5) * 0.1, wait=stats(mean, 80.0, p95, 310.0, 402.0),
                 wait_fraction=0.62, workers=workers, diag=_io_diag(), batches=2300,
                 queue={"ready": 0, "in_flight": 8, "capacity": 8, "ready_mean": 0.3,
                        "in_flight_mean": 7.6, "ready_when_waiting": 0.0})
    per_cpu = [14.0, 9.0, 11.0, 6.0, 8.0, 12.0, 5.0, 7.0] * 2
    sys_ = system(cpu_percent=9.0 + wobble * 0.1, per_cpu=per_cpu, iowait=31.0 + wobble * 0.2,
                  load=4.4, disk_read=(184.0 + wobble) * MIB, disk_write=1.2 * MIB,
                  gpus=[gpu(0, util=max(0.0, 31.0 + wobble), power=160.0, temp=52.0)])
    return document([src], sys=sys_, taken_at=T0 + step)


def io_bound_history(n: int = 40) -> list[dict]:
    """``n`` successive I/O-bound documents (one per tick) so graphs have history."""
    return [io_bound_doc(i) for i in range(n)]


def dead_worker_doc() -> dict:
    """Worker 2 was killed (SIGKILL by the OOM killer): stalled."""
    workers = [worker(0, 41244, cpu_percent=0.0, rss_mib=2140.0),
               worker(1, 41245, cpu_percent=0.0, rss_mib=2210.0),
               worker(2, 41246, cpu_percent=None, rss_mib=0.0, alive=False, exitcode=-9,
                      cpu_fraction=None),
               worker(3, 41247, cpu_percent=0.0, rss_mib=2080.0)]
    workers[2]["rss_bytes"] = None
    diag = diagnosis(
        "stalled",
        "Worker 2 (pid 41246) died with exit code -9 (SIGKILL); the loop is blocked in next().",
        ["worker 2 exit code -9 (killed: often the OOM killer)",
         "blocked in next() for 38.2 s (p99 wait 96 ms)"],
        ["Check `dmesg` for the OOM killer; lower num_workers or batch size."],
    )
    src = source(state="stalled", workers=workers, diag=diag, batches_per_s=0.0,
                 wait_fraction=1.0, blocked_ms=38200.0,
                 queue={"ready": 0, "in_flight": 2, "capacity": 8, "ready_mean": 0.0,
                        "in_flight_mean": 2.0, "ready_when_waiting": 0.0})
    sys_ = system(cpu_percent=3.0, per_cpu=[3.0] * 16, mem_available_gib=2.1, swap_used_gib=6.9,
                  swap_in=12.0 * MIB, swap_out=31.0 * MIB, gpus=[gpu(0, util=0.0, power=62.0)])
    return document([src], sys=sys_)


def waiting_doc(endpoint: str = "ipc:///tmp/loadertop-demo/demo.sock") -> dict:
    """Subscribed to ``endpoint``, nothing received yet (the job is still starting)."""
    doc = document([], sys=None, connected=False)
    doc["viewer"].update(endpoints=[endpoint], received=0, discovery_dir=None)
    return doc


def disconnected_doc(age_s: float = 47.0) -> dict:
    """The viewer heard nothing for ``age_s`` seconds; no endpoint is delivering."""
    src = source(age_s=age_s, state="gone")
    return document([src], connected=False, taken_at=T0)


def multi_source_doc() -> dict:
    """A 2-rank DDP run, each rank with a train and a val loader; rank 1 straggles."""
    sources = []
    for rank in (0, 1):
        pid = 50100 + 100 * rank
        host = f"gpu-node-{rank + 1}"
        if rank == 1:
            train = source("train", pid=pid, host=host, rank=rank, batches_per_s=28.1,
                           wait=stats(12.0, 9.5, 31.0, 44.0, 52.0), wait_fraction=0.34,
                           diag=diagnosis(
                               "input_bound_cpu",
                               "Rank 1 waits for data 34 % of the time; its workers are busy.",
                               ["wait fraction 34 %", "worker cpu_fraction 0.97",
                                "6 of 16 cores idle"],
                               ["Raise num_workers from 4 to 8; cheaper transforms."]),
                           command="torchrun --nproc-per-node 1 train.py", started_at=T0 - 612.0)
        else:
            train = source("train", pid=pid, host=host, rank=rank, batches_per_s=41.2,
                           command="torchrun --nproc-per-node 1 train.py", started_at=T0 - 613.0)
        val = source("val", pid=pid, host=host, rank=rank, state="idle", num_workers=2,
                      batches=0, batches_total=390, batches_per_s=None,
                      wait={k: None for k in ("mean", "p50", "p95", "p99", "max")},
                      step={k: None for k in ("mean", "p50", "p95", "p99", "max")},
                      wait_fraction=None,
                      diag=diagnosis("idle", "Not iterating.", ["no batches in the window"], []),
                      command="torchrun --nproc-per-node 1 train.py", started_at=T0 - 613.0)
        sources += [train, val]
    top = dict(sources[2]["diagnosis"])
    top["source"] = sources[2]["id"]
    return document(sources, diag=top)


def main_process_doc() -> dict:
    """num_workers=0: the main process fetches; the loop field is filled."""
    src = source("train", num_workers=0, workers=[], wait_fraction=0.55,
                 wait=stats(30.0, 29.0, 41.0, 48.0, 55.0),
                 queue={"ready": 0, "in_flight": 0, "capacity": 0, "ready_mean": None,
                        "in_flight_mean": None, "ready_when_waiting": None},
                 loop={"fetch_ms": stats(30.0, 29.0, 41.0, 48.0, 55.0), "cpu_fraction": 0.96},
                 diag=diagnosis("input_bound_cpu",
                                "num_workers=0: the main process loads every batch itself.",
                                ["wait fraction 55 %", "main-process fetch p50 29 ms"],
                                ["Set num_workers=4 (cores available: 16)."]))
    return document([src])


def waiting_for_system_doc() -> dict:
    """A source delivered data but no system message arrived yet."""
    return document([source()], sys=None)


def empty_doc() -> dict:
    """No source found."""
    return document([], sys=None)


def copy_doc(doc: dict) -> dict:
    return copy.deepcopy(doc)
