"""The GPU panel: per GPU its name, temperature, power, utilisation and memory, and a utilisation
graph; or, honestly, why there is no GPU figure (no NVML, no GPU, an NVML error)."""

from __future__ import annotations

from loadertop.client.document import GpuFigures, SystemFigures
from loadertop.client.units import MISSING, fmt_pair, fmt_pct
from loadertop.tui.theme import ACCENT, BAD, DIM, load_colour
from loadertop.tui.widgets import graphics
from loadertop.tui.widgets.graphics import Line
from loadertop.tui.widgets.history import MachineSeries
from loadertop.tui.widgets.panel import MachinePanel


class GpuPanel(MachinePanel):
    TITLE = "GPU"
    ID = "gpu"

    NAME = "GPU"
    UTIL = MachineSeries("GPU util", lambda system: {g.index: g.util_percent for g in system.gpus})
    SERIES = (UTIL,)

    def machine_lines(self, system: SystemFigures, width: int) -> list[Line]:
        status = system.gpu_status
        if status == "no_nvml":
            return [(("No GPU: NVML not available", DIM),)]
        if status == "no_gpu" or (status == "ok" and not system.gpus):
            return [(("No GPU found", DIM),)]
        if status.startswith("error"):
            return [((f"GPU {status}", BAD),)]
        out: list[Line] = []
        for gpu in system.gpus:
            out += self._gpu_lines(gpu, width)
        return out

    def _gpu_lines(self, gpu: GpuFigures, width: int) -> list[Line]:
        util = gpu.util_percent
        used, total = gpu.mem_used_bytes, gpu.mem_total_bytes
        mem_frac = used / total if used is not None and total else None
        temp = MISSING if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"
        if self.compact:
            power = MISSING if gpu.power_w is None else f"{gpu.power_w:.0f} W"
            return [((f"GPU{gpu.index} ", "bold"), ("util ", DIM), (fmt_pct(util), ACCENT), ("  mem ", DIM),
                     (fmt_pair(used, total), ""), (f"  {temp}  {power}", ""))]
        limit = gpu.power_limit_w
        head: Line = ((f"GPU{gpu.index} ", "bold"), (gpu.name, DIM), (f"  {temp}  ", ""),
                      (MISSING if gpu.power_w is None else f"{gpu.power_w:.0f}", ""),
                      (f"/{limit:.0f} W" if limit else " W", DIM))
        bar_w = max(6, width - 24)
        util_line: Line = (("util ", DIM),
                           *graphics.bar_spans(None if util is None else util / 100, bar_w, ACCENT, DIM),
                           (f" {fmt_pct(util):>6}", ""))
        mem_colour = load_colour(None if mem_frac is None else mem_frac * 100)
        mem_line: Line = (("mem  ", DIM), *graphics.bar_spans(mem_frac, bar_w, mem_colour, DIM),
                          (f" {fmt_pair(used, total)}", ""))
        points = self._history.machine(self.UTIL, gpu.index)
        graph: Line = (("util ", DIM), (graphics.sparkline(points, max(4, width - 5), top=100.0), ACCENT))
        return [head, util_line, mem_line, graph]
