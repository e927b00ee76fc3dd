"""The one home of presentation: how the screen names and colours what the model and the diagnosis
decided, and the help text that says the same numbers.

Nothing here defines a threshold of its own where the diagnosis or the model has one: the colour
bands are derived from `loadertop.diagnosis` (a wait fraction turns yellow where the verdict turns
input-bound, iowait where it counts as evidence of I/O, CPU red where it counts as saturated, memory
where it counts as pressure), the freshness and "blocked" marks from `loadertop.client.model`. The
few purely visual choices (when a bar turns yellow before red, when a silent feed is called
disconnected) are named constants below, with their reason.

The category and severity tables (words, colours), the source states' colours and the parts of
"where the time goes" are `loadertop.views.palette`'s, re-exported here: the HTML report and the
notebook's panel share them and must not import this package (its `__init__` imports Textual).

Pure: no Textual. Colours are Rich style strings (ANSI names or hex: Textual converts ANSI through
its theme, and hex is never a failed colour lookup).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from loadertop import diagnosis
from loadertop.client import model
from loadertop.client.document import SEVERITIES, Finding, FindingKind
from loadertop.client.units import MISSING, fmt_bytes

# The category and severity tables live in `viewer.palette` (shared with the HTML report, which
# must not import Textual); the screen's modules keep importing them from here.
from loadertop.views.palette import ACCENT as ACCENT
from loadertop.views.palette import BAD as BAD
from loadertop.views.palette import CATEGORY_STYLES as CATEGORY_STYLES
from loadertop.views.palette import DIM as DIM
from loadertop.views.palette import NO_DIAGNOSIS as NO_DIAGNOSIS
from loadertop.views.palette import OK as OK
from loadertop.views.palette import ORANGE as ORANGE
from loadertop.views.palette import SEVERITY_STYLES as SEVERITY_STYLES
from loadertop.views.palette import STAGE_PARTS as STAGE_PARTS
from loadertop.views.palette import STATE_COLOURS as STATE_COLOURS
from loadertop.views.palette import WARN as WARN
from loadertop.views.palette import CategoryStyle as CategoryStyle
from loadertop.views.palette import SeverityStyle as SeverityStyle
from loadertop.views.palette import StagePart as StagePart
from loadertop.views.palette import category_style as category_style
from loadertop.views.palette import pending_words as pending_words
from loadertop.views.palette import severity_style as severity_style
from loadertop.views.palette import source_title as source_title

# --------------------------------------------------------------------------- colours

#: How a loop that did not just finish ended (`end.how`) → the mark and colour of the line that
#: says it (the loader panel, the findings list): a stop by a signal is no failure.
END_MARKS: dict[str, tuple[str, str]] = {"crashed": ("✖", BAD), "died": ("✖", BAD),
                                         "stopped": ("■", WARN)}

# --------------------------------------------------------------------------- findings

#: Each finding kind (docs/contract.md §5) as the screen names it; the text report and the document keep
#: the kind itself. A test checks the key set is `document.FINDING_KINDS`.
FINDING_WORDS: dict[FindingKind, str] = {
    "worker_hung": "worker hung",
    "loop_hung": "loop hung",
    "worker_died": "worker died",
    "oom_killed": "OOM killed",
    "slow_worker": "slow worker",
    "copy_on_read": "copy-on-read",
    "memory_growth": "memory growth",
    "duplicate_rng": "duplicate RNG",
    "shm_low": "/dev/shm low",
    "fd_low": "file descriptors low",
    "threads_oversubscribed": "threads oversubscribed",
    "epoch_start_slow": "slow epoch start",
}

#: The kinds whose finding carries a stack that the screen shows under the banner, the first of
#: them in this order: a hung worker's stack says why the loop waits, so it goes first.
HANG_KINDS: tuple[FindingKind, ...] = ("worker_hung", "loop_hung")


def finding_words(kind: str) -> str:
    return FINDING_WORDS.get(kind) or kind.replace("_", " ")  # type: ignore[call-overload]


def worst(findings: Sequence[Finding]) -> Finding | None:
    """The most severe of ``findings`` (the first of them on a tie), or None."""
    ranked = [f for f in findings if f.severity in SEVERITIES]
    return min(ranked, key=lambda f: SEVERITIES.index(f.severity), default=None)


# --------------------------------------------------------------------------- colour bands

#: A load (CPU of a core or of the machine, GPU memory, swap in use) turns yellow from here: a
#: visual warning that it nears the diagnosis' saturation threshold (red), like nvitop's 75 %.
LOAD_WARN_PERCENT = 75.0
#: ... and red where the diagnosis calls the CPU saturated.
LOAD_BAD_PERCENT = diagnosis.CPU_SATURATED_PERCENT


def load_colour(percent: float | None) -> str:
    if percent is None:
        return DIM
    if percent >= LOAD_BAD_PERCENT:
        return BAD
    if percent >= LOAD_WARN_PERCENT:
        return WARN
    return OK


def wait_colour(fraction: float | None, category: str | None = None) -> str:
    """The loop's wait fraction: green while the loader keeps up, yellow where the diagnosis calls
    the loop input-bound, red from where the source's state is `waiting` (half the time).

    With the source's shown category, the diagnosis' margin applies as it does to the verdict: an
    input-bound loop stays yellow until its wait falls below the compute-bound threshold (7 %), so
    the colour never contradicts the banner."""
    if fraction is None:
        return DIM
    if fraction >= model.WAITING_FRACTION:
        return BAD
    warn_from = (diagnosis.WAIT_FRACTION_COMPUTE_BOUND
                 if category in diagnosis.INPUT_BOUND_CATEGORIES
                 else diagnosis.WAIT_FRACTION_INPUT_BOUND)
    return WARN if fraction >= warn_from else OK


def iowait_colour(percent: float | None) -> str:
    """iowait in the I/O verdict's colour where the diagnosis counts it as evidence of I/O."""
    if percent is not None and percent >= diagnosis.IOWAIT_HIGH_PERCENT:
        return CATEGORY_STYLES[diagnosis.INPUT_BOUND_IO].colour
    return ""


