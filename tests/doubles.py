"""Test doubles shared by the tests: one fake of CuPy's CUDA/HIP runtime (`cupy.cuda.runtime`), a fake `cupy`
module around it, and device arrays held in host memory.

The fakes mimic the CuPy behaviour the cupy backend relies on (checked against cupy/cuda/stream.pyx and
device.pyx): a Stream belongs to the device current at its creation and refuses to be entered on another; an Event
belongs to the device current at its creation; get_elapsed_time needs the end event completed. The runtime answers
from a list of device property dicts, written by hand or built from the sim catalog's models
(`FakeRuntime.from_models`), the way a CUDA 12.4 or ROCm 6.2 installation would answer for those devices.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hetbench.backends.sim_catalog import GpuModel

# What a CUDA 12.4 / ROCm 6.2 installation reports, as the sim backend's runtime text says ("simulated CUDA 12.4",
# "simulated HIP 6.2"). CUDA encodes 1000 * major + 10 * minor; HIP 10_000_000 * major + 100_000 * minor + patch.
SIM_CUDA_RUNTIME_VERSION = 12040
SIM_CUDA_DRIVER_VERSION = 12040
SIM_HIP_RUNTIME_VERSION = 60241134
SIM_HIP_DRIVER_VERSION = 60241134

# cudaErrorInvalidDevice and hipErrorInvalidDevice share the number 101
ERROR_INVALID_DEVICE = 101

# gcnArchName carries the target's feature settings on ROCm, as the real runtime reports them on these parts
_HIP_ARCH_FEATURES = {"gfx942": ":sramecc+:xnack-", "gfx90a": ":sramecc+:xnack-"}


class CUDARuntimeError(RuntimeError):
    """Raised as cupy.cuda.runtime.CUDARuntimeError is: `status` holds the error number, where one is known."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Memory:
    """One device's memory as memGetInfo reports it. The sim backend's ledger (SimBackend.memory) has the same
    two attributes, so a runtime can report a simulated device's allocations."""

    free_bytes: int
    total_bytes: int


def _warp_size(model: GpuModel) -> int:
    # CDNA (gfx9) runs 64-wide wavefronts; RDNA (gfx10, gfx11) and NVIDIA run 32-wide
    if model.gcn_arch_name is not None and model.gcn_arch_name.startswith("gfx9"):
        return 64
    return 32


def _hip_major_minor(gcn_arch_name: str) -> tuple[int, int]:
    # gfxMMms: major in decimal, then one hex digit each for minor and stepping (gfx942 -> 9.4, gfx1100 -> 11.0)
    digits = gcn_arch_name.removeprefix("gfx")
    return int(digits[:-2]), int(digits[-2], 16)


def model_properties(model: GpuModel, device: int, api: str) -> dict[str, Any]:
    """What cudaGetDeviceProperties (api "cuda") or hipGetDeviceProperties ("hip") answers for a catalog model at
    device index `device`."""
    if api == "hip":
        assert model.gcn_arch_name is not None
        major, minor = _hip_major_minor(model.gcn_arch_name)
    else:
        assert model.compute_capability is not None
        major, minor = model.compute_capability
    props: dict[str, Any] = {
        "name": model.name.encode(),
        "totalGlobalMem": model.memory_bytes,
        "major": major,
        "minor": minor,
        "multiProcessorCount": model.multiprocessor_count,
        "clockRate": model.clock_khz,
        "memoryClockRate": model.memory_clock_khz,
        "memoryBusWidth": model.memory_bus_width_bits,
        "warpSize": _warp_size(model),
        "maxThreadsPerBlock": 1024,
        "integrated": 0,
        # one device per PCI bus, as on a typical multi-GPU server
        "pciDomainID": 0,
        "pciBusID": 0x10 + 0x10 * device,
        "pciDeviceID": 0,
    }
    if api == "hip":
        assert model.gcn_arch_name is not None
        arch = model.gcn_arch_name + _HIP_ARCH_FEATURES.get(model.gcn_arch_name, "")
        props["gcnArchName"] = arch.encode()
    return props


