"""`loadertop run --autotune` against static settings, on a job whose knee is known.

    python tests/benchmarks/autotune.py [--slots 4] [--epochs 20] [--samples 320] [--read-ms 5]
        [--start 2] [--persistent]

The job (`tests/workloads/autotune_jobs.py`, plain torch) reads through a semaphore of `--slots`
slots shared by its workers, each read holding a slot `--read-ms`: samples/s rise with the workers
up to the slots and stay flat after. Every run is under `loadertop run` (so all pay the same
probe), over the same epochs; the whole-run samples/s is the job's own (all samples / its wall
time, from the first iter() to the last batch):

- static `--start` (the program as written), and each static count from 1 to 2 × slots;
- `--autotune` from `--start`: its whole-run rate (the epochs spent exploring included), the
  count it settled on, and the epoch from which it stayed there.

Printed as one JSON document. The figures go to docs/performance.md with the machine they ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "workloads" / "autotune_jobs.py"


def run(args: argparse.Namespace, workers: int, autotune: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "epochs.jsonl"
        env = dict(os.environ, LOADERTOP_DIR=str(Path(tmp) / "d"),
                   LOADERTOP_STATE_DIR=str(Path(tmp) / "s"))
        command = [sys.executable, "-m", "loadertop", "run", "-q",
                   *(["--autotune"] if autotune else []), "--", sys.executable, str(JOB),
                   "--epochs", str(args.epochs), "--workers", str(workers), "--slots",
                   str(args.slots), "--samples", str(args.samples), "--read-ms",
                   str(args.read_ms), "--out", str(out),
                   *(["--persistent"] if args.persistent else [])]
        proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                              check=True)
        whole = json.loads(proc.stdout.strip().splitlines()[-1])
        counts = [json.loads(line)["num_workers"] for line in out.read_text().splitlines()]
    settled_from = len(counts)
    while settled_from > 0 and counts[settled_from - 1] == counts[-1]:
        settled_from -= 1
    return {"samples_per_s": round(whole["samples_per_s"], 1),
            "seconds": round(whole["seconds"], 2), "counts": counts,
            "final": counts[-1], "stable_from_epoch": settled_from + 1,
            "stderr_tail": proc.stderr.strip().splitlines()[-1:] if autotune else []}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--read-ms", type=float, default=5.0)
    p.add_argument("--start", type=int, default=2)
    p.add_argument("--persistent", action="store_true")
    args = p.parse_args()
    static = {n: run(args, n, False)["samples_per_s"] for n in range(1, 2 * args.slots + 1)}
    best = max(static, key=lambda n: static[n])
    tuned = run(args, args.start, True)
    tuned.pop("counts") if len(tuned["counts"]) > 40 else None
    print(json.dumps({
        "machine_cores": os.cpu_count(), "args": vars(args),
        "static_samples_per_s": static, "static_start": static[args.start],
        "static_best": {"num_workers": best, "samples_per_s": static[best]},
        "autotune": tuned,
        "autotune_final_within_5pct_of_best": static[tuned["final"]] >= 0.95 * static[best],
        "autotune_whole_run_vs_start": round(tuned["samples_per_s"] / static[args.start], 3),
        "autotune_whole_run_vs_best": round(tuned["samples_per_s"] / static[best], 3),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
