"""`loadertop run --autotune` against static settings, on a job whose knee is known.

    python tests/benchmarks/autotune.py [--slots 4] [--epochs 20] [--samples 320] [--read-ms 5]
        [--batch-size 8] [--step-ms 0] [--start 2] [--persistent] [--counts 1,2,...]
    python tests/benchmarks/autotune.py --one-epoch [...]

The job (`tests/workloads/autotune_jobs.py`, plain torch) reads through a semaphore of `--slots`
slots shared by its workers, each read holding a slot `--read-ms`: samples/s rise with the workers
up to the slots and stay flat after. Every run is under `loadertop run` (so all pay the same
probe), over the same epochs; the whole-run samples/s is the job's own (all samples / its wall
time, from the first iter() to the last batch):

- static `--start` (the program as written), and each static count of `--counts` (default 1 to
  2 × slots);
- `--autotune` from `--start`: its whole-run rate (the epochs spent exploring included), the
  count it settled on, and the epoch from which it stayed there; its switches inside epochs, as
  the black box kept them (`loadertop snapshot --from last --json`).

`--one-epoch`: the case of docs/autotune.md "Inside an epoch" — one epoch of 16,000 items in
batches of 4, a store serving 5 reads at once (20 ms a read), a 2 ms training step, started at 2
workers; static counts 2 to 10 (1 worker alone would take 5 minutes).

Printed as one JSON document, with the machine's load average before and after (the machine may
be shared). The figures go to docs/performance.md with the machine they ran on.
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
ONE_EPOCH = {"epochs": 1, "samples": 16000, "batch_size": 4, "slots": 5, "read_ms": 20.0,
             "step_ms": 2.0, "start": 2}


def run(args: argparse.Namespace, workers: int, autotune: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "epochs.jsonl"
        env = dict(os.environ, LOADERTOP_DIR=str(Path(tmp) / "d"),
                   LOADERTOP_STATE_DIR=str(Path(tmp) / "s"))
        command = [sys.executable, "-m", "loadertop", "run", "-q",
                   *(["--autotune"] if autotune else []), "--", sys.executable, str(JOB),
                   "--epochs", str(args.epochs), "--workers", str(workers), "--slots",
                   str(args.slots), "--samples", str(args.samples), "--read-ms",
                   str(args.read_ms), "--batch-size", str(args.batch_size), "--step-ms",
                   str(args.step_ms), "--out", str(out),
                   *(["--persistent"] if args.persistent else [])]
        proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                              check=True)
        whole = json.loads(proc.stdout.strip().splitlines()[-1])
        counts = [json.loads(line)["num_workers"] for line in out.read_text().splitlines()]
        tune = None
        if autotune:
            snapshot = subprocess.run([sys.executable, "-m", "loadertop", "snapshot", "--from",
                                       "last", "--json"], env=env, cwd=REPO, capture_output=True,
                                      text=True, check=True)
            tune = json.loads(snapshot.stdout)["sources"][0].get("autotune")
    settled_from = len(counts)
    while settled_from > 0 and counts[settled_from - 1] == counts[-1]:
        settled_from -= 1
    result = {"samples_per_s": round(whole["samples_per_s"], 1),
              "seconds": round(whole["seconds"], 2), "counts": counts,
              "final": counts[-1], "stable_from_epoch": settled_from + 1,
              "stderr_tail": proc.stderr.strip().splitlines()[-1:] if autotune else []}
    if tune is not None:
        result["switches"] = [
            f"{s['from']} -> {s['to']} workers at batch {s['batch']:,} of epoch {s['epoch']}"
            + (f": {s['gain']:+.0%}" if s.get("gain") is not None else "") + f" ({s['reason']})"
            for s in tune.get("switches", [])]
        result["tried"] = {t["num_workers"]: t["samples_per_s"] for t in tune["tried"]}
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--one-epoch", action="store_true", help="the one-epoch case (see above)")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--samples", type=int, default=320)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--read-ms", type=float, default=5.0)
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--start", type=int, default=2)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--counts", help="the static counts, comma-separated")
    p.add_argument("--tuned-runs", type=int, default=1, help="--autotune runs (each reported)")
    args = p.parse_args()
    if args.one_epoch:
        for key, value in ONE_EPOCH.items():
            setattr(args, key, value)
        args.counts = args.counts or ",".join(str(n) for n in range(2, 2 * args.slots + 1))
    counts = ([int(n) for n in args.counts.split(",")] if args.counts
              else list(range(1, 2 * args.slots + 1)))
    load_before = os.getloadavg()
    static = {n: run(args, n, False)["samples_per_s"] for n in sorted(set(counts) | {args.start})}
    best = max(static, key=lambda n: static[n])
    tuned = [run(args, args.start, True) for _ in range(args.tuned_runs)]
    for t in tuned:
        if len(t["counts"]) > 40:
            t.pop("counts")
    print(json.dumps({
        "machine_cores": os.cpu_count(), "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "args": vars(args),
        "static_samples_per_s": static, "static_start": static[args.start],
        "static_best": {"num_workers": best, "samples_per_s": static[best]},
        "autotune": tuned,
        "autotune_final_within_5pct_of_best": [static.get(t["final"], 0) >= 0.95 * static[best]
                                               for t in tuned],
        "autotune_whole_run_vs_start": [round(t["samples_per_s"] / static[args.start], 3)
                                        for t in tuned],
        "autotune_whole_run_vs_best": [round(t["samples_per_s"] / static[best], 3)
                                       for t in tuned],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