class FakeRuntime:
    """CuPy's runtime interface (cupy.cuda.runtime) over a list of device property dicts."""

    CUDARuntimeError = CUDARuntimeError

    cudaDevAttrClockRate = 13
    cudaDevAttrMemoryClockRate = 36

    def __init__(self, devices: list[dict[str, Any]], is_hip: bool = False, runtime_version: int = 12040,
                 driver_version: int = 12060, free_bytes: Sequence[int] | None = None,
                 attributes: dict[tuple[int, int], int] | None = None, memories: Sequence[Any] | None = None):
        self.is_hip = is_hip
        self.devices = devices
        self.runtime_version = runtime_version
        self.driver_version = driver_version
        if memories is None:
            free = free_bytes or [d["totalGlobalMem"] // 2 for d in devices]
            memories = [Memory(f, d["totalGlobalMem"]) for f, d in zip(free, devices)]
        elif len(memories) != len(devices):
            raise ValueError("one memory per device")
        self.memories = list(memories)
        self.attributes = attributes or {}  # (attribute, device) -> value, for properties CUDA 13 dropped
        self.current = 0
        self.set_device_calls: list[int] = []
        self.count_error: Exception | None = None

    @classmethod
    def from_models(cls, models: Sequence[GpuModel], api: str | None = None,
                    memories: Sequence[Any] | None = None) -> FakeRuntime:
        """A CUDA (api "cuda") or HIP ("hip") runtime whose devices are these catalog models, reporting the
        versions of the sim backend's runtime text. `memories` (objects with free_bytes and total_bytes, such as
        SimBackend.memory) let memGetInfo follow a simulated device's allocations."""
        api = api if api is not None else (models[0].api if models else "cuda")
        if api not in ("cuda", "hip"):
            raise ValueError(f"unknown runtime api {api!r}; accepted: cuda, hip")
        for model in models:
            if model.api != api:
                raise ValueError(f"{model.name} is driven by {model.api}, not {api}")
        if memories is None:
            memories = [Memory(m.memory_bytes, m.memory_bytes) for m in models]
        is_hip = api == "hip"
        return cls(
            [model_properties(m, i, api) for i, m in enumerate(models)],
            is_hip=is_hip,
            runtime_version=SIM_HIP_RUNTIME_VERSION if is_hip else SIM_CUDA_RUNTIME_VERSION,
            driver_version=SIM_HIP_DRIVER_VERSION if is_hip else SIM_CUDA_DRIVER_VERSION,
            memories=memories,
        )

    def _check(self, i: int) -> None:
        if not 0 <= i < len(self.devices):
            prefix = "hip" if self.is_hip else "cuda"
            raise CUDARuntimeError(f"{prefix}ErrorInvalidDevice: invalid device ordinal", ERROR_INVALID_DEVICE)

    def getDeviceCount(self) -> int:  # noqa: N802 - CuPy's names
        if self.count_error is not None:
            raise self.count_error
        return len(self.devices)

    def getDeviceProperties(self, i: int) -> dict[str, Any]:  # noqa: N802
        self._check(i)
        return dict(self.devices[i])

    def deviceGetAttribute(self, attribute: int, i: int) -> int:  # noqa: N802
        self._check(i)
        try:
            return self.attributes[(attribute, i)]
        except KeyError:
            raise CUDARuntimeError("cudaErrorInvalidValue: invalid argument") from None

    def memGetInfo(self) -> tuple[int, int]:  # noqa: N802
        memory = self.memories[self.current]
        return memory.free_bytes, memory.total_bytes

    def getDevice(self) -> int:  # noqa: N802
        return self.current

    def setDevice(self, i: int) -> None:  # noqa: N802
        self._check(i)
        self.set_device_calls.append(i)
        self.current = i

    def runtimeGetVersion(self) -> int:  # noqa: N802
        return self.runtime_version

    def driverGetVersion(self) -> int:  # noqa: N802
        return self.driver_version


class FakeOutOfMemoryError(MemoryError):
    pass


class FakeCUBLASError(RuntimeError):
    pass


class FakeDeviceArray:
    """A 'device' array held in host memory, exposing __cuda_array_interface__ as mpi4py's test/arrayimpl.py does."""

    def __init__(self, fake, array, device_id):
        self._fake = fake
        self.array = array
        self.device_id = device_id

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):
        return self.array.dtype

    @property
    def __cuda_array_interface__(self):
        return {
            "shape": self.array.shape,
            "typestr": self.array.dtype.str,
            "data": (self.array.__array_interface__["data"][0], False),
            "version": 3,
            "strides": None,
        }

    def get(self, stream=None, out=None):
        self._fake.log.append(("get", stream if stream is not None else self._fake.current_stream()))
        if out is None:
            return self.array.copy()
        out[...] = self.array  # CuPy copies into `out` (a NumPy array of the same shape and dtype) and returns it
        return out


