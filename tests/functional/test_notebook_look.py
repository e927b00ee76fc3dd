"""How the notebook's panel looks (views/notebook_panel.py), in a real headless Chromium: the panels
of a stalled fleet with a hung worker and its stack, and of an I/O-bound loader, each in a light
and a dark output area, as a narrow side panel (420 px) and a wide window (1200 px) show them.

Screenshots go to the test's tmp directory (look at them after a change of the panel's markup);
what is asserted mechanically: no panel is wider than its output area, and the verdicts' colours
are drawn. The documents are the real pipeline's (tests/fakes.py); the panel of a real kernel:
test_notebook.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from loadertop.views.notebook_panel import render
from loadertop.views.palette import category_colour

from conftest import CHROMIUM_FLAGS, chromium
from fakes import findings_multi_source_doc, io_bound_doc
from recorded import needed

pytestmark = pytest.mark.slow

WIDTHS = (420, 1200)
HEIGHT = 2600
PAD = 8  # the page's margin around the output areas
#: The output areas: a light front end, and a dark one (VS Code's dark theme's colours).
THEMES = {"light": ("#ffffff", "#1a1a1a"), "dark": ("#1e1e1e", "#d4d4d4")}
DOCS = {"fleet": findings_multi_source_doc, "io": io_bound_doc}

#: Run in the page after layout: each area says whether its content fits its width.
MEASURE = """<script>
for (const area of document.querySelectorAll(".area")) {
  area.setAttribute("data-fits", area.scrollWidth <= area.clientWidth ? "yes" : "no " + area.scrollWidth);
}
</script>"""


def _page(width: int) -> str:
    areas = []
    for name, make in DOCS.items():
        panel = render(make())
        for theme, (background, colour) in THEMES.items():
            areas.append(f'<div class="area" id="{name}-{theme}" style="width: {width - 2 * PAD}px; '
                         f"overflow: auto; background: {background}; color: {colour}; "
                         f'padding: 0; margin: 0 0 12px">{panel}</div>')
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
            f'<body style="margin: {PAD}px; background: #888">{"".join(areas)}{MEASURE}</body></html>')


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    browser = chromium()
    needed(browser, "no Chromium (apt-get install chromium)")
    assert browser is not None
    return subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_panel_fits_its_output_area_and_shows_its_colours(width, tmp_path):
    page = tmp_path / f"panel-{width}.html"
    page.write_text(_page(width))
    dom = _run([f"--window-size={width},{HEIGHT}", "--dump-dom", page.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    fits = dict(re.findall(r'id="([a-z]+-[a-z]+)"[^>]*data-fits="([^"]*)"', dom.stdout))
    assert set(fits) == {f"{n}-{t}" for n in DOCS for t in THEMES}, dom.stdout[:500]
    assert all(v == "yes" for v in fits.values()), f"wider than {width - 2 * PAD} px: {fits}"

    shot = tmp_path / f"panel-{width}.png"
    done = _run([f"--window-size={width},{HEIGHT}", f"--screenshot={shot}", page.as_uri()], tmp_path)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    from PIL import Image  # matplotlib's own dependency: installed with the report's extra

    with Image.open(shot) as image:
        assert image.size == (width, HEIGHT)
        counts = {colour: n for n, colour in image.convert("RGB").getcolors(maxcolors=width * HEIGHT)}

    def rgb(hex_colour: str) -> tuple[int, int, int]:
        return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]

    # The banners' rules and chips in their verdicts' colours (6 px wide, each banner's height).
    for category in ("stalled", "input_bound_io", "compute_bound"):
        assert counts.get(rgb(category_colour(category)), 0) > 150, f"no {category} colour drawn"
    print(f"screenshot: {shot}")
