"""The memory panel: RAM (the cgroup's limit when there is one), swap, and swap traffic."""

from __future__ import annotations

from loadertop.client.document import SystemFigures
from loadertop.client.units import fmt_bytes, fmt_pair, fmt_pct, fmt_rate
from loadertop.tui.theme import BAD, DIM, memory_colour, swap_rate_colour, swapping
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line
from loadertop.tui.widgets.panel import MachinePanel


class MemoryPanel(MachinePanel):
    TITLE = "Memory"
    ID = "memory"

    NAME = "Memory"

    def machine_lines(self, system: SystemFigures, width: int) -> list[Line]:
        total, avail = system.mem_total_bytes, system.mem_available_bytes
        used_pct = system.mem_used_percent
        used = total - avail if total is not None and avail is not None else None
        ram_colour = memory_colour(avail, total)
        swap_total, swap_used = system.swap_total_bytes, system.swap_used_bytes
        s_in, s_out = system.swap_in_bytes_per_s, system.swap_out_bytes_per_s
        if self.compact:
            return [(("RAM ", "bold"), (fmt_pct(used_pct), f"bold {ram_colour}"),
                     (f" {fmt_pair(used, total)}", ""), ("  swap ", "bold"),
                     (fmt_pair(swap_used, swap_total), ""), (" in ", DIM),
                     (fmt_rate(s_in), swap_rate_colour(s_in)), (" out ", DIM),
                     (fmt_rate(s_out), swap_rate_colour(s_out)))]
        swap_frac = swap_used / swap_total if swap_total and swap_used is not None else None
        swap_pct = None if swap_frac is None else swap_frac * 100
        limited = system.cgroup is not None and system.cgroup.mem_limit_bytes is not None
        ram_tail = f" {fmt_pct(used_pct):>5} {fmt_pair(used, total)}" + (" (cgroup)" if limited else "")
        swap_tail = f" {fmt_pct(swap_pct):>5} {fmt_pair(swap_used, swap_total)}"
        # The bars take what the figures leave, the same length on both lines.
        bar_w = max(6, width - 5 - max(len(ram_tail), len(swap_tail)))
        ram_fill = None if used_pct is None else used_pct / 100
        swap_colour = swap_rate_colour(max(s_in or 0.0, s_out or 0.0)) or DIM
        ram: Line = (("RAM  ", "bold"), *graphics.bar_spans(ram_fill, bar_w, ram_colour, DIM), (ram_tail, ""))
        swap: Line = (("swap ", "bold"), *graphics.bar_spans(swap_frac, bar_w, swap_colour, DIM),
                      (swap_tail, ""))
        activity: Line = (("swap in ", DIM), (fmt_rate(s_in), swap_rate_colour(s_in)), ("  out ", DIM),
                          (fmt_rate(s_out), swap_rate_colour(s_out)),
                          *((("  swapping!", f"bold {BAD}"),) if swapping(s_in, s_out) else ()),
                          ("  avail ", DIM), (fmt_bytes(avail), ""))
        return [ram, swap, activity]
