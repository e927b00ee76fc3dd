"""A soak: one fast job watched for a long time, its resources and the viewers' read at start and end.

    python tests/benchmarks/soak.py [--minutes 20] [--rate 1000] [--workers 4] [--warmup-s 360]
                                    [--json FILE]

One instrumented training job (a real DataLoader, `--workers` persistent fork workers, batches of
4 small tensors, its loop paced to `--rate` batches/s over one long epoch) with its black box on,
in a private discovery and state directory. Beside it, for `--minutes`:

- the real `loadertop` TUI in a detached tmux session at 120x40 (a viewer that stays);
- a viewer that connects and leaves every 10 s (`loadertop snapshot --seconds 5`);
- `loadertop snapshot --json` every 30 s, whose document is kept: the source's state and its
  `dropped` (reports lost on the way plus samples the probe dropped, all counted).

Every 60 s it reads the RSS (and USS), open fds (those to shared memory apart: a batch's tensors
are handed over as fds of shared memory, one per batch in flight) and threads of the trainer, each
worker and the TUI, and the black box's bytes on disk; after `--warmup-s` (the viewer's
model keeps 120 s of reports and its graphs 300 s: it grows until they are full) the first reading
is the start, the last one, taken while the job still trains, the end. At the end the job's own
count of batches is held against the last report's `batches_total` in its black box (`snapshot
--from last`): every batch counted.

Goals (issue 46): RSS within a few MiB from start to end (after warm-up), fds and threads equal,
nothing dropped that is not counted, the black box within its budget. Not a pytest test: it runs
for --minutes and its figures depend on the machine; they go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
RSS_GOAL_MIB = 4.0  # "within a few MiB"
SIZE = (120, 40)
STATUS_EVERY_S = 1.0
JOB_EXTRA_S = 45.0


# ------------------------------------------------------------------ the job (a process of its own)


def job(seconds: float, rate: float, workers: int, status: str) -> int:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import loadertop

    class Items(Dataset):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> torch.Tensor:
            return torch.full((16,), i, dtype=torch.int64)

    batch_size = 4
    length = int(rate * (seconds + 120) * batch_size)  # one epoch outlasts the soak
    loader = loadertop.instrument(
        DataLoader(Items(length), batch_size=batch_size, num_workers=workers,
                   persistent_workers=workers > 0), name="soak")
    started = time.monotonic()
    batches = 0
    next_status = started
    for _batch in loader:
        batches += 1
        now = time.monotonic()
        ahead = batches / rate - (now - started)
        if ahead > 0.002:  # paced to --rate: sleep off what the loop is ahead
            time.sleep(ahead)
        if now >= next_status:
            _write_json(status, {"pid": os.getpid(), "batches": batches, "at": time.time()})
            next_status = now + STATUS_EVERY_S
        if now - started >= seconds:
            break
    _write_json(status, {"pid": os.getpid(), "batches": batches, "at": time.time(), "done": True})
    return 0


def _write_json(path: str, value: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


# ------------------------------------------------------------------ the soak


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: timed out waiting for {what}")
        time.sleep(0.2)


def _fds(pid: int) -> tuple[int, int]:
    """(fds to anything but shared memory, fds to shared memory): torch 2.13 hands a batch's
    tensors over as file descriptors of shared memory (`/dev/shm/torch_…`, unlinked at once), so
    a worker and the trainer hold one per batch in flight, coming and going with every batch."""
    other = shm = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("/dev/shm/", "memfd:")) or target.endswith("(deleted)"):
            shm += 1
        else:
            other += 1
    return other, shm


def _settled_fds(pid: int, timeout: float = 10.0) -> None:
    """Until the trainer's fds other than shared memory stay the same for a second: ZeroMQ's I/O
    thread closes a departed viewer's connection on its own time."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now_fds = _fds(pid)[0]
        except FileNotFoundError:
            return
        if now_fds != last:
            last, since = now_fds, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return
        time.sleep(0.1)


def _process_figures(proc) -> dict:
    import psutil

    try:
        other, shm = _fds(proc.pid)
        with proc.oneshot():
            full = proc.memory_full_info()
            return {"pid": proc.pid, "rss": full.rss, "uss": full.uss, "fds": other, "fds_shm": shm,
                    "threads": proc.num_threads()}
    except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
        return {"pid": proc.pid, "gone": True}


