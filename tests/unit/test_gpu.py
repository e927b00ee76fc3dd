"""Tests for loadertop.system.gpu: the real NVML path on this (driverless) machine, every NVML code
path through a fake `pynvml` module, and the FakeGpuReader other modules' tests use."""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from loadertop.system import GpuReader, NvmlGpuReader
from loadertop.system.gpu import GPU_FIELDS

from fakes import FakeGpuReader, make_gpu

# --- a fake pynvml ------------------------------------------------------------------------------


class NVMLError(Exception):
    def __init__(self, message: str = "Unknown Error"):
        super().__init__(message)


def _error_class(name: str, message: str) -> type[NVMLError]:
    return type(name, (NVMLError,), {"__init__": lambda self: NVMLError.__init__(self, message)})


NotSupported = _error_class("NVMLError_NotSupported", "Not Supported")
FunctionNotFound = _error_class("NVMLError_FunctionNotFound", "Function Not Found")
LibraryNotFound = _error_class("NVMLError_LibraryNotFound", "NVML Shared Library Not Found")
DriverNotLoaded = _error_class("NVMLError_DriverNotLoaded", "Driver Not Loaded")
NoPermission = _error_class("NVMLError_NoPermission", "Insufficient Permissions")
GpuIsLost = _error_class("NVMLError_GpuIsLost", "GPU is lost")


class FakeNvml(types.SimpleNamespace):
    """Just enough of pynvml's surface; each test breaks the parts it is about."""

    def __init__(self, devices: list[dict[str, Any]] | None = None,
                 init_error: type[Exception] | None = None):
        super().__init__(
            NVMLError=NVMLError,
            NVMLError_NotSupported=NotSupported,
            NVMLError_FunctionNotFound=FunctionNotFound,
            NVMLError_LibraryNotFound=LibraryNotFound,
            NVMLError_DriverNotLoaded=DriverNotLoaded,
            NVML_TEMPERATURE_GPU=0,
        )
        self.devices = devices if devices is not None else [_device()]
        self.init_error = init_error
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        device = self.devices[index]
        if "handle_error" in device:
            raise device["handle_error"]()
        return device

    def _get(self, handle: dict[str, Any], key: str) -> Any:
        value = handle[key]
        if isinstance(value, type) and issubclass(value, Exception):
            raise value()
        return value

    def nvmlDeviceGetName(self, h):
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._get(h, "rates")

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._get(h, "memory")

    def nvmlDeviceGetTemperatureV(self, h, sensor):
        assert sensor == 0
        return self._get(h, "temperature_v")

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == 0
        return self._get(h, "temperature")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._get(h, "limit_mw")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._get(h, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return self._get(h, "graphics")


def _proc(pid: int, used: int | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(pid=pid, usedGpuMemory=used)


def _device(**overrides: Any) -> dict[str, Any]:
    device = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-1234",
        "rates": types.SimpleNamespace(gpu=87, memory=40),
        "memory": types.SimpleNamespace(total=80 << 30, used=20 << 30, free=60 << 30),
        "temperature_v": 61,
        "temperature": 60,
        "power_mw": 350_500,
        "limit_mw": 700_000,
        "compute": [_proc(4242, 10 << 30), _proc(4343, None)],
        "graphics": [],
    }
    device.update(overrides)
    return device


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- the real NVML on this machine --------------------------------------------------------------


def test_real_reader_without_driver_says_no_nvml_and_tries_nvml_once(monkeypatch):
    """The real pynvml (or none): a driverless machine reads "no_nvml", and the failed init (a
    dlopen) is what the reader caches, not retried at every read. Counted, not timed: how long a
    dlopen takes is the machine's business."""
    reader = NvmlGpuReader()
    inits = []
    try:
        import pynvml
    except Exception:
        pynvml = None  # not installed: the import's failure is the status, cached alike
    else:
        real_init = pynvml.nvmlInit
        monkeypatch.setattr(pynvml, "nvmlInit", lambda: (inits.append(1), real_init())[1])
    status, gpus = reader.read()
    again = [reader.read() for _ in range(3)]
    reader.close()
    if status == "ok":  # pragma: no cover - only on a machine with a GPU
        assert gpus and json.dumps(gpus)
        return
    assert status == "no_nvml" and gpus == []
    assert again == [("no_nvml", [])] * 3
    assert len(inits) == (0 if pynvml is None else 1)  # within NVML_RETRY_S: one try, four reads


def test_pynvml_not_installed_is_no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert NvmlGpuReader().read() == ("no_nvml", [])


# --- NVML code paths through the fake module ----------------------------------------------------


def test_full_device_reading():
    nvml = FakeNvml()
    reader = NvmlGpuReader(nvml)
    status, gpus = reader.read()
    assert status == "ok"
    assert gpus == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-1234",
            "util_percent": 87.0,
            "mem_util_percent": 40.0,
            "mem_used_bytes": 20 << 30,
            "mem_total_bytes": 80 << 30,
            "temperature_c": 61.0,
            "power_w": 350.5,
            "power_limit_w": 700.0,
            "processes": [{"pid": 4242, "used_mem_bytes": 10 << 30}, {"pid": 4343, "used_mem_bytes": None}],
        }
    ]
    assert tuple(gpus[0]) == GPU_FIELDS
    json.dumps(gpus)
    reader.read()
    assert nvml.init_calls == 1  # initialised once, not per read


