"""The pure text graphics of the screen (`loadertop.tui.widgets.graphics`): no Textual needed."""

from __future__ import annotations

import ast
from pathlib import Path

from loadertop.tui.widgets import graphics as g


def test_sparkline_shapes():
    assert g.sparkline([0, 5, 10], 3) == "▁▅█"
    assert g.sparkline([1, None, 1], 5) == "  █ █"  # right-aligned; None is a gap
    assert g.sparkline([], 3) == "   "
    assert g.sparkline([0, 0], 2) == "▁▁"  # a known 0 still shows: told apart from unknown
    assert g.sparkline([50, 100], 2, top=100.0) == "▅█"
    assert g.sparkline([300], 1, top=100.0) == "█"  # clipped at the top
    assert g.sparkline(range(10), 3) == "▆▇█"  # the last `width` values, scaled to what is shown


def test_sparkline_rows():
    assert g.sparkline_rows([0, 8, 16], 3, 2, top=16) == ["  █", "▁██"]
    assert g.sparkline_rows([4], 2, 1, top=8) == [g.sparkline([4], 2, top=8)]
    rows = g.sparkline_rows([None, 16], 2, 3, top=16)
    assert rows == [" █", " █", " █"]
    assert all(len(r) == 5 for r in g.sparkline_rows([1, 2, 3], 5, 4))


def test_graph_height_follows_history_and_room():
    assert g.known_height([1.0] * 2, 10, room=8) == 1
    assert g.known_height([1.0] * 12, 10, room=8) == 3  # 10 known points shown: 3 rows
    assert g.known_height([1.0] * 100, 50, room=5) == 5
    assert g.known_height([1.0] * 100, 50, room=20) == 8  # never a wall of blocks
    assert g.known_height([None] * 30, 30, room=8) == 1
    assert g.peak([1.0, 7.0, None, 3.0], 3) == 7.0 and g.peak([1.0, 7.0, None, 3.0], 2) == 3.0
    assert g.peak([None], 5) is None


def test_bar():
    assert g.bar(None, 4) == ("", "····")  # unknown: an empty track, not a made-up 0 % bar
    assert g.bar(0.0, 4) == ("", "····")
    assert g.bar(1.0, 4) == ("████", "")
    assert g.bar(0.5, 4) == ("██", "··")
    filled, track = g.bar(0.3, 10)
    assert filled == "███" and len(filled) + len(track) == 10
    assert g.bar(0.55, 10)[0] == "█████▌"
    assert g.bar(2.0, 3) == ("███", "")
    assert g.bar_spans(0.5, 4, "green", "dim") == (("██", "green"), ("··", "dim"))
    assert g.bar_spans(None, 2, "green", "dim") == (("··", "dim"),)


def test_core_grid():
    colour = lambda v: "red" if (v or 0) >= 90 else "green"
    lines = g.core_grid([95.0, 5.0], 40, colour, "dim", "cyan")
    bar_w = 40 - len("0▕▏ 95% ")  # one column of cells: the bar takes the rest of the row
    assert [g.plain(line) for line in lines] == [
        "0▕" + "".join(g.bar(0.95, bar_w)) + "▏  95%", "1▕" + "".join(g.bar(0.05, bar_w)) + "▏   5%"]
    assert all(g.line_len(line) == 40 for line in lines)
    assert lines[0][2] == (g.bar(0.95, bar_w)[0], "red") and lines[1][2][1] == "green"
    # 16 cores: 4 rows of 4 cells, numbered down the columns, every row the same width.
    lines = g.core_grid([float(i) for i in range(16)], 80, colour, "dim", "cyan")
    assert len(lines) == 4 and g.plain(lines[1]).startswith(" 1▕")
    assert " 5▕" in g.plain(lines[1]) and len({g.line_len(line) for line in lines}) == 1
    assert all(g.line_len(line) <= 80 for line in lines)
    # Too many cores for the room: one block per core.
    lines = g.core_grid([50.0] * 64, 40, colour, "dim", "cyan")
    assert g.plain(lines[0]).startswith("cores ") and all(g.line_len(line) <= 40 for line in lines)
    assert g.core_grid([None], 20, colour, "dim", "cyan")[0][-1] == ("   –%", "")
    assert g.core_grid([], 20, colour, "dim", "cyan") == []


def test_fit_cuts_with_an_ellipsis():
    line = (("abc", "bold"), ("defgh", ""))
    assert g.fit(line, 8) == line
    assert g.fit(line, 6) == (("abc", "bold"), ("de", ""), ("…", ""))
    assert g.fit(line, 3) == (("ab", "bold"), ("…", "bold"))
    assert g.fit(line, 0) == ()
    assert g.line_len(g.fit((("日本語テキスト", ""),), 7)) <= 7  # wide characters count double


def test_wrap_at_spaces():
    line = (("HEALTHY", "bold green"), ("  the loader keeps up: the step is the limit", ""))
    rows = g.wrap(line, 20)
    assert all(g.line_len(r) <= 20 for r in rows)
    assert " ".join(g.plain(r).strip() for r in rows).split() == g.plain(line).split()
    assert rows[0][0] == ("HEALTHY", "bold green")
    indented = g.wrap(line, 20, indent=2)
    assert all(g.plain(r).startswith("  ") for r in indented[1:])
    assert g.wrap((("x" * 25, ""),), 10) == [(("x" * 10, ""),), (("x" * 10, ""),), (("x" * 5, ""),)]
    assert g.wrap(line, 200) == [line]


def test_graphics_theme_and_history_are_pure():
    """No Textual in the modules that compute what to draw (they are tested without an app)."""
    from loadertop.tui import theme
    from loadertop.tui.widgets import history

    for module in (g, theme, history):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not [m for m in imported if m.split(".")[0] == "textual"], module.__name__


def test_cells_agrees_with_rich():
    from rich.cells import cell_len

    for text in ("plain ascii", g.SPARK_CHARS + g.BAR_PARTIAL + "·▕▏–…", "● live ⟳ 1 s ⏸", "日本",
                 "71°C ◀ ▶ ▲ ▼", ""):
        assert g.cells(text) == cell_len(text), text
