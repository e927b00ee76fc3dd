"""Findings and how a loop ended, on screen (docs/contract.md §5): the lines under the banner and a hang's
stack, the list the `e` key opens, the marks in the workers table, the overview and the header,
the loader panel's "crashed". Every document comes from real wire messages through the real model
(`tests/fakes.py`), so the findings are the ones `loadertop.findings` really emits.

Pilot tests as in `test_tui.py` (no pytest-asyncio: each runs its coroutine with ``asyncio.run``;
the refresh timer is an hour, so only explicit ticks change the screen).
"""

from __future__ import annotations

import asyncio

from loadertop.client.document import FINDING_KINDS, SEVERITIES, decode_json, encode_json
from loadertop.tui.app import LoadertopApp
from loadertop.tui.theme import FINDING_WORDS, SEVERITY_STYLES
from loadertop.tui.widgets import (
    Banner,
    FindingsBar,
    FindingsScreen,
    HeaderBar,
    HelpScreen,
    LoaderPanel,
    OverviewTable,
    WorkersTable,
)
from loadertop.tui.widgets.findings import FindingsList, bar_rows, call_chain, pick_frames
from loadertop.views.text import finding_stack, short_location, split_frame

import fakes
from fakes import FakeFeed

WIDE = (120, 40)
COMPACT = (80, 24)
NEVER = 3600.0


def make_app(documents) -> LoadertopApp:
    return LoadertopApp(FakeFeed(documents), refresh_s=NEVER, clock=lambda: fakes.T0 + 12.0)


def run(body, app: LoadertopApp, size=WIDE) -> None:
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await body(app, pilot)

    asyncio.run(main())


def lines_of(widget) -> list[str]:
    return widget.text().splitlines()


# --------------------------------------------------------------------------- under the banner


def test_hang_shows_its_finding_and_stack_innermost_first():
    async def body(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))
        assert bar[0].startswith("✖ worker hung  worker 1 has been inside one batch for 41.0 s")
        assert "stack of worker 1, innermost first" in bar[1]
        frames = [line.strip() for line in bar[2:] if "(" in line and "loop hung" not in line]
        # As py-spy dump prints it: the frame it is stuck in first, the user's frame marked.
        assert frames[0] == "readinto (socket.py:720)"
        assert frames[1] == "read (fsspec/spec.py:1941)"
        assert frames[2] == "▶ _read_record (…/proj/data/shards.py:61)  ◀ your code"
        # The other critical finding of the source follows the stack.
        assert bar[-1].startswith("✖ loop hung  the training loop has been blocked in next()")
        assert app.query_one(FindingsBar).has_class("-critical")

    run(body, make_app(fakes.worker_hung_doc()))


def test_compact_hang_fits_80x24():
    """80×24: the hang's line and one row from the user's frame in to the innermost; the banner
    gives its evidence row, the loader panel its graph's row, so every worker still shows."""
    async def body(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))
        assert len(bar) == 2
        assert bar[0].startswith("✖ worker hung") and bar[0].endswith("+1 more · e")
        assert bar[1].strip() == "▶ _read_record (…/proj/data/shards.py:61) → … → readinto (socket.py:720)"
        banner = lines_of(app.query_one(Banner))
        assert len(banner) == 2 and not any(line.startswith("evidence") for line in banner)
        assert "wait p95" not in app.query_one(LoaderPanel).text()
        table = app.query_one(WorkersTable)
        assert "more workers" not in table.text() and len(lines_of(table)) == 5  # header + 4
        assert [r[1] for r in table.rows_text()] == ["alive", "hung 41 s", "alive", "alive"]
        footer_y = app.screen.query_one("Footer").region.y
        assert table.region.bottom <= footer_y - 4  # the 4 machine rows still below it

    run(body, make_app(fakes.worker_hung_doc()), size=COMPACT)