def _tree_bytes(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            pass
    return total


def _loadertop() -> list[str]:
    return [sys.executable, "-m", "loadertop"]


def _tui_process(session: str):
    import psutil

    pane_pid = int(subprocess.run(["tmux", "list-panes", "-t", session, "-F", "#{pane_pid}"],
                                  capture_output=True, text=True, check=True).stdout.split()[0])
    pane = psutil.Process(pane_pid)  # tmux starts the command through a shell, which may exec it
    for proc in [pane, *pane.children(recursive=True)]:
        if proc.name() not in ("sh", "bash", "dash", "env"):
            return proc
    return pane


def soak(args: argparse.Namespace) -> dict:
    import psutil

    work = Path(tempfile.mkdtemp(prefix="ltsoak", dir="/tmp"))
    env = dict(os.environ, LOADERTOP_DIR=str(work / "d"), LOADERTOP_STATE_DIR=str(work / "state"),
               PYTHONUNBUFFERED="1")
    env.pop("LOADERTOP_ENDPOINT", None)
    env.pop("LOADERTOP_DISABLE", None)
    status = work / "status.json"
    seconds = args.minutes * 60.0
    # the job outlasts the readings: the last one is taken while it still trains, not as it exits
    job_proc = subprocess.Popen([sys.executable, __file__, "--job", "--seconds", str(seconds + JOB_EXTRA_S),
                                 "--rate", str(args.rate), "--workers", str(args.workers),
                                 "--status", str(status)], env=env, cwd=REPO,
                                start_new_session=True)
    session = f"ltsoak-{os.getpid()}"
    background: list[subprocess.Popen] = []
    readings: list[dict] = []
    documents: list[dict] = []
    try:
        _wait(lambda: _read_json(status), 120, "the job's first batches")
        trainer = psutil.Process(job_proc.pid)
        cmd = " ".join(_loadertop())
        tmux_cmd = (f"env LOADERTOP_DIR={env['LOADERTOP_DIR']} "
                    f"LOADERTOP_STATE_DIR={env['LOADERTOP_STATE_DIR']}")
        if os.environ.get("PYTHONPATH"):  # a running tmux server has its own environment
            tmux_cmd += f" PYTHONPATH={os.environ['PYTHONPATH']}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(SIZE[0]),
                        "-y", str(SIZE[1]), f"{tmux_cmd} {cmd}"], check=True)
        tui = _tui_process(session)
        started = time.monotonic()
        next_connect, next_snapshot, next_reading = started, started + 5, started + args.warmup_s
        while job_proc.poll() is None:
            now = time.monotonic()
            if now >= next_connect:  # the viewer that connects and leaves
                background = [p for p in background if p.poll() is None]
                background.append(subprocess.Popen([*_loadertop(), "snapshot", "--seconds", "5"],
                                                   env=env, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL))
                next_connect += 10
            if now >= next_snapshot:
                res = subprocess.run([*_loadertop(), "snapshot", "--json", "--seconds", "3"], env=env,
                                     capture_output=True, text=True)
                doc = json.loads(res.stdout) if res.returncode == 0 and res.stdout else None
                src = (doc or {}).get("sources") or [{}]
                documents.append({"t": round(time.monotonic() - started, 1), "rc": res.returncode,
                                  "state": src[0].get("state"), "dropped": src[0].get("dropped"),
                                  "batches_total": src[0].get("batches_total"),
                                  "batches_per_s": src[0].get("batches_per_s")})
                next_snapshot += 30
            if now >= next_reading and now - started <= seconds:
                # the trainer holds a socket per connected viewer: read it with the TUI's alone
                for proc in background:
                    proc.wait()
                background.clear()
                _settled_fds(job_proc.pid)
                workers = [c for c in trainer.children() if c.is_running()]
                readings.append({
                    "t": round(now - started, 1),
                    "trainer": _process_figures(trainer),
                    "workers": [_process_figures(w) for w in sorted(workers, key=lambda p: p.pid)],
                    "tui": _process_figures(tui),
                    "blackbox_bytes": _tree_bytes(work / "state"),
                    "batches": (_read_json(status) or {}).get("batches"),
                })
                print(json.dumps(readings[-1]), flush=True)
                next_reading += 60
            time.sleep(0.25)
        screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                capture_output=True, text=True).stdout
        final = _read_json(status) or {}
        last = subprocess.run([*_loadertop(), "snapshot", "--from", "last", "--json"], env=env,
                              capture_output=True, text=True)
        last_doc = json.loads(last.stdout) if last.returncode == 0 and last.stdout else {}
        ls = subprocess.run([*_loadertop(), "ls", "--json"], env=env, capture_output=True, text=True)
        return {"readings": readings, "snapshots": documents, "screen": screen, "final": final,
                "last_sources": last_doc.get("sources", []), "ls": ls.stdout,
                "job_rc": job_proc.returncode, "budget_bytes": _budget(env)}
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        for proc in background:
            proc.kill()
            proc.wait()
        if job_proc.poll() is None:
            os.killpg(job_proc.pid, signal.SIGKILL)
            job_proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _budget(env: dict) -> int:
    from loadertop.probe.blackbox import budget_bytes

    return budget_bytes(env)


