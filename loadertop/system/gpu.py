"""GPU readings: one small reader interface and its NVML implementation (the tests' fake, for
machines without a GPU, is `tests/fakes.py`'s `FakeGpuReader`).

A reader answers `read() -> (status, gpus)`. `status` is one of "ok", "no_nvml" (no driver or
library: a CPU-only machine), "no_gpu" (NVML works, zero devices) or "error: <short reason>";
`gpus` is a list of plain dicts (see `GPU_FIELDS`). A figure the driver cannot give is None,
never a made-up 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

# The keys of one GPU dict, in order. Processes are [{"pid": int, "used_mem_bytes": int | None}].
GPU_FIELDS = (
    "index",
    "name",
    "uuid",
    "util_percent",
    "mem_util_percent",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "processes",
)

# How long a failed nvmlInit is believed before trying again: a CPU-only machine should pay for
# the failed dlopen once a minute at most, yet a driver loaded later is still noticed.
NVML_RETRY_S = 60.0


@runtime_checkable
class GpuReader(Protocol):
    """Anything that can report the machine's GPUs."""

    def read(self) -> tuple[str, list[dict[str, Any]]]:
        """Return (status, gpus); never raises for a missing or broken driver."""
        ...

    def close(self) -> None:
        """Release whatever the reader holds (NVML); safe to call twice."""
        ...


class NvmlGpuReader:
    """Reads NVIDIA GPUs through NVML (`pynvml`, from the nvidia-ml-py package).

    NVML is initialised on the first `read()`, not at construction, so creating a sampler costs
    nothing on a CPU-only machine. `nvml` and `clock` are injectable for tests.
    """

    def __init__(
        self,
        nvml: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = NVML_RETRY_S,
    ):
        self._nvml = nvml
        self._clock = clock
        self._retry_s = retry_s
        self._initialised = False
        self._failed_status: str | None = None  # why the last init failed
        self._failed_at = 0.0

    def read(self) -> tuple[str, list[dict[str, Any]]]:
        status = self._ensure_init()
        if status is not None:
            return status, []
        nvml = self._nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            return error_status(e), []
        if count == 0:
            return "no_gpu", []
        gpus: list[dict[str, Any]] = []
        lost: list[str] = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as e:
                # One bad device (e.g. "GPU is lost") must not hide the others.
                lost.append(f"gpu {index}: {e}")
                continue
            gpus.append(self._read_device(index, handle))
        return (_error_text("; ".join(lost)) if lost else "ok"), gpus

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    # --- internals ---------------------------------------------------------------------------

    def _ensure_init(self) -> str | None:
        """Initialise NVML once; return a status string when it is not usable."""
        if self._initialised:
            return None
        if self._failed_status is not None and self._clock() - self._failed_at < self._retry_s:
            return self._failed_status
        status = self._try_init()
        if status is None:
            self._initialised = True
            self._failed_status = None
        else:
            self._failed_status, self._failed_at = status, self._clock()
        return status

    def _try_init(self) -> str | None:
        if self._nvml is None:
            try:
                import pynvml
            except Exception:
                return "no_nvml"
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            missing = tuple(
                cls
                for cls in (
                    getattr(nvml, "NVMLError_LibraryNotFound", None),
                    getattr(nvml, "NVMLError_DriverNotLoaded", None),
                )
                if cls is not None
            )
            return "no_nvml" if missing and isinstance(e, missing) else error_status(e)
        except OSError:
            # ctypes can raise OSError directly when the library exists but cannot load.
            return "no_nvml"
        return None

    def _read_device(self, index: int, handle: Any) -> dict[str, Any]:
        nvml = self._nvml
        field = self._field
        memory = field(nvml.nvmlDeviceGetMemoryInfo, handle)
        rates = field(nvml.nvmlDeviceGetUtilizationRates, handle)
        power_mw = field(nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = field(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        name = field(nvml.nvmlDeviceGetName, handle)
        uuid = field(nvml.nvmlDeviceGetUUID, handle)
        return {
            "index": index,
            "name": _text(name) if name is not None else f"GPU {index}",
            "uuid": _text(uuid) if uuid is not None else None,
            "util_percent": float(rates.gpu) if rates is not None else None,
            "mem_util_percent": float(rates.memory) if rates is not None else None,
            "mem_used_bytes": int(memory.used) if memory is not None else None,
            "mem_total_bytes": int(memory.total) if memory is not None else None,
            "temperature_c": self._temperature(handle),
            "power_w": power_mw / 1000.0 if power_mw is not None else None,  # NVML reports mW
            "power_limit_w": limit_mw / 1000.0 if limit_mw is not None else None,
            "processes": self._processes(handle),
        }

    def _field(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML getter; any NVMLError (NotSupported, FunctionNotFound, NoPermission on
        consumer cards and older drivers) makes that one figure None instead of failing the read."""
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _temperature(self, handle: Any) -> float | None:
        nvml = self._nvml
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        # nvidia-ml-py 13 deprecates nvmlDeviceGetTemperature in favour of ...V, which older
        # drivers lack (FunctionNotFound): try the new one, fall back to the old.
        for name in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
            fn = getattr(nvml, name, None)
            if fn is not None:
                value = self._field(fn, handle, sensor)
                if value is not None:
                    return float(value)
        return None

    def _processes(self, handle: Any) -> list[dict[str, Any]]:
        nvml = self._nvml
        by_pid: dict[int, int | None] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            fn = getattr(nvml, name, None)
            for proc in (self._field(fn, handle) if fn is not None else None) or []:
                used = getattr(proc, "usedGpuMemory", None)  # None under WDDM / without permission
                pid = int(proc.pid)
                # A process that is both compute and graphics is listed twice: keep one entry.
                if pid not in by_pid or by_pid[pid] is None:
                    by_pid[pid] = int(used) if used is not None else None
        return [{"pid": pid, "used_mem_bytes": used} for pid, used in by_pid.items()]


def _text(value: Any) -> str:
    # Older pynvml releases return bytes for names and UUIDs.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def error_status(exc: BaseException) -> str:
    """The "error: <short reason>" status for an exception."""
    return _error_text(str(exc) or type(exc).__name__)


def _error_text(reason: str) -> str:
    reason = " ".join(reason.split())
    return "error: " + (reason[:77] + "..." if len(reason) > 80 else reason)