def memory_colour(available: float | None, total: float | None) -> str:
    """RAM: red where the diagnosis sees memory pressure (available below 5 %), yellow where it
    starts to count swap-out as pressure (below 10 %)."""
    if available is None or not total:
        return DIM
    fraction = available / total
    if fraction < diagnosis.MEM_AVAILABLE_MIN_FRACTION:
        return BAD
    if fraction < diagnosis.MEM_AVAILABLE_SWAP_OUT_FRACTION:
        return WARN
    return OK


def swap_rate_colour(bytes_per_s: float | None) -> str:
    """Swap traffic: red from the rate the diagnosis calls swapping, yellow below it."""
    if not bytes_per_s:
        return ""
    return BAD if bytes_per_s >= diagnosis.SWAP_RATE_MIN_BYTES_PER_S else WARN


def swapping(swap_in: float | None, swap_out: float | None) -> bool:
    """Enough swap traffic for the diagnosis to call it pressure (swap-out only counts when memory is
    short too; the panel says "swapping!" for either, at the diagnosis' rate)."""
    rate = diagnosis.SWAP_RATE_MIN_BYTES_PER_S
    return (swap_in or 0.0) >= rate or (swap_out or 0.0) >= rate


def queue_colour(fill: float | None) -> str:
    """The ready batches' share of the queue: half full or more keeps a loop fed."""
    return OK if (fill or 0.0) >= QUEUE_FED_FRACTION else WARN


#: A queue at least half full of ready batches keeps the loop fed (visual only).
QUEUE_FED_FRACTION = 0.5

# --------------------------------------------------------------------------- freshness, blocked

