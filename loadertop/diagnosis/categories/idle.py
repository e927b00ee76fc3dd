"""idle: no batches in the window, and the loop is not waiting for one."""

from __future__ import annotations

from typing import Final

from loadertop.client.document import Verdict
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.readings import finite

CATEGORY: Final = "idle"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Idle"
COLOUR: Final = "#9e9e9e"
LEVEL: Final = "none"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: last: nothing runs.
RANK: Final = 90
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = False
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = False


def judge(facts: Facts) -> Verdict | None:
    src = facts.source
    blocked = finite(src.blocked_ms)
    stopped = src.state in ("idle", "finished", "gone")
    if not src.batches and (blocked is None or stopped):
        why = {"finished": "the loop has finished", "gone": "the process is gone"}.get(
            src.state, "the loop is not iterating")
        return make_verdict(CATEGORY, f"no batches in the window: {why}", ["0 batches in the window"],
                            [])
    return None


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): only
    while its condition still holds; once it is over there is nothing true to say under it, and
    the change shows at once (docs/diagnosis.md, "Hysteresis")."""
    return judge(facts)
