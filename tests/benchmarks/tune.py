"""`loadertop tune` against an exhaustive sweep, on a job whose knee is known.

    python tests/benchmarks/tune.py [--slots 3] [--max 8] [--trial-seconds 3]

The job (`tests/workloads/tune_jobs.py knee`) reads through a semaphore of `--slots` slots shared
by its workers, each read holding a slot 20 ms: samples/s rise with the workers up to the slots
and stay flat after. Both runs use `loadertop tune` itself, so they measure alike:

- the sweep: `--workers 0,1,...,MAX` (every count once);
- the search: the default strategy (a quarter of the cores, +2 a trial, stop under 5 %, ±1).

Printed: each sweep count's samples/s, the sweep's best and its knee (the smallest count within
5 % of the best), tune's trials and pick, whether the pick is within 5 % of the sweep's best
(measured in the sweep), the time of each run and their ratio (the target: at most half), and
what two fixed rules would have picked on this machine: Lightning's `cpus - 1` (its warning's
suggestion) and the guide's "start at half the cores". Exit 0 when both targets are met.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "workloads" / "tune_jobs.py"

sys.path.insert(0, str(REPO))
from loadertop.system.host import cores_available  # noqa: E402

WITHIN = 0.05


def run_tune(args: list[str], job: list[str]) -> tuple[dict, float]:
    env = dict(os.environ)
    env["LOADERTOP_DIR"] = tempfile.mkdtemp(prefix="ltb", dir="/tmp")
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "loadertop", "tune", "--json", *args, "--",
                               sys.executable, str(JOB), *job], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(env["LOADERTOP_DIR"], ignore_errors=True)
    took = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"tune exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), took


def rates_of(doc: dict) -> dict[int, float]:
    """samples/s per count, runs merged by their mean (as tune's table shows them)."""
    runs: dict[int, list[float]] = {}
    for trial in doc["trials"]:
        if trial["samples_per_s"] is not None and trial["exit"] is None:
            runs.setdefault(trial["num_workers"], []).append(trial["samples_per_s"])
    return {c: sum(v) / len(v) for c, v in sorted(runs.items())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--read-ms", type=float, default=20.0)
    p.add_argument("--max", type=int, default=8, help="the sweep's last count (tune's own "
                   "default ceiling on 2 cores is 8)")
    p.add_argument("--trial-seconds", type=float, default=3.0)
    args = p.parse_args()
    job = ["knee", "--slots", str(args.slots), "--read-ms", f"{args.read_ms:g}"]
    trial = ["--trial-seconds", f"{args.trial_seconds:g}"]
    cores = cores_available(detect_quota=True)
    print(f"job: {' '.join(job)} (knee at {args.slots} workers); cores available {cores:g}; "
          f"trials of {args.trial_seconds:g} s")

    sweep_doc, sweep_s = run_tune(["--workers", ",".join(map(str, range(args.max + 1))), *trial], job)
    sweep = rates_of(sweep_doc)
    best_count = max(sweep, key=lambda c: sweep[c])
    best = sweep[best_count]
    knee = min(c for c, r in sweep.items() if r * (1 + WITHIN) >= best)
    print("\nsweep (every count once):")
    for count, rate in sweep.items():
        print(f"  num_workers={count:<2d} {rate:7.1f} samples/s  {rate / best * 100:5.1f} % of best")
    print(f"  best: num_workers={best_count} ({best:.1f}); knee (smallest within 5 %): {knee}; "
          f"{len(sweep_doc['trials'])} trials in {sweep_s:.0f} s")

    tune_doc, tune_s = run_tune(trial, job)
    picked = tune_doc["best"]["num_workers"] if tune_doc["best"] else None
    print("\ntune (default search):")
    for t in tune_doc["trials"]:
        spread = t["spread_samples_per_s"]
        print(f"  num_workers={t['num_workers']:<2d} {t['samples_per_s'] or 0:7.1f} samples/s"
              f" ±{spread or 0:.1f}  ({t['reason']})")
    print(f"  pick: num_workers={picked}; {len(tune_doc['trials'])} trials in {tune_s:.0f} s")
    print(f"  recommendation: {tune_doc['recommendation']}")
    print(f"  search ended: {tune_doc['stopped_because']}")

    lightning = max(0, int(cores) - 1)
    half = max(1, int(cores // 2))
    print("\nfixed rules on this machine (their samples/s from the sweep):")
    for name, count in (("Lightning's cpus - 1", lightning), ("the guide's half the cores", half)):
        rate = sweep.get(min(count, args.max))
        print(f"  {name}: num_workers={count} -> {rate:.1f} samples/s "
              f"({rate / best * 100:.0f} % of best)" if rate else f"  {name}: {count}")

    picked_rate = sweep.get(picked) if picked is not None else None
    quality = picked_rate is not None and picked_rate * (1 + WITHIN) >= best
    speed = tune_s <= sweep_s / 2
    print(f"\npick within 5 % of the sweep's best: {'yes' if quality else 'NO'} "
          f"({(picked_rate or 0) / best * 100:.1f} % of it, as the sweep measured num_workers="
          f"{picked})")
    print(f"time: tune {tune_s:.0f} s vs sweep {sweep_s:.0f} s = {tune_s / sweep_s:.2f} "
          f"({'at most half' if speed else 'MORE than half'})")
    return 0 if quality and speed else 1


if __name__ == "__main__":
    sys.exit(main())
