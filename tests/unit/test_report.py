"""`loadertop report`: recordings written from the fakes' real wire messages (`recorded.Recorder`:
`wire.encode` + the real `RecordingWriter`), read back, played through the live Model, and the
page checked for its parts: each plot, the verdict bands in the TUI's category colours, the
findings with their stack, the final summary, the header — and every text of the recording
escaped. The command's bad inputs each give one line and a non-zero exit."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadertop import cli, diagnosis
from loadertop.recording import plots, series
from loadertop.recording.file import MAGIC, read
from loadertop.recording.playback import STEP_S, Playback
from loadertop.recording.report import html_report
from loadertop.views import palette
from loadertop.views.palette import CATEGORY_STYLES
from loadertop.views.text import render_text

from fakes import (
    LOOP_WAIT_STACK,
    LOOP_WAIT_USER_FRAME,
    T0,
    WORKER_STACK,
    WORKER_USER_FRAME,
    GpuSim,
    LoaderSim,
    MachineSim,
    PitfallSim,
    WorkerSim,
    _rng_share,
    stack,
)
from recorded import Recorder, needed


@pytest.fixture(autouse=True, scope="module")
def _matplotlib():
    """The extra `loadertop[report]` (CI installs it with `test`)."""
    try:
        import matplotlib
    except ImportError:
        matplotlib = None
    needed(matplotlib, "matplotlib is not installed (pip install 'loadertop[report]')")

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert(1)</script>"
REPORT_DELAY = 0.25  # a recording's first frame: the first report, a quarter second after its start


def _phases(path: Path) -> None:
    """52 s of one loader: healthy (its workers sharing a random state from the start), then
    input-bound on I/O from 20 s, then from 40 s worker 1 stuck in one batch (its stack under the
    dataset's `_read_record`) with the loop blocked behind it: three verdicts, three findings."""
    loader = PitfallSim(rng_checked=4, rng_shared=[_rng_share()])
    machine = MachineSim()
    rec = Recorder(path, [loader], [machine], argv=["loadertop", "record", "-o", str(path)])
    rec.run(T0, T0 + 20)
    loader.wait_fraction, loader.wait_p50_ms, loader.wait_p95_ms = 0.45, 30.0, 60.0
    loader.batches_per_s = 20.0
    machine.iowait_percent = 24.0
    for w in loader.workers:
        w.cpu_fraction, w.fetch_p50_ms, w.fetch_p95_ms = 0.2, 190.0, 260.0
    rec.run(T0 + 20, T0 + 40)
    loader.blocked_ms, loader.busy_ms = 12_000.0, {1: 12_500.0}
    loader.worker_stacks = {1: stack(WORKER_STACK, WORKER_USER_FRAME)}
    loader.loop_stack = stack(LOOP_WAIT_STACK, LOOP_WAIT_USER_FRAME, taken_at=T0 + 50)
    rec.run(T0 + 40, T0 + 52)
    rec.close()


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    """(recording path, its timeline, the page)."""
    path = tmp_path_factory.mktemp("report") / "phases.ltrec"
    _phases(path)
    recording = read(str(path))
    timeline = series.timeline(Playback(recording))
    return path, timeline, html_report(recording, timeline)


def _figure(page: str, plot_id: str) -> str:
    match = re.search(rf'<figure id="{plot_id}" class="plot">(.*?)</figure>', page, re.S)
    assert match, f"no figure {plot_id}"
    return match.group(1)


def _fills(svg: str) -> set[str]:
    """The fill colours of an SVG: of its shapes (style) and of its hatch patterns (attribute)."""
    return set(re.findall(r"""fill(?::\s*|=")(#[0-9a-f]{6})""", svg))


# --------------------------------------------------------------------------- the page's parts


def test_each_plot_is_an_inline_svg(phases):
    _path, _timeline, page = phases
    for plot_id in ("plot-loader-0", "plot-workers-0", "plot-machine", "plot-gpu"):
        svg = _figure(page, plot_id)
        assert svg.startswith("<svg") and svg.count("<svg") == 1
        assert "<path" in svg
    assert page.count("<svg") == 4
    # Self-contained: no script, nothing to fetch, no XML prolog inside the HTML.
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page


def test_verdict_bands_in_the_tuis_colours_with_their_shares(phases):
    _path, timeline, page = phases
    shares = dict(timeline.sources[0].category_shares())
    # between the last batch leaving the window and the stall threshold, the loop waits for a
    # batch: the input-bound verdict has no batch left to be said with, so that shows at once
    assert set(shares) == {diagnosis.COMPUTE_BOUND, diagnosis.INPUT_BOUND_IO,
                           diagnosis.INSUFFICIENT_DATA, diagnosis.STALLED}
    assert shares[diagnosis.INSUFFICIENT_DATA] <= 3 / 52
    assert shares[diagnosis.COMPUTE_BOUND] == pytest.approx(20 / 52, abs=0.08)
    assert shares[diagnosis.INPUT_BOUND_IO] == pytest.approx(20 / 52, abs=0.08)
    loader_svg = _figure(page, "plot-loader-0")
    for category in shares:
        assert palette.category_colour(category) in _fills(loader_svg), category
        assert html.escape(CATEGORY_STYLES[category].words) in page  # the summary's words
    assert palette.category_colour(diagnosis.CPU_SATURATED) == palette.category_colour(diagnosis.STALLED)
    assert palette.category_colour(diagnosis.COMPUTE_BOUND) == palette.PAPER_COLOURS["green"]
    # The hatch that tells stalled from the other red verdicts is drawn.
    assert 'id="h' in loader_svg and "<pattern" in loader_svg


def test_findings_with_their_stack_and_user_frame(phases):
    _path, timeline, page = phases
    kinds = [s.finding.kind for s in timeline.findings]
    assert kinds == ["worker_hung", "loop_hung", "duplicate_rng"]  # most severe first
    findings = page[page.index('<h2 id="findings">'):page.index('<h2 id="summary">')]
    for seen in timeline.findings:
        assert f"<code>{seen.finding.kind}</code>" in findings
        assert html.escape(seen.finding.summary) in findings
        for evidence in seen.finding.evidence:
            assert html.escape(evidence) in findings
    user_frames = re.findall(r'<span class="user-frame">(.*?)</span>', findings)
    assert html.escape(WORKER_STACK[WORKER_USER_FRAME]) + "   ← your code" in user_frames
    assert html.escape(LOOP_WAIT_STACK[LOOP_WAIT_USER_FRAME]) + "   ← your code" in user_frames
    assert "since 0:00" in findings and "still listed at the end" in findings


def test_final_summary_is_the_snapshot_text_of_the_last_document(phases):
    path, timeline, page = phases
    assert timeline.final.taken_at == pytest.approx(T0 + 52)
    assert html.escape(render_text(timeline.final)) in page
    assert f"loadertop snapshot --from {html.escape(str(path))}" in page


def test_header_names_the_command_host_times_and_versions(phases):
    path, timeline, page = phases
    header = page[:page.index('<div class="verdict"')]
    assert "<h1>loadertop report: train on gpu-node-1</h1>" in header
    assert "<code>python train.py --config configs/resnet50.yaml</code>" in header
    assert f"<code>loadertop record -o {html.escape(str(path))}</code>" in header
    assert "51.8 s" in header and "loadertop 0." in header  # the first report came at 0.25 s
    assert f"{timeline.documents} documents, one every 1 s" in header
    assert "ended: stopped" in header


def test_worker_lines_one_per_worker(phases):
    _path, timeline, page = phases
    workers = timeline.sources[0].workers
    assert [w.id for w in workers] == [0, 1, 2, 3]
    svg = _figure(page, "plot-workers-0")
    for colour in plots.SERIES_COLOURS[:4]:
        assert f"stroke: {colour}" in svg
    # Worker 1, stuck in one batch, has no fetch time in its last documents: a gap, not a 0.
    assert workers[1].fetch_p50_ms[-1] is None and workers[0].fetch_p50_ms[-1] is None
    assert workers[1].fetch_p50_ms[10] == pytest.approx(90 + 2, rel=0.2)


# --------------------------------------------------------------------------- hostile text


def test_every_text_of_the_recording_is_escaped(tmp_path):
    path = tmp_path / "hostile.ltrec"
    loader = LoaderSim(name=HOSTILE, command=f"python train.py --tag '{HOSTILE}' & \"x\"",
                       dataset="<img src=x onerror=alert(2)>", host="<b>host</b>")
    machine = MachineSim(host="<b>host</b>", gpus=[GpuSim(name=f"{HOSTILE} -- $x$")])
    rec = Recorder(path, [loader], [machine], argv=["loadertop", "record", HOSTILE])
    rec.run(T0, T0 + 8)
    rec.close()
    recording = read(str(path))
    page = html_report(recording, series.timeline(Playback(recording)))
    assert "<script" not in page.lower()
    assert "<img" not in page and "<b>host" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "--tag &#x27;&lt;script&gt;alert(1)&lt;/script&gt;&#x27; &amp; &quot;x&quot;" in page
    assert "GPU 0: &lt;script&gt;alert(1)&lt;/script&gt; -- $x$" in page
    for svg in re.findall(r"<svg.*?</svg>", page, re.S):
        assert "alert" not in svg  # no text of the recording inside a plot


# --------------------------------------------------------------------------- other shapes


def test_no_gpu_and_num_workers_zero(tmp_path):
    path = tmp_path / "nogpu.ltrec"
    loader = LoaderSim(workers=[], batches_per_s=18.0, wait_fraction=0.55, wait_p50_ms=29.0,
                       wait_p95_ms=41.0)
    rec = Recorder(path, [loader], [MachineSim(gpu_status="no_nvml", gpus=[])])
    rec.run(T0, T0 + 10)
    rec.close()
    recording = read(str(path))
    timeline = series.timeline(Playback(recording))
    page = html_report(recording, timeline)
    assert 'id="plot-gpu"' not in page and "GPU status: no_nvml" in page
    assert [w.id for w in timeline.sources[0].workers] == [None]  # the main process fetches
    assert "plot-workers-0" in page


def test_setting_change_is_marked(tmp_path):
    path = tmp_path / "settings.ltrec"
    loader = LoaderSim(workers=[WorkerSim()])
    rec = Recorder(path, [loader], [MachineSim()])
    rec.run(T0, T0 + 10)
    loader.workers = [WorkerSim(), WorkerSim()]
    rec.run(T0 + 10, T0 + 20)
    rec.close()
    recording = read(str(path))
    timeline = series.timeline(Playback(recording))
    changes = timeline.sources[0].setting_changes(timeline.times)
    assert [(round(t - T0), before, after) for t, before, after in changes] == [(10, 1, 2)]


def test_sample_step_bounds_the_points():
    assert series.sample_step(30.0) == STEP_S
    assert series.sample_step(0.0) == STEP_S
    for duration in (1500.0, 3600.0, 86400.0):
        step = series.sample_step(duration)
        assert step > STEP_S and duration / step + 1 <= series.MAX_POINTS


def test_a_long_recording_is_sampled_at_its_step(phases):
    path, _timeline, _page = phases
    recording = read(str(path))
    timeline = series.timeline(Playback(recording), max_points=12)
    assert len(timeline.times) <= 12
    assert timeline.step_s == series.sample_step(52.0 - REPORT_DELAY, 12)
    page = html_report(recording, timeline)
    assert f"one every {timeline.step_s:g} s" in page


def test_time_axis_words():
    assert plots.elapsed_words(65, long=False) == "1:05"
    assert plots.elapsed_words(3725, long=True) == "1:02:05"
    assert plots.elapsed_words(3725, long=False) == "62:05"
    assert plots.tick_step(28) == 5 and plots.tick_step(3600) == 600


# --------------------------------------------------------------------------- the command


def _run(*args: str) -> int:
    return cli.main(["report", *args])


def test_command_writes_the_page_beside_the_recording(phases, tmp_path, capsys):
    path, _timeline, _page = phases
    copy = tmp_path / "run.ltrec"
    copy.write_bytes(Path(path).read_bytes())
    assert _run(str(copy)) == 0
    out = tmp_path / "run.html"
    err = capsys.readouterr().err
    assert err.startswith(f"loadertop: wrote {out} (") and err.count("\n") == 1
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert _run(str(copy), "-o", str(out)) == 0
    assert "it replaced the file that was there" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content, words", [
    (None, "no such file"),
    (b"PK\x03\x04 a zip file", "not a loadertop recording"),
    (MAGIC[:7], "truncated before its header"),
])
def test_command_bad_input_is_one_line(tmp_path, capsys, content, words):
    path = tmp_path / "bad.ltrec"
    if content is not None:
        path.write_bytes(content)
    assert _run(str(path)) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "bad.html").exists()