def test_stack_fits_the_column_at_160x50():
    """The loader panel sizes its graphs to the column the findings leave it: every worker row
    still shows."""
    async def body(app, pilot):
        await pilot.pause()
        bar = lines_of(app.query_one(FindingsBar))
        assert len(bar) == 11 <= bar_rows(50, False)  # the line, a heading, all 8 frames, loop_hung
        assert bar[-2].strip() == "_bootstrap (multiprocessing/process.py:314)"
        table = app.query_one(WorkersTable)
        assert "more workers" not in table.text()
        assert any("hung 41 s" in " ".join(r) for r in table.rows_text())

    run(body, make_app(fakes.worker_hung_doc()), size=(160, 50))


def test_loop_hung_without_workers_marks_the_user_frame():
    async def body(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))
        assert bar[0].startswith("✖ loop hung  the training loop has been blocked in next() for 12.4 s")
        assert "stack of the training loop" in bar[1]
        assert bar[2].strip() == "readinto (socket.py:720)"
        assert bar[3].strip() == "▶ _read_record (…/proj/data/shards.py:61)  ◀ your code"

    run(body, make_app(fakes.loop_hung_doc()))


def test_warnings_and_info_one_line_each_worker_named():
    async def body(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))
        assert bar[0].startswith("▲ slow worker  worker 3 is 18× slower per batch")
        assert bar[1].startswith("▲ duplicate RNG  workers 0, 1, 2, 3 started with the same")
        assert bar[2].startswith("● epoch start slow") or bar[2].startswith("● slow epoch start")
        assert app.query_one(FindingsBar).has_class("-warning")
        ids = [r[0] for r in app.query_one(WorkersTable).rows_text()]
        assert ids == ["0", "1", "2", "3 ▲"]  # the slow worker marked in the table

    run(body, make_app(fakes.pitfalls_doc()))

    async def compact(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))
        assert len(bar) == 2 and bar[-1].endswith("+1 more · e")

    run(compact, make_app(fakes.pitfalls_doc()), size=COMPACT)


def test_no_findings_no_lines():
    async def body(app, pilot):
        bar = app.query_one(FindingsBar)
        assert bar.lines == [] and bar.has_class("-empty") and bar.region.height == 0
        assert any(line.startswith("evidence") for line in lines_of(app.query_one(Banner)))

    run(body, make_app(fakes.healthy_doc()), size=COMPACT)


def test_findings_of_other_sources_are_pointed_at():
    async def body(app, pilot):
        bar = lines_of(app.query_one(FindingsBar))  # train is shown, val has the hang
        assert bar == ["in other sources: val ✖ 2  · tab reaches them, e lists them"]
        assert "val ✖ 2" in app.query_one(HeaderBar).text()  # the tabs carry the marks
        await pilot.press("tab")
        await pilot.pause()
        assert lines_of(app.query_one(FindingsBar))[0].startswith("✖ worker hung")

    run(body, make_app(fakes.findings_multi_source_doc()))


# --------------------------------------------------------------------------- the list (e)


def test_e_opens_the_list_and_escape_or_e_closes_it():
    async def body(app, pilot):
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, FindingsScreen)
        text = app.screen.body.text()
        lines = text.splitlines()
        assert str(app.screen.query_one("#findings-list").border_title) == "Findings (2 critical)"
        assert lines[0].startswith("✖ CRITICAL  worker hung · train · worker 1   first seen 17:23:20")
        assert "  evidence  · inside one batch for 41.0 s (threshold 5.0 s)" in lines
        assert any(line.startswith("  advice    → ") for line in lines)
        assert any("py-spy dump --pid 41245" in line for line in lines)
        # The whole stack, full paths, innermost first, the user's frame marked.
        first = lines.index("  stack     8 frames, innermost first")
        assert lines[first + 1].strip() == "readinto (/usr/lib/python3.12/socket.py:720)"
        assert lines[first + 3].strip() == "▶ _read_record (/home/ana/proj/data/shards.py:61)  ◀ your code"
        assert lines[first + 8].strip() == "_bootstrap (/usr/lib/python3.12/multiprocessing/process.py:314)"
        assert "✖ CRITICAL  loop hung · train" in text and "11 frames, innermost first" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, FindingsScreen) and app.is_running
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, FindingsScreen)
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, FindingsScreen) and app.is_running

    run(body, make_app(fakes.worker_hung_doc()))


