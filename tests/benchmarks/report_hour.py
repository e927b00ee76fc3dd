"""How long `loadertop report` takes, and how large its page is, for an hour of one source.

    python tests/benchmarks/report_hour.py [--minutes 60] [--workers 4] [--keep DIR]

Writes a synthetic recording (the fakes' real wire messages: one loader reporting 4 times a
second, its machine once a second; healthy, then input-bound, then healthy with more workers),
then times `loadertop report` on it as a user runs it (a subprocess) and prints the recording's
size, the page's size, the sampling step and the build time. Not a pytest test: about a minute.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from fakes import T0, LoaderSim, MachineSim, WorkerSim  # noqa: E402
from recorded import Recorder  # noqa: E402


def write_hour(path: Path, minutes: float, workers: int) -> None:
    loader = LoaderSim(wobble=0.3, workers=[WorkerSim(fetch_p50_ms=90.0 + 2 * i) for i in range(workers)])
    machine = MachineSim(wobble=0.2)
    rec = Recorder(path, [loader], [machine])
    third = minutes * 60 / 3
    rec.run(T0, T0 + third)
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.45, 30.0, 60.0
    loader.batches_per_s, machine.iowait_percent = 20.0, 24.0
    for w in loader.workers:
        w.cpu_fraction, w.fetch_p50_ms, w.fetch_p95_ms = 0.2, 190.0, 260.0
    rec.run(T0 + third, T0 + 2 * third)
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.012, 0.08, 0.9
    loader.batches_per_s, machine.iowait_percent = 41.6, 0.4
    rec.run(T0 + 2 * third, T0 + 3 * third)
    rec.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--keep", metavar="DIR", help="write the recording and the page here")
    args = p.parse_args()
    directory = Path(args.keep or tempfile.mkdtemp(prefix="ltreport"))
    directory.mkdir(parents=True, exist_ok=True)
    recording = directory / "hour.ltrec"
    page = directory / "hour.html"
    for stale in (recording, page):
        stale.unlink(missing_ok=True)
    started = time.monotonic()
    write_hour(recording, args.minutes, args.workers)
    print(f"recording: {args.minutes:g} min, {recording.stat().st_size / 1e6:.2f} MB "
          f"(written in {time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(TESTS.parent))
    # In the repo: `-m` puts the working directory first on sys.path, before PYTHONPATH.
    subprocess.run([sys.executable, "-m", "loadertop", "report", str(recording), "-o", str(page)],
                   check=True, env=env, cwd=TESTS.parent)
    took = time.monotonic() - started
    text = page.read_text()
    step = re.search(r"one every ([\d.]+) s", text)
    print(f"report: {page.stat().st_size / 1e6:.2f} MB, {text.count('<svg')} plots, one document "
          f"every {step.group(1) if step else '?'} s, built in {took:.1f} s (the command, imports included)")
    print(f"files in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