#: A source silent this long is shown "no data for N s": the model's own limit (it is `gone` then).
STALE_AFTER_S = model.GONE_AFTER_S
#: Silent this long, the header says "disconnected" even while the socket seems up (visual: ten
#: times the point where the model calls the source gone).
DISCONNECTED_AFTER_S = 10 * model.GONE_AFTER_S
#: The loop inside next() this long gets a red line in the loader panel: the point where the model
#: calls the source `waiting` on that ground alone.
BLOCKED_SHOW_MS = model.WAITING_BLOCKED_MS

# --------------------------------------------------------------------------- help


def _pct(fraction: float) -> str:
    return f"{fraction * 100:g} %"


def reading_the_screen() -> str:
    """The help's explanation of the figures, with the thresholds the diagnosis really uses
    (lines of at most 76 characters: the help fits an 80-column terminal)."""
    d = diagnosis
    return "\n".join([
        "  wait       the training loop blocked in next(), per batch",
        f"  waiting    its share of wall time: input-bound from {_pct(d.WAIT_FRACTION_INPUT_BOUND)} "
        "(healthy again",
        f"             below {_pct(d.WAIT_FRACTION_COMPUTE_BOUND)}), red from "
        f"{_pct(model.WAITING_FRACTION)} (the state turns `waiting`)",
        f"  time       wall time: the loop's step {STAGE_PARTS['step'].glyph}, waiting while a batch "
        f"is made {STAGE_PARTS['producing'].glyph},",
        f"             the handoff after {STAGE_PARTS['handoff'].glyph} (receiving, unpickling, "
        "pin_memory, order);",
        f"             main-process-bound from {_pct(d.HANDOFF_MAIN_BOUND)} of the wait in the handoff",
        "  batch      per batch p50: fetch (getting the items), collate_fn, handoff",
        "  queue      batches ready for the loop / requested from workers / capacity",
        "  cpu_frac   worker CPU time ÷ wall time while producing a batch: near 1",
        f"             it computes, below {d.IO_CPU_FRACTION:.2f} it mostly waits (disk, network, locks)",
        f"  iowait     evidence of I/O from {d.IOWAIT_HIGH_PERCENT:g} %; CPU saturated from "
        f"{d.CPU_SATURATED_PERCENT:g} %",
        f"  RAM        memory pressure below {_pct(d.MEM_AVAILABLE_MIN_FRACTION)} available or swap-in "
        f"≥ {fmt_bytes(d.SWAP_RATE_MIN_BYTES_PER_S)}/s",
        f"  blocked    said once the loop is inside next() for {BLOCKED_SHOW_MS / 1000:g} s",
        f"  no data    a source silent {STALE_AFTER_S:g} s is gone; disconnected after "
        f"{DISCONNECTED_AFTER_S:g} s",
        "  –          unknown on this machine (never a made-up 0)",
    ])


def findings_help() -> str:
    """The findings' marks in their colours, and what a hang's stack shows (Textual markup; lines
    of at most 76 characters)."""
    marks = "  ".join(f"[{style.colour}]{style.glyph} {severity}[/]"
                      for severity, style in SEVERITY_STYLES.items())
    return "\n".join([
        f"  {marks}",
        "  one line each: what was found, the worker, why; the source's and the",
        "  machine's. A hung worker or loop shows its Python stack as py-spy dump",
        "  does: innermost frame first, ▶ your own code's innermost frame. The",
        "  workers table marks a worker with a finding; the overview counts them.",
    ])


def categories_help() -> str:
    """One line per category, in the diagnosis' order of urgency, in its colour (Textual markup)."""
    return "\n".join(f"  [{CATEGORY_STYLES[c].colour}]{CATEGORY_STYLES[c].words}[/]"
                     for c in diagnosis.OVERALL_RANK)


# --------------------------------------------------------------------------- naming sources

def source_labels(sources: Sequence[Any]) -> list[str]:
    """Each source's title, with host:pid added where two share one (two processes both calling
    their loader "train")."""
    titles = [source_title(s.name, s.rank) for s in sources]
    counts = Counter(titles)
    return [t if counts[t] == 1 else f"{t} {s.host or MISSING}:{s.pid}"
            for t, s in zip(titles, sources)]