def test_command_recording_without_a_loader(tmp_path, capsys):
    path = tmp_path / "machine.ltrec"
    rec = Recorder(path, [], [MachineSim()])
    rec.run(T0, T0 + 4)
    rec.close()
    assert _run(str(path)) == 1
    assert "holds no loader" in capsys.readouterr().err


def test_command_never_overwrites_the_recording(phases, capsys):
    path, _timeline, _page = phases
    before = Path(path).read_bytes()
    assert _run(str(path), "-o", str(path)) == 2
    assert "the recording itself" in capsys.readouterr().err
    assert Path(path).read_bytes() == before


def test_command_without_matplotlib_says_what_to_install(phases, monkeypatch, capsys):
    path, _timeline, _page = phases
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert _run(str(path)) == 1
    assert capsys.readouterr().err == (
        "loadertop: the report needs matplotlib: pip install 'loadertop[report]'\n")


def test_help_and_the_command_module_do_not_import_matplotlib():
    code = ("import sys, loadertop.cli, loadertop.commands.report; "
            "bad = [m for m in ('matplotlib', 'torch', 'textual') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_many_workers_are_drawn_as_their_median_and_range(tmp_path):
    path = tmp_path / "many.ltrec"
    count = plots.MAX_WORKER_LINES + 2
    loader = LoaderSim(workers=[WorkerSim(fetch_p50_ms=40.0 + 10 * i) for i in range(count)])
    rec = Recorder(path, [loader], [MachineSim()])
    rec.run(T0, T0 + 6)
    rec.close()
    recording = read(str(path))
    page = html_report(recording, series.timeline(Playback(recording)))
    svg = _figure(page, "plot-workers-0")
    assert f"<!-- median of {count} workers -->" in svg  # its legend's words
    assert "<!-- worker 0 -->" not in svg
    assert "the range from the fastest worker's to the slowest's" in page