def test_unsupported_fields_are_none_not_fatal():
    nvml = FakeNvml(
        [
            _device(
                temperature_v=FunctionNotFound,  # older driver: no ...V entry point
                temperature=NotSupported,
                power_mw=NotSupported,
                limit_mw=NoPermission,
                rates=NotSupported,
                uuid=NotSupported,
                graphics=FunctionNotFound,
            )
        ]
    )
    status, (gpu,) = NvmlGpuReader(nvml).read()
    assert status == "ok"
    for key in ("temperature_c", "power_w", "power_limit_w", "util_percent", "mem_util_percent", "uuid"):
        assert gpu[key] is None, key
    assert gpu["mem_total_bytes"] == 80 << 30
    assert len(gpu["processes"]) == 2


def test_temperature_falls_back_to_old_call_and_bytes_are_decoded():
    nvml = FakeNvml([_device(temperature_v=FunctionNotFound, temperature=55, name=b"Tesla T4",
                             uuid=b"GPU-9")])
    _, (gpu,) = NvmlGpuReader(nvml).read()
    assert gpu["temperature_c"] == 55.0
    assert gpu["name"] == "Tesla T4" and gpu["uuid"] == "GPU-9"


def test_processes_in_both_lists_are_listed_once():
    nvml = FakeNvml([_device(compute=[_proc(7, None)], graphics=[_proc(7, 1024), _proc(8, 2048)])])
    _, (gpu,) = NvmlGpuReader(nvml).read()
    assert gpu["processes"] == [{"pid": 7, "used_mem_bytes": 1024}, {"pid": 8, "used_mem_bytes": 2048}]


def test_device_count_zero_is_no_gpu():
    assert NvmlGpuReader(FakeNvml(devices=[])).read() == ("no_gpu", [])


@pytest.mark.parametrize("error", [LibraryNotFound, DriverNotLoaded])
def test_missing_library_or_driver_is_no_nvml_and_retried_once_a_minute(error):
    nvml = FakeNvml(init_error=error)
    clock = FakeClock()
    reader = NvmlGpuReader(nvml, clock=clock)
    assert reader.read() == ("no_nvml", [])
    clock.now += 30.0
    assert reader.read() == ("no_nvml", [])
    assert nvml.init_calls == 1  # cached
    # The driver gets loaded later: the next retry after a minute picks it up.
    nvml.init_error = None
    clock.now += 31.0
    status, gpus = reader.read()
    assert status == "ok" and len(gpus) == 1
    assert nvml.init_calls == 2


def test_other_init_error_is_reported():
    status, gpus = NvmlGpuReader(FakeNvml(init_error=NoPermission)).read()
    assert status == "error: Insufficient Permissions" and gpus == []


def test_library_that_cannot_load_is_no_nvml():
    nvml = FakeNvml(init_error=lambda: OSError("wrong ELF class"))
    assert NvmlGpuReader(nvml).read() == ("no_nvml", [])


def test_lost_device_is_reported_and_others_still_listed():
    nvml = FakeNvml([_device(handle_error=GpuIsLost), _device(name="second")])
    status, gpus = NvmlGpuReader(nvml).read()
    assert status == "error: gpu 0: GPU is lost"
    assert [(g["index"], g["name"]) for g in gpus] == [(1, "second")]


def test_close_shuts_nvml_down_once_and_only_if_initialised():
    nvml = FakeNvml()
    reader = NvmlGpuReader(nvml)
    reader.close()
    assert nvml.shutdown_calls == 0
    reader.read()
    reader.close()
    reader.close()
    assert nvml.shutdown_calls == 1


# --- FakeGpuReader ------------------------------------------------------------------------------


def test_fake_reader_construction():
    assert FakeGpuReader().read() == ("no_nvml", [])
    assert FakeGpuReader(status="no_gpu").read() == ("no_gpu", [])

    status, (gpu,) = FakeGpuReader.single(util=35.0, temperature_c=None).read()
    assert status == "ok" and gpu["util_percent"] == 35.0 and gpu["temperature_c"] is None
    assert tuple(gpu) == GPU_FIELDS

    status, gpus = FakeGpuReader([{"util_percent": 10.0},
                                  {"name": "B", "processes": [{"pid": 1, "used_mem_bytes": None}]}]).read()
    assert status == "ok"
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["mem_total_bytes"] is None and gpus[1]["processes"][0]["pid"] == 1
    json.dumps(gpus)


def test_fake_reader_returns_copies_and_rejects_typos():
    reader = FakeGpuReader.single()
    reader.read()[1][0]["util_percent"] = -1
    assert reader.read()[1][0]["util_percent"] == 50.0
    assert reader.reads == 2
    with pytest.raises(TypeError, match="utilisation"):
        make_gpu(utilisation=3)


def test_readers_satisfy_the_interface():
    assert isinstance(FakeGpuReader(), GpuReader)
    assert isinstance(NvmlGpuReader(FakeNvml()), GpuReader)
