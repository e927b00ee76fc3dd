"""stalled: training makes no progress: a worker died, or the loop has been blocked in next()
far longer than its recent waits."""

from __future__ import annotations

import signal
from typing import Final

from loadertop.client.document import (
    StackFigures,
    Stats,
    Verdict,
)
from loadertop.client.units import say_ms
from loadertop.diagnosis.categories.memory_pressure import memory_advice, memory_findings
from loadertop.diagnosis.facts import Facts, make_verdict
from loadertop.diagnosis.readings import finite, stat
from loadertop.diagnosis.thresholds import (
    STALL_FACTOR,
    STALL_MIN_MS,
    STALL_NO_HISTORY_MS,
)

CATEGORY: Final = "stalled"
#: How the screen and the report name and colour it (a Rich colour; `views.palette` reads these).
WORDS: Final = "Stalled"
COLOUR: Final = "red"
LEVEL: Final = "bad"  # the banner's CSS class suffix: ok / warn / bad / none
#: Its place in `overall`'s order, most urgent first: training makes no progress at all (or is
#: about to crash).
RANK: Final = 10
#: Shown at once by the verdict's hysteresis (`client.hysteresis`), without waiting to persist.
URGENT: Final = True
#: The loop waits for data in it (the margin on the wait fraction applies when it is shown).
LOOP_WAITS: Final = False


def judge(facts: Facts) -> Verdict | None:
    """A dead worker or a loop blocked far longer than usual. Checked before memory pressure
    because it means training has stopped, and a worker killed by SIGKILL under memory pressure
    is most likely the OOM killer's doing: the stalled verdict then carries the memory evidence
    and advice too, so nothing is lost."""
    verdict = stall(facts)
    if verdict is None:
        return None
    memory = memory_findings(facts.system, facts.previous)
    if memory is not None:
        return make_verdict(CATEGORY, verdict.summary, [*verdict.evidence, *memory.evidence],
                            [*verdict.advice, *memory_advice(facts)])
    return verdict


def restate(facts: Facts) -> Verdict | None:
    """Its words for today's figures while the hysteresis holds it (`client.hysteresis`): only
    while its condition still holds; once it is over there is nothing true to say under it, and
    the change shows at once (docs/diagnosis.md, "Hysteresis")."""
    return judge(facts)


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        name = signal_name(-exitcode)
        return f"killed by {name} (signal {-exitcode})" if name.startswith("SIG") else f"killed by {name}"
    return f"exited with code {exitcode}"


def exit_advice(code: int | None, pid: int | None) -> list[str]:
    advice = []
    if code == -signal.SIGKILL:
        advice.append("SIGKILL is most often the kernel's OOM killer: check "
                      "`dmesg -T | grep -i -E 'out of memory|killed process'` (or the container's "
                      "OOM events); then fewer workers or a smaller prefetch_factor / batch_size")
    elif code == -signal.SIGBUS:
        advice.append("SIGBUS in a worker usually means /dev/shm is full (pytorch#5040): check "
                      "`df -h /dev/shm`; enlarge it (docker run --shm-size=8g) or use fewer workers")
    elif code is not None and code in (-signal.SIGSEGV, -signal.SIGABRT):
        advice.append("a native crash in the worker: often OpenMP/OpenCV state inherited across fork "
                      "(pytorch#1355); try multiprocessing_context='spawn' or cv2.setNumThreads(0)")
    elif code is not None and code > 0:
        advice.append(f"the worker exited with code {code}: look for its traceback on the training "
                      "process's stderr")
    advice.append("torch's own message for the dead worker is on the training process's stderr "
                  f"(\"DataLoader worker (pid {pid if pid is not None else '?'}) ...\")")
    return advice


def stall_threshold_ms(wait_ms: Stats | None, batches_total: int) -> float:
    """How long the loop may be blocked in next() before the source counts as stalled, from its
    recent waits (``wait_ms``) and how many batches it ever delivered."""
    p99 = stat(wait_ms, "p99")  # as the stalled verdict's evidence reads it (the mean stands in)
    if p99 is None and batches_total == 0:
        return STALL_NO_HISTORY_MS
    return max(STALL_MIN_MS, STALL_FACTOR * (p99 or 0.0))


