"""End to end: a real instrumented training job, the real viewer app, the real socket.

The job runs in a subprocess with a private discovery directory and an explicit ipc endpoint; the
app subscribes to that endpoint only. The test polls the screen (no fixed sleeps) until the
loader panel names the source and shows a nonzero batch rate, the banner a real verdict and the
machine panels the trainer's machine.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from loadertop.client.model import Model
from loadertop.client.subscriber import NetworkFeed, Subscriber
from loadertop.tui.app import LoadertopApp
from loadertop.tui.theme import CATEGORY_STYLES
from loadertop.tui.widgets import Banner, CpuPanel, LoaderPanel, WorkersTable

pytestmark = pytest.mark.slow

DEADLINE_S = 60.0  # torch's import alone takes 1.5 s here, much more on a loaded machine

JOB = textwrap.dedent("""
    import os, sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    import loadertop

    class Squares(Dataset):
        def __len__(self):
            return 100_000
        def __getitem__(self, i):
            return torch.tensor([i * i], dtype=torch.float32)

    parent = os.getppid()
    loader = loadertop.instrument(DataLoader(Squares(), batch_size=8, num_workers=1), name="e2e-train")
    end = time.monotonic() + 120
    for batch in loader:
        time.sleep(0.01)  # the training step
        if time.monotonic() > end or os.getppid() != parent:  # never outlive the test
            break
""")


def _rate(text: str) -> float:
    m = re.search(r"([\d.]+) batches/s", text)
    return float(m.group(1)) if m else 0.0


def test_real_job_shows_in_the_real_app(tmp_path):
    endpoint = f"ipc://{tmp_path}/e2e.sock"
    env = {**os.environ, "LOADERTOP_DIR": str(tmp_path), "LOADERTOP_ENDPOINT": endpoint}
    env.pop("LOADERTOP_DISABLE", None)
    job = subprocess.Popen([sys.executable, "-c", JOB], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: dict[str, str] = {}
    try:
        feed = NetworkFeed(Subscriber(Model(), [endpoint], directory=tmp_path, discover=False))
        app = LoadertopApp(feed, refresh_s=0.2)

        async def main() -> None:
            async with app.run_test(size=(120, 40)) as pilot:
                panel = app.query_one(LoaderPanel)
                workers = app.query_one(WorkersTable)
                banner, cpu = app.query_one(Banner), app.query_one(CpuPanel)
                deadline = time.monotonic() + DEADLINE_S
                while time.monotonic() < deadline:
                    await pilot.pause(0.1)
                    text = panel.text()
                    # The workers table refreshes at most ~2 Hz: it may follow a tick later.
                    if "e2e-train" in str(panel.border_title) and _rate(text) > 0 \
                            and workers.row_count == 1 and cpu.text().startswith("CPU "):
                        seen["panel"] = text
                        seen["workers"] = str(workers.border_title)
                        seen["banner"] = " ".join(banner.text().split())
                        seen["summary"] = app.document.diagnosis.summary
                        source = app.document.sources[0].id
                        seen["rate_points"] = str(len(app.history.loader(LoaderPanel.RATE, source)))
                        break
                    assert job.poll() is None, job.stderr.read().decode(errors="replace")
                await pilot.press("q")

        asyncio.run(main())
    finally:
        job.kill()
        job.wait(10)
    assert seen, f"no data shown within {DEADLINE_S:g} s"
    assert "batches/s" in seen["panel"] and _rate(seen["panel"]) > 0
    assert "Workers (1" in seen["workers"]
    # The banner says what the real diagnosis said, in the screen's words for its category.
    assert any(seen["banner"].startswith(style.words.upper()) for style in CATEGORY_STYLES.values())
    assert seen["summary"] in seen["banner"]
    assert int(seen["rate_points"]) >= 1  # the graph's history follows the source
