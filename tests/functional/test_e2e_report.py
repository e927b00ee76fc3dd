"""`loadertop report` end to end: a real instrumented job recorded by `loadertop record`, the
report written by `loadertop report`, and the page opened in a real headless Chromium (Debian's
`chromium`; `.ci/run` installs it) with its network cut off: the screenshot must show the plots.

One recording and one page serve every test here (a ~6 s job, 5 s recorded)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from loadertop.recording import plots
from loadertop.views import palette
from loadertop.views.palette import CATEGORY_STYLES

from conftest import CHROMIUM_FLAGS, REPO, WorkloadPool, chromium, clean_env, loadertop_cmd, short_tmpdir
from recorded import needed

pytestmark = pytest.mark.slow

RECORD_S = 5.0
WINDOW = (1100, 3000)  # the screenshot: the page's width, tall enough for every plot


@pytest.fixture(scope="module")
def report():
    """(the recording, the page) of a real job: 2 sleeping workers whose dataset draws from one
    numpy Generator made in `__init__` (a `duplicate_rng` finding), recorded for `RECORD_S`."""
    pool = WorkloadPool()
    directory = short_tmpdir()
    try:
        # fresh: a real `python train.py`, whose command line the page shows
        job = pool("--kind", "sleep", "--ms", "5", "--workers", "2", "--batch-size", "8",
                   "--step-ms", "10", "--duration", "12", "--rng", "init", directory=directory,
                   fresh=True)
        job.wait_batches(3)
        recording, page = directory / "job.ltrec", directory / "job.html"
        env = clean_env(directory)
        subprocess.run(loadertop_cmd("record", "-o", str(recording), "--seconds", f"{RECORD_S:g}"),
                       env=env, cwd=REPO, check=True, capture_output=True, timeout=RECORD_S + 30)
        done = subprocess.run(loadertop_cmd("report", str(recording), "-o", str(page)), env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith(f"loadertop: wrote {page} (")
        yield job, recording, page
    finally:
        pool.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_page_of_a_real_job(report):
    job, _recording, page = report
    text = page.read_text()
    for plot_id in ("plot-loader-0", "plot-workers-0", "plot-machine"):
        assert f'<figure id="{plot_id}" class="plot"><svg' in text
    assert "tests/workloads/train.py --kind sleep --ms 5 --workers 2" in text  # the job's command
    assert f"(pid {job.pid} on " in text
    assert "<code>duplicate_rng</code>" in text
    assert "<script" not in text.lower()


def test_chromium_draws_the_plots(report, tmp_path):
    browser = chromium()
    needed(browser, "no Chromium (apt-get install chromium)")
    _job, _recording, page = report
    shot = tmp_path / "report.png"
    done = subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from PIL import Image  # matplotlib's own dependency: installed with the report's extra

    with Image.open(shot) as image:
        assert image.size == WINDOW
        pixels = image.convert("RGB")
        counts: dict[tuple[int, int, int], int] = {}
        for colour, n in ((c, n) for n, c in pixels.getcolors(maxcolors=WINDOW[0] * WINDOW[1])):
            counts[colour] = n
    white = counts.get((255, 255, 255), 0)
    assert white < 0.97 * WINDOW[0] * WINDOW[1], "the page is blank"

    def rgb(hex_colour: str) -> tuple[int, int, int]:
        return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]

    # The plots' lines (wait, samples/s, CPU, memory) in their colour, and one worker's line.
    assert counts.get(rgb(plots.LINE), 0) > 500, "no plot line drawn"
    assert counts.get(rgb(plots.SERIES_COLOURS[1]), 0) > 100, "no line for worker 1"
    # The verdict band: a strip of solid colour the width of the plot, in a category's colour.
    categories = {rgb(palette.category_colour(c)) for c in CATEGORY_STYLES}
    band = max(counts.get(c, 0) for c in categories)
    assert band > 5000, f"no verdict band (largest category-coloured area {band} px)"