def test_the_list_scrolls_and_follows_the_document():
    healthy, hung = fakes.healthy_doc(), fakes.worker_hung_doc()

    async def body(app, pilot):
        await pilot.press("e")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FindingsScreen)
        assert screen.body.text().startswith("No findings. loadertop looks for: worker hung, loop hung")
        assert str(screen.query_one("#findings-list").border_title) == "Findings (none)"
        app.feed.push(hung)
        app.tick()
        await pilot.pause()
        assert screen.body.text().startswith("✖ CRITICAL  worker hung")
        scroll = screen.query_one("#findings-list")
        assert scroll.max_scroll_y > 0  # 24 rows: the list is longer than the screen
        await pilot.press("pagedown")
        await pilot.pause()
        assert scroll.scroll_y > 0

    run(body, make_app([healthy]), size=COMPACT)


def test_the_list_says_how_a_loop_crashed():
    async def body(app, pilot):
        await pilot.press("e")
        await pilot.pause()
        lines = app.screen.body.text().splitlines()
        # the job's end in the words of `loadertop ls` (client/ending.py: one end per job)
        assert lines[0] == ("✖ train ended: exception: RuntimeError: DataLoader worker (pid 4321) is "
                            "killed by signal: Killed.")
        assert lines[2].startswith("✖ CRITICAL  worker died · train · worker 2")
        assert any("SIGKILL" in line and "OOM killer" in line for line in lines)

    run(body, make_app(fakes.killed_worker_doc()))


def test_help_and_footer_name_the_key():
    async def body(app, pilot):
        footer = {b.key: b for b in app.BINDINGS if b.show}  # type: ignore[union-attr]
        assert footer["e"].description == "Findings"
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help").render())
        assert "e             findings: every one with its evidence, advice and stack" in help_text
        assert "✖ critical  ▲ warning  ● info" in help_text

    run(body, make_app(fakes.healthy_doc()))


# --------------------------------------------------------------------------- how a loop ended


def test_crashed_loop_shows_in_the_loader_panel():
    for size in (WIDE, COMPACT):
        async def body(app, pilot):
            lines = lines_of(app.query_one(LoaderPanel))
            assert lines[0].startswith("crashed  batch")
            error = "✖ exception: RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed."
            if app.compact:  # one row, as much of it as fits
                assert lines[1] == error
            else:  # wrapped under the state line in a 70-column panel
                assert " ".join(line.strip() for line in lines[1:3]) == error
            bar = lines_of(app.query_one(FindingsBar))
            assert bar[0].startswith("✖ worker died  worker 2 (pid 4321) died: killed by SIGKILL")
            rows = app.query_one(WorkersTable).rows_text()
            assert rows[2][0] == "2 ✖"

        run(body, make_app(fakes.killed_worker_doc()), size=size)


def test_finished_loop_says_finished():
    async def body(app, pilot):
        lines = lines_of(app.query_one(LoaderPanel))
        assert lines[0].startswith("finished  batch") and not lines[1].startswith("✖")
        assert app.query_one(FindingsBar).lines == []

    run(body, make_app(fakes.finished_doc()))


def test_document_carries_findings_and_the_end():
    doc = fakes.killed_worker_doc()
    back = decode_json(encode_json(doc))
    assert back == doc
    src = back.sources[0]
    assert src.end is not None and src.end.how == "crashed"
    assert src.end.error == f"RuntimeError: {fakes.KILLED_MESSAGE}"
    assert [f.kind for f in back.findings] == ["worker_died"] == [f.kind for f in src.findings]
    hung = fakes.worker_hung_doc()
    assert hung.findings[0].stack == fakes.WORKER_STACK


