"""How many bytes the black box writes per hour (docs/blackbox.md, docs/performance.md).

    python tests/benchmarks/blackbox_bytes.py [--rates 40,250] [--seconds 60] [--workers 2]

Each rate runs in a fresh process: an instrumented loader (2 fork workers, batches of 8 small
tensors) iterated at that many batches a second by a paced loop, no viewer, the black box on with
a budget large enough that nothing is rotated away or thinned. Afterwards the job's files are
measured: the full-detail segments (every frame) and the decimated run file, each as bytes per
hour, and what the default budget holds of each (minutes of full detail, hours of the decimated
run before its first thinning).
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


def _child(rate: float, seconds: float, workers: int) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import loadertop

    torch.set_num_threads(1)
    loader = loadertop.instrument(DataLoader(TensorDataset(torch.arange(10**7).float()), batch_size=8,
                                             num_workers=workers, multiprocessing_context="fork"
                                             if workers else None), name="paced")
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < seconds:
        for _ in loader:
            n += 1
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if time.monotonic() - start >= seconds:
                break
    print(json.dumps({"batches": n, "seconds": time.monotonic() - start}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="40,250")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.seconds, args.workers)
        return
    from loadertop.probe import blackbox

    recent_share = blackbox.BUDGET_BYTES * blackbox.RECENT_SHARE
    run_share = blackbox.BUDGET_BYTES - recent_share
    for rate in (float(r) for r in args.rates.split(",")):
        state = Path(tempfile.mkdtemp(prefix="ltbytes"))
        env = {**os.environ, "LOADERTOP_STATE_DIR": str(state), "LOADERTOP_BLACKBOX_MIB": "1024",
               "LOADERTOP_DIR": tempfile.mkdtemp(prefix="ltdir")}
        env.pop("LOADERTOP_BLACKBOX", None)
        res = subprocess.run([sys.executable, __file__, "--child", str(rate), "--seconds",
                              str(args.seconds), "--workers", str(args.workers)],
                             capture_output=True, text=True, env=env, timeout=args.seconds + 300)
        if res.returncode:
            print(res.stdout, res.stderr)
            continue
        ran = json.loads(res.stdout.strip().splitlines()[-1])
        hours = ran["seconds"] / 3600
        full = sum(p.stat().st_size for p in state.glob("*-recent-*.ltrec"))
        decimated = sum(p.stat().st_size for p in state.glob("*-run.ltrec"))
        print(f"{ran['batches'] / ran['seconds']:6.1f} batches/s for {ran['seconds']:.0f} s: "
              f"full detail {full / hours / 2**20:6.2f} MiB/hour, decimated "
              f"{decimated / hours / 2**10:6.1f} KiB/hour; the default budget "
              f"({blackbox.BUDGET_BYTES / 2**20:.0f} MiB) holds {recent_share / (full / hours) * 60:.0f} "
              f"min in full (at most {blackbox.SEGMENT_S * (blackbox.RECENT_SEGMENTS + 1) / 60:.0f} min: "
              f"segments of {blackbox.SEGMENT_S:.0f} s) and {run_share / (decimated / hours):.0f} h "
              f"decimated before its first thinning", flush=True)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(env["LOADERTOP_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
