"""The help screen (`?`): the keys, what the figures mean with the thresholds the diagnosis uses,
the categories and the findings' marks in their colours — all said from the constants (`theme`),
never typed twice."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from loadertop.tui.theme import categories_help, findings_help, reading_the_screen

HELP_TEXT = """\
[b]loadertop[/b] — top for PyTorch DataLoaders

[b]Keys[/b]
  q, Esc        quit (Esc/q/? close this help)
  ?             this help
  e             findings: every one with its evidence, advice and stack
  space         pause: stop showing new data (the clock keeps ticking)
  + / -         refresh slower / faster ({steps} s)
  tab, ]        next source        shift+tab, \\[   previous source
  o             overview: all sources (ranks, train/val) in one table
  c m f i       sort workers by CPU %, RSS, fetch p50, id (again: reverse)
{extra_keys}
[b]Reading the screen[/b]
{reading}

[b]Diagnoses[/b] (most urgent first)
{categories}

[b]Findings[/b] (under the banner; e lists them)
{findings}
"""


def help_text(refresh_steps: Sequence[float], extra_keys: str = "") -> str:
    """The help as Textual markup (square brackets in the figures' text are escaped);
    `extra_keys`: lines that follow the keys (a replay's)."""
    reading = reading_the_screen().replace("[", "\\[")
    return HELP_TEXT.format(steps="/".join(f"{s:g}" for s in refresh_steps), reading=reading,
                            extra_keys=extra_keys,
                            categories=categories_help(), findings=findings_help())


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close", show=True)]

    def __init__(self, refresh_steps: Sequence[float], extra_keys: str = "") -> None:
        super().__init__()
        self._text = help_text(refresh_steps, extra_keys)

    def compose(self) -> ComposeResult:
        yield Static(self._text, id="help")