def summary(result: dict) -> int:
    readings = result["readings"]
    if len(readings) < 2:
        print("soak: fewer than two readings after the warm-up; run longer")
        return 1
    first, last = readings[0], readings[-1]
    mib = 1024 * 1024
    rows = [("trainer", first["trainer"], last["trainer"]), ("TUI", first["tui"], last["tui"])]
    rows += [(f"worker {i}", a, b) for i, (a, b) in enumerate(zip(first["workers"], last["workers"]))]
    print(f"\nreadings at {first['t']:.0f} s and {last['t']:.0f} s "
          f"({(last['batches'] - first['batches']) / (last['t'] - first['t']):.0f} batches/s between)")
    print(f"{'process':<10} {'RSS start':>10} {'RSS end':>9} {'Δ MiB':>7} {'USS Δ MiB':>9} "
          f"{'fds':>9} {'shm fds':>9} {'threads':>9}")
    ok = True
    for name, a, b in rows:
        if a.get("gone") or b.get("gone") or a["pid"] != b["pid"]:
            print(f"{name:<10} gone or replaced ({a.get('pid')} → {b.get('pid')})")
            ok = False
            continue
        d_rss, d_uss = (b["rss"] - a["rss"]) / mib, (b["uss"] - a["uss"]) / mib
        flat = abs(d_rss) <= RSS_GOAL_MIB and a["fds"] == b["fds"] and a["threads"] == b["threads"]
        ok &= flat
        print(f"{name:<10} {a['rss'] / mib:>9.1f}M {b['rss'] / mib:>8.1f}M {d_rss:>+7.2f} {d_uss:>+9.2f} "
              f"{a['fds']:>4}→{b['fds']:<4} {a['fds_shm']:>4}→{b['fds_shm']:<4} "
              f"{a['threads']:>4}→{b['threads']:<4}"
              f"{'' if flat else '  <- not flat'}")
    budget = result["budget_bytes"]
    box = [r["blackbox_bytes"] for r in readings]
    within = max(box) <= budget
    ok &= within
    print(f"black box on disk: {box[0] / mib:.2f} MiB at start, {box[-1] / mib:.2f} MiB at end, "
          f"at most {max(box) / mib:.2f} MiB; budget {budget / mib:.0f} MiB"
          f"{'' if within else '  <- over'}")
    dropped = [d["dropped"] for d in result["snapshots"] if d["dropped"] is not None]
    failed = [d for d in result["snapshots"] if d["rc"] != 0]
    print(f"snapshots: {len(result['snapshots'])}, {len(failed)} without the source; dropped per "
          f"window: {dropped}")
    own = result["final"].get("batches")
    counted = max((s.get("batches_total") or 0 for s in result["last_sources"]), default=None)
    every = own is not None and counted == own
    ok &= every and not failed
    print(f"batches: the loop counted {own}, its black box's last report {counted}"
          f"{'' if every else '  <- not every batch counted'}")
    print(f"job exit code {result['job_rc']}; ls: {result['ls'].strip()[:300]}")
    print("verdict:", "flat" if ok else "NOT flat")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=1000.0, help="the loop's pace, batches/s")
    p.add_argument("--workers", type=int, default=4)
    # the viewer's model keeps 120 s of each source's reports and the TUI's graphs 300 points (at
    # its 1 s refresh): it grows until they are full
    p.add_argument("--warmup-s", type=float, default=360.0, help="the first reading, after this")
    p.add_argument("--json", help="write every reading and snapshot here")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    p.add_argument("--status", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        return job(args.seconds, args.rate, args.workers, args.status)
    if not shutil.which("tmux"):
        raise SystemExit("soak: needs tmux (the TUI runs in a real terminal)")
    result = soak(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return summary(result)


if __name__ == "__main__":
    sys.exit(main())
