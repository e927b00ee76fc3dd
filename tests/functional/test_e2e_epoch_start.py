"""End to end (issue 46 §6): a loader whose workers are not persistent and take ~2 s each to
start (a costly worker_init_fn), with short epochs. Nearly all of the loop's wait is for the
workers to start; the verdict, on the real screen and in `snapshot --json`, says so, and its
first advice is `persistent_workers=True` — not "make transforms cheaper".

One real job (fork, 2 workers, 8 batches of cheap items an epoch), the real viewer app on its
socket (polled, no fixed sleeps, until the banner shows the category) and `loadertop snapshot
--json` twice in a row (the verdict stays put). The workers sleep in worker_init_fn: the job
needs no CPU, so a loaded machine delays it but does not change its verdict.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from loadertop.client.model import Model
from loadertop.client.subscriber import NetworkFeed, Subscriber
from loadertop.tui.app import LoadertopApp
from loadertop.tui.widgets import Banner

from conftest import check_document, snapshot, source_of, wait_for

pytestmark = pytest.mark.slow

WORKER_START_S = 2.0
DEADLINE_S = 90.0  # job start (torch's import, loaded machine) + two epochs + the stabilizer
JOB = ("--kind", "cheap", "--workers", 2, "--context", "fork", "--batch-size", 4,
       "--worker-init-s", WORKER_START_S, "--epochs", 60, "--batches", 8, "--duration", 150)


def _banner_of(wl) -> str:
    """The banner of the real app, subscribed to the job's socket, once it names a category of
    its own (the first verdicts are about too few batches)."""
    endpoint = wl.wait_discovery()["endpoint"]
    feed = NetworkFeed(Subscriber(Model(), [endpoint], directory=wl.dir, discover=False))
    app = LoadertopApp(feed, refresh_s=0.25)
    seen: list[str] = []
    last = [""]

    async def main() -> None:
        async with app.run_test(size=(160, 40)) as pilot:
            banner = app.query_one(Banner)
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and not seen:
                await pilot.pause(0.2)
                last[0] = text = " ".join(banner.text().split())
                if text.startswith("INPUT-BOUND: EPOCH START-UP"):
                    seen.append(text)
                assert wl.alive(), wl.stderr()[-3000:]
            await pilot.press("q")

    asyncio.run(main())
    assert seen, f"the banner never named the epoch start within {DEADLINE_S:g} s: {last[0]!r}"
    return seen[0]


def test_workers_that_start_slowly_every_epoch_are_the_verdict(workload):
    wl = workload(*map(str, JOB))
    banner = _banner_of(wl)
    assert "its 2 workers start anew every epoch" in banner, banner
    assert "→ persistent_workers=True: the workers, and what they set up when they start" in banner

    def judged():
        rc, doc, _out, err = snapshot(wl.dir, seconds=3.0)
        assert rc == 0, err
        check_document(doc)
        return doc if doc["diagnosis"]["category"] == "epoch_start_bound" else None

    for _ in range(2):  # twice in a row: it stays put
        doc = wait_for(judged, 30, "the epoch-start verdict in snapshot --json")
        top = doc["diagnosis"]
        src = source_of(doc, wl.pid)
        assert top["source"] == src["id"] and src["diagnosis"]["category"] == "epoch_start_bound"
        # the summary: the wait, most of it at the starts, and why
        assert top["summary"].startswith("the loop waits "), top
        assert "of it for each epoch's first batch (" in top["summary"], top
        assert top["summary"].endswith(": its 2 workers start anew every epoch"), top
        # the evidence: the split of the wait, at the starts and between them
        split = top["evidence"][0]
        assert re.fullmatch(r"the last (epoch's|\d+ epochs') wait: .+ at (its start|their starts) "
                            r"\(from iter\(\) to the first batch\), .+ (after it|between them): "
                            r"\d+ % at the starts? \(threshold 50 %\)", split), split
        ended = [e for e in src["epochs"]]
        starts = sum(e["start_ms"] for e in ended)
        assert starts >= 0.5 * (starts + sum(e["run_wait_ms"] for e in ended)), ended
        assert all(e["start_ms"] >= 1000.0 * WORKER_START_S for e in ended), ended
        assert "persistent_workers=False: 2 workers (fork) start anew each epoch" in top["evidence"]
        # the advice: what fixes it first, then the set-up; nothing of the steady-state cases
        assert top["advice"][0].startswith("persistent_workers=True"), top["advice"]
        assert top["advice"][1].startswith("move the costly set-up out of the workers' start"), \
            top["advice"]
        text = " ".join(top["advice"])
        assert "transforms" not in text and "collate_fn" not in text and "num_workers=" not in text
        # the finding beside it agrees
        assert any(f["kind"] == "epoch_start_slow" for f in src["findings"]), src["findings"]