# --------------------------------------------------------------------------- the overview


def test_overview_marks_sources_with_findings():
    for size in (WIDE, COMPACT):
        async def body(app, pilot):
            await pilot.press("o")
            await pilot.pause()
            table = app.query_one(OverviewTable)
            assert [r[1] for r in table.rows_text()] == ["train", "val ✖ 2"]

        run(body, make_app(fakes.findings_multi_source_doc()), size=size)

    async def crashed(app, pilot):
        await pilot.press("o")
        await pilot.pause()
        table = app.query_one(OverviewTable)
        row = table.rows_text()[0]
        assert row[1] == "train ✖ 1" and "crashed" in row

    run(crashed, make_app(fakes.killed_worker_doc()), size=(200, 50))


# --------------------------------------------------------------------------- the pieces


def test_theme_names_every_kind_and_severity():
    assert set(FINDING_WORDS) == set(FINDING_KINDS)
    assert set(SEVERITY_STYLES) == set(SEVERITIES)
    assert len({s.glyph for s in SEVERITY_STYLES.values()}) == len(SEVERITIES)  # told apart in mono


def test_frames_and_locations():
    assert split_frame("/a/b.py:3 in load") == ("load", "/a/b.py:3")
    assert split_frame("<unknown>") == ("", "<unknown>")
    assert short_location("/usr/lib/python3.12/multiprocessing/queues.py:113") == \
        "multiprocessing/queues.py:113"
    assert short_location(f"{fakes.VENV}/torch/utils/data/_utils/fetch.py:52") == \
        "torch/utils/data/_utils/fetch.py:52"
    assert short_location("/home/ana/proj/data/shards.py:61") == "…/proj/data/shards.py:61"
    assert short_location("train.py:9") == "train.py:9"


def test_pick_frames_keeps_the_user_frame():
    doc = fakes.worker_hung_doc()
    src = doc.sources[0]
    stack = finding_stack(doc.findings[0], src)
    assert stack is not None and stack.user_frame == fakes.WORKER_USER_FRAME
    # 8 frames, the user's is the third from the innermost: 3 rows reach it ...
    assert [r.frame for r in pick_frames(stack, 3)] == [7, 6, 5]
    # ... 2 rows: the innermost and the user's; more rows than frames: all of them.
    assert [r.frame for r in pick_frames(stack, 2)] == [7, 5]
    assert [r.frame for r in pick_frames(stack, 20)] == list(range(7, -1, -1))
    deep = stack._replace(user_frame=1)  # far out: the innermost, a gap, the user's
    rows = pick_frames(deep, 4)
    assert [r.frame for r in rows] == [7, 6, None, 1] and rows[2].skipped == 4
    chain = "".join(t for t, _ in call_chain(stack, 200)).strip()
    assert chain == ("▶ _read_record (…/proj/data/shards.py:61) → read (fsspec/spec.py:1941) → "
                     "readinto (socket.py:720)")


def test_finding_stack_of_a_cut_stack():
    """A finding quotes the innermost 64 frames: the user's frame is found in them all the same."""
    import msgspec

    doc = fakes.worker_hung_doc()
    finding = doc.findings[0]
    src = doc.sources[0]
    cut = msgspec.structs.replace(finding, stack=finding.stack[3:])
    stack = finding_stack(cut, src)
    assert stack is not None and stack.user_frame == fakes.WORKER_USER_FRAME - 3
    other = msgspec.structs.replace(finding, stack=("elsewhere.py:1 in f",))
    assert finding_stack(other, src) == (("elsewhere.py:1 in f",), None)


def test_findings_list_widget_without_document():
    widget = FindingsList()
    widget.show(None)
    assert widget.build(80)[0][0][0] == "No findings."