def stall(facts: Facts) -> Verdict | None:
    """The stalled verdict alone (without the memory evidence `judge` adds)."""
    src = facts.source
    dead = [w for w in facts.workers if w.alive is False and w.exitcode != 0] if facts.active else []
    if dead:
        evidence: list[str] = []
        advice: list[str] = []
        for w in dead:
            evidence.append(f"worker {w.id} (pid {w.pid if w.pid is not None else '?'}) "
                            f"{describe_exit(w.exitcode)}")
            advice.extend(a for a in exit_advice(w.exitcode, w.pid) if a not in advice)
        first = dead[0]
        summary = f"worker {first.id} died: {describe_exit(first.exitcode)}"
        if first.exitcode == -signal.SIGKILL:
            summary += ", likely the OOM killer"
        if len(dead) > 1:
            summary += f"; {len(dead)} workers dead"
        return make_verdict(CATEGORY, summary, evidence, advice)

    blocked = finite(src.blocked_ms)
    if blocked is None:
        return None
    threshold = stall_threshold_ms(src.wait_ms, src.batches_total)
    if blocked < threshold:
        return None
    p99 = stat(src.wait_ms, "p99")
    evidence = [f"blocked in next() for {say_ms(blocked)} (threshold {say_ms(threshold)})"]
    if p99 is not None:
        evidence.append(f"recent wait p99 {say_ms(p99)}")
    # Where it hangs: a worker stuck inside one batch says more than the loop waiting for it.
    stuck = [(w, frame) for w in facts.workers
             if w.stack is not None and (frame := user_frame(w.stack)) is not None]
    loop_frame = user_frame(src.loop_stack) if src.loop_stack is not None else None
    for w, frame in stuck[:4]:
        evidence.append(f"worker {w.id} inside one batch for {say_ms(w.busy_ms or 0.0)}, at {frame}")
    if loop_frame is not None:
        evidence.append(f"the loop waits at {loop_frame}")
    ready, in_flight = src.queue.ready, src.queue.in_flight
    if ready is not None or in_flight is not None:
        evidence.append(f"queue: {ready if ready is not None else '?'} ready, "
                        f"{in_flight if in_flight is not None else '?'} in flight")
    advice = []
    worker_pids = [w.pid for w in facts.workers if w.pid is not None]
    if ready is not None and ready > 0:
        advice.append("batches are ready yet next() does not return: the main process is stuck "
                      "(receive, collate or pin_memory thread)")
    if worker_pids:
        others = " ".join(str(pid) for pid in worker_pids[1:4])
        others += f" and {len(worker_pids) - 4} more" if len(worker_pids) > 4 else ""
        advice.append(f"see where the workers hang: py-spy dump --pid {worker_pids[0]}"
                      + (f" (likewise {others})" if others else ""))
        advice.append("workers all idle with work outstanding suggest a deadlock after fork "
                      "(OpenMP/OpenCV threads, pytorch#1355): try multiprocessing_context='spawn'")
    advice.append(f"see where the loop waits: py-spy dump --pid {src.pid}")
    advice.append("pass timeout=SECONDS to the DataLoader to turn a hang into an error")
    summary = f"the loop has been blocked in next() for {say_ms(blocked)}"
    summary += f" (recent p99 {say_ms(p99)})" if p99 is not None else ""
    if stuck:
        summary += f"; worker {stuck[0][0].id} is stuck at {short_frame(stuck[0][1])}"
    elif loop_frame is not None:
        summary += f" at {short_frame(loop_frame)}"
    return make_verdict(CATEGORY, summary, evidence, advice)


def user_frame(stack: StackFigures) -> str | None:
    """The innermost frame of the user's own code in `stack` (see `probe/stacks.py`)."""
    if stack.user_frame is None or stack.user_frame >= len(stack.frames):
        return None
    return stack.frames[stack.user_frame]


def short_frame(frame: str) -> str:
    """`"/long/path/to/data.py:42 in load"` as `"data.py:42 in load"`."""
    path, sep, rest = frame.partition(":")
    return path.rsplit("/", 1)[-1] + sep + rest
