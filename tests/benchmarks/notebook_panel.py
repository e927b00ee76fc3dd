"""What the notebook's live panel costs the kernel it runs in (docs/notebook.md; goal: its thread
<= 2 % of a core at the 1 s refresh).

    python tests/benchmarks/notebook_panel.py [--seconds 30] [--rounds 2]

Starts a real Jupyter kernel (ipykernel, this Python) per variant and round, and runs in it what
a notebook would: `%load_ext loadertop`, `%loadertop on`, a loader with 2 persistent workers
(small tensors, ~40 batches/s with a 25 ms step), then — in the `panel` variant only —
`loadertop.show()`, then a training loop: after a warm-up, `--seconds` of training measured from
inside the kernel:

- the panel's thread (`loadertop-panel`), read from its own CPU clock
  (`time.pthread_getcpuclockid`): reading the document, drawing the HTML, sending the update;
- the publisher thread, which samples more while a reader is open (the queue, the machine: what
  it samples for any subscribed viewer);
- the kernel process as a whole (every thread: the loop, the IOPub thread that sends the
  updates, ipykernel's own), with and without the panel: the difference is all the panel costs;
- the `update_display_data` messages the front end received (this script is the front end).

The variants alternate within each round (`none`, `panel`), each in a fresh kernel. Not a pytest
test: its figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: its notebook_kernel
from notebook_kernel import kernel_manager

GOAL_PERCENT = 2.0
WARMUP_S = 6.0  # the first document's window filled, the panel's first updates past
STEP_S = 0.025

SETUP = textwrap.dedent("""
    %load_ext loadertop
    %loadertop on
    import json, threading, time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Items(Dataset):
        def __len__(self):
            return 10_000_000

        def __getitem__(self, i):
            return torch.full((3, 8, 8), float(i % 7))

    train_loader = DataLoader(Items(), batch_size=16, num_workers=2, persistent_workers=True)
""")
SHOW = "import loadertop\nloadertop.show()"
TRAIN = textwrap.dedent("""
    from loadertop.integrations import notebook

    def thread_cpu(name):
        thread = next((t for t in threading.enumerate() if t.name == name), None)
        return None if thread is None else time.clock_gettime(time.pthread_getcpuclockid(thread.ident))

    it = iter(train_loader)
    warm = time.monotonic() + {warmup}
    while time.monotonic() < warm:
        next(it)
        time.sleep({step})
    panel = notebook.live_panel()
    marks = (thread_cpu("loadertop-panel"), thread_cpu("loadertop-publisher"), time.process_time(),
             time.monotonic(), panel.updates if panel else 0)
    batches = 0
    while time.monotonic() < marks[3] + {seconds}:
        next(it)
        time.sleep({step})
        batches += 1
    wall = time.monotonic() - marks[3]

    def share(before, after):
        return None if before is None or after is None else round(100 * (after - before) / wall, 3)

    print(json.dumps({{"panel_pct": share(marks[0], thread_cpu("loadertop-panel")),
                       "publisher_pct": share(marks[1], thread_cpu("loadertop-publisher")),
                       "process_pct": share(marks[2], time.process_time()),
                       "updates": (panel.updates if panel else 0) - marks[4],
                       "batches_per_s": round(batches / wall, 1), "wall_s": round(wall, 1)}}))
""")


def _kernel(work: Path):
    km = kernel_manager(work / "kernels")
    env = {**os.environ, "LOADERTOP_DIR": str(work / "rt"), "LOADERTOP_STATE_DIR": str(work / "state")}
    env.pop("LOADERTOP_DISABLE", None)
    km.start_kernel(env=env, cwd=str(work))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def _execute(kc, code: str, timeout: float) -> tuple[str, int]:
    """(stdout, update_display_data messages received) of one cell; raises on an error."""
    out: list[str] = []
    updates = 0

    def hook(msg: dict) -> None:
        nonlocal updates
        kind = msg["header"]["msg_type"]
        if kind == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        elif kind == "update_display_data":
            updates += 1
        elif kind == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the cell failed: {reply['content']}")
    return "".join(out), updates


def measure(panel: bool, seconds: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="ltnb"))
    km = kc = None
    try:
        km, kc = _kernel(work)
        _execute(kc, SETUP, 300)
        if panel:
            _execute(kc, SHOW, 60)
        out, received = _execute(kc, TRAIN.format(warmup=WARMUP_S, step=STEP_S, seconds=seconds),
                                 seconds + WARMUP_S + 120)
        figures = json.loads(out.strip().splitlines()[-1])
        figures["updates_received"] = received
        return figures
    finally:
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            km.shutdown_kernel(now=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="training measured per run")
    parser.add_argument("--rounds", type=int, default=2, help="each variant this many times, alternated")
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        for variant in ("none", "panel"):
            figures = measure(variant == "panel", args.seconds)
            rows.append((variant, figures))
            print(f"round {r + 1} {variant:<5}  {json.dumps(figures)}", flush=True)
    panel = [f["panel_pct"] for v, f in rows if v == "panel"]
    process = {v: [f["process_pct"] for w, f in rows if w == v] for v in ("none", "panel")}
    publisher = {v: [f["publisher_pct"] for w, f in rows if w == v] for v in ("none", "panel")}
    print(f"\nthe panel's thread: {min(panel):.2f}-{max(panel):.2f} % of a core "
          f"(goal <= {GOAL_PERCENT:g} %)")
    print(f"the publisher thread: {min(publisher['none']):.2f}-{max(publisher['none']):.2f} % without "
          f"the panel, {min(publisher['panel']):.2f}-{max(publisher['panel']):.2f} % with it")
    print(f"the kernel process: {min(process['none']):.1f}-{max(process['none']):.1f} % without, "
          f"{min(process['panel']):.1f}-{max(process['panel']):.1f} % with")
    return 0 if max(panel) <= GOAL_PERCENT else 1


if __name__ == "__main__":
    sys.exit(main())