def make_fake_cupy(runtime, pool_free_bytes=0, matmul_ms=2.5):
    """A `cupy` stand-in whose calls are logged in fake.log with the stream they were issued on."""
    fake = types.SimpleNamespace(log=[], stream_stack=[], fail=None, matmul_ms=matmul_ms, __version__="0.0-fake")

    class Stream:
        def __init__(self, null=False, non_blocking=False):
            self.device_id = -1 if null else runtime.getDevice()
            self.non_blocking = non_blocking
            self.device_time_ms = 0.0

        def __enter__(self):
            if self.device_id not in (-1, runtime.getDevice()):
                raise RuntimeError(
                    f"The device that the stream is created on ({self.device_id}) does not match with the "
                    f"current device ({runtime.getDevice()})"
                )
            fake.stream_stack.append(self)
            return self

        def __exit__(self, *exc):
            fake.stream_stack.pop()

        def synchronize(self):
            fake.log.append(("stream.synchronize", self))

    null_stream = Stream(null=True)

    def current_stream():
        return fake.stream_stack[-1] if fake.stream_stack else null_stream

    class Device:
        def __init__(self, device_id):
            self.id = device_id
            self._previous = []

        def __enter__(self):
            self._previous.append(runtime.getDevice())
            runtime.setDevice(self.id)
            return self

        def __exit__(self, *exc):
            runtime.setDevice(self._previous.pop())

        def use(self):
            runtime.setDevice(self.id)

    class Event:
        def __init__(self):
            self.device_id = runtime.getDevice()
            self.stream = None
            self.time_ms = None
            self.completed = False

        def record(self, stream=None):
            stream = stream if stream is not None else current_stream()
            if stream.device_id not in (-1, self.device_id):
                raise runtime.CUDARuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle")
            self.stream = stream
            self.time_ms = stream.device_time_ms
            fake.log.append(("event.record", stream))

        def synchronize(self):
            self.completed = True

    def get_elapsed_time(start, end):
        if not end.completed:
            raise runtime.CUDARuntimeError("cudaErrorNotReady: device not ready")
        return end.time_ms - start.time_ms

    def _maybe_fail(what):
        if fake.fail is not None and fake.fail[0] == what:
            raise fake.fail[1]

    def asarray(a, dtype=None):
        fake.log.append(("asarray", current_stream()))
        _maybe_fail("asarray")
        return FakeDeviceArray(fake, np.array(a, dtype=dtype, copy=True), runtime.getDevice())

    def empty(shape, dtype=None):
        fake.log.append(("empty", current_stream()))
        return FakeDeviceArray(fake, np.empty(shape, dtype=dtype), runtime.getDevice())

    def matmul(a, b, out=None):
        stream = current_stream()
        fake.log.append(("matmul", stream))
        _maybe_fail("matmul")
        np.matmul(a.array, b.array, out=out.array)
        stream.device_time_ms += fake.matmul_ms
        return out

    pool = types.SimpleNamespace(
        free_bytes=lambda: pool_free_bytes,
        free_all_blocks=lambda: fake.log.append(("pool.free_all_blocks", runtime.getDevice())),
    )
    fake.current_stream = current_stream
    fake.asarray, fake.empty, fake.matmul = asarray, empty, matmul
    fake.get_default_memory_pool = lambda: pool
    fake.cuda = types.SimpleNamespace(
        runtime=runtime,
        Device=Device,
        Stream=Stream,
        Event=Event,
        get_elapsed_time=get_elapsed_time,
        memory=types.SimpleNamespace(OutOfMemoryError=FakeOutOfMemoryError),
        cublas=types.SimpleNamespace(CUBLASError=FakeCUBLASError),
    )
    return fake


class HostArrays:
    """A fake backend's arrays, held in host memory as NumPy arrays of the dtype's host type: upload, download and
    empty copy or allocate, matmul multiplies with NumPy (the scripted-timer backends of the matmul tests mix it in)."""

    def upload(self, host, dtype):
        return np.array(host, dtype=dtype.host)

    def download(self, array, dtype):
        return np.array(array, dtype=dtype.host)

    def empty(self, shape, dtype):
        return np.empty(shape, dtype=dtype.host)

    def matmul(self, a, b, out, dtype) -> None:
        np.matmul(a, b, out=out)


# device properties as CUDA and HIP report them (cudaGetDeviceProperties), for the fake runtime
H100 = {
    "name": b"NVIDIA H100 80GB HBM3",
    "major": 9,
    "minor": 0,
    "totalGlobalMem": 85520809984,
    "clockRate": 1980000,
    "memoryClockRate": 2619000,
    "memoryBusWidth": 5120,
    "multiProcessorCount": 132,
    "pciDomainID": 0,
    "pciBusID": 0x1B,
    "pciDeviceID": 0,
}
MI300X = {
    "name": b"AMD Instinct MI300X",
    "gcnArchName": b"gfx942:sramecc+:xnack-",
    "major": 9,
    "minor": 4,
    "totalGlobalMem": 205822885888,
    "clockRate": 2100000,
    "memoryClockRate": 1300000,
    "memoryBusWidth": 8192,
    "multiProcessorCount": 304,
    "pciDomainID": 0,
    "pciBusID": 0x0C,
    "pciDeviceID": 0,
}
HIP_6_3 = 60342131  # 6 * 10_000_000 + 3 * 100_000 + 42131
