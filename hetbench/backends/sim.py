"""The sim backend: simulated NVIDIA/AMD/Intel GPUs whose data is real and whose time is modelled.

Arrays are NumPy arrays computed on the host, so results verify like any other backend's; the time a
backend timer reports is a model (see `gemm_model_seconds`, `transfer_model_seconds`) driven by the datasheet
figures in sim_catalog.py, never the host's wall time.

Test hook: set HETBENCH_SIM_FAULT=matmul or HETBENCH_SIM_FAULT=upload to make that operation raise
DeviceError, HETBENCH_SIM_FAULT=corrupt to make every matmul get one element wrong, or corrupt-copy to make
every copy to the host get its first element wrong; on every rank, or on one rank with `matmul@<rank>` (the rank
in COMM_WORLD, hetbench.comm.world.world_rank). It exists to test failure handling and verification.
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from hetbench.backends.base import (
    Capabilities,
    MPI_MEMORY_NONE,
    TIMING_MODELLED,
    BackendSpec,
    BackendUnavailable,
    DeviceError,
    DeviceInfo,
    Done,
    Elapsed,
    accepted_specs,
    check_dtype,
    spec_index,
)
from hetbench.backends.host import host_memory_available_bytes
from hetbench.backends.sim_catalog import CATALOG, MODELS, GpuModel
from hetbench.comm.world import world_rank
from hetbench.dtypes import DType, get_dtype, round_to_bf16, to_host_dtype

CAPABILITIES = Capabilities(array_module="numpy", buffers_in_host_memory=True, simulated=True,
                            spec_syntax="{name}:MODEL[:INDEX]")

FAULT_ENV = "HETBENCH_SIM_FAULT"
FAULT_OPERATIONS = ("matmul", "upload", "corrupt", "corrupt-copy")

_RUNTIME_TEXT = {
    "cuda": "simulated CUDA 12.4 (modelled)",
    "hip": "simulated HIP 6.2 (modelled)",
    "opencl": "simulated OpenCL (modelled)",
}

# What the real backend for each api hands MPI: CuPy's CUDA or HIP pointers; OpenCL's cl_mem handles, which no MPI
# takes (see mpi_memory_kind)
_MPI_MEMORY_KIND = {"cuda": "cuda", "hip": "hip", "opencl": MPI_MEMORY_NONE}


def unavailable_reason() -> str | None:
    return None


def models() -> dict[str, GpuModel]:
    """The catalog, key -> GpuModel."""
    return dict(MODELS)


def get_model(key: str) -> GpuModel:
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown simulated GPU {key!r}; accepted: {', '.join(MODELS)}") from None


def parse_spec(text: str, parts: list[str]) -> BackendSpec:
    """`sim:MODEL` or `sim:MODEL:INDEX`, MODEL a catalog key (the --backend syntax of this backend)."""
    catalog = models()
    if len(parts) < 2 or not parts[1]:
        raise ValueError(f"backend {text!r} names no simulated GPU; write sim:MODEL, MODEL one of: "
                         f"{', '.join(catalog)}")
    if len(parts) > 3:
        raise ValueError(f"malformed backend {text!r}; accepted: {accepted_specs()}")
    model = parts[1].strip().lower()
    if model not in catalog:
        raise ValueError(f"unknown simulated GPU {parts[1]!r} in {text!r}; accepted: {', '.join(catalog)}")
    return BackendSpec(parts[0].strip().lower(), spec_index(parts[2], text) if len(parts) == 3 else None, model)


def spec_of(info: DeviceInfo) -> str:
    """A simulated GPU by its catalog key, `sim:h100`: its place in the catalog is no index --backend takes."""
    return f"{info.backend}:{info.details['model']}"


def _dtype(dtype: DType | str) -> DType:
    return get_dtype(dtype) if isinstance(dtype, str) else dtype


def gemm_model_seconds(model: GpuModel, m: int, n: int, k: int, dtype: DType | str) -> float:
    """Modelled time of one m x k by k x n GEMM: the slower of compute at peak and moving A, B and C once
    through device memory, plus one launch."""
    dtype = _dtype(dtype)
    try:
        peak_tflops = model.peak_tflops[dtype.name]
    except KeyError:
        raise ValueError(
            f"{model.name} has no native {dtype.name} arithmetic; it computes in {', '.join(model.dtypes)}"
        ) from None
    compute_s = 2.0 * m * n * k / (peak_tflops * 1e12)
    memory_s = (m * k + k * n + m * n) * dtype.itemsize / (model.memory_bandwidth_gbps * 1e9)
    return max(compute_s, memory_s) + model.launch_latency_us * 1e-6


def transfer_model_seconds(model: GpuModel, nbytes: int) -> float:
    """Modelled time of one host<->device copy of nbytes over the host link, plus its start-up latency."""
    return nbytes / (model.host_link_gbps * 1e9) + model.launch_latency_us * 1e-6


def _fault_applies(operation: str) -> bool:
    setting = os.environ.get(FAULT_ENV, "").strip()
    target, _, rank = setting.partition("@")
    return bool(setting) and target == operation and (not rank or rank.strip() == str(world_rank()))


def fault_setting_error() -> str | None:
    """A HETBENCH_SIM_FAULT value the hook does not know: a message naming it and the accepted ones, else None.
    (A misspelt fault would otherwise inject nothing, and a test of failure handling would pass for nothing.)"""
    setting = os.environ.get(FAULT_ENV, "").strip()
    target, at, rank = setting.partition("@")
    if not setting or (target in FAULT_OPERATIONS and (not at or re.fullmatch(r"[0-9]+", rank.strip()))):
        return None
    return (f"{FAULT_ENV}={setting!r} is not a fault the sim backend knows; accepted: "
            f"{', '.join(FAULT_OPERATIONS)}, each optionally followed by @RANK (e.g. matmul@1)")


def _check_fault(operation: str, where: str) -> None:
    if _fault_applies(operation):
        setting = os.environ[FAULT_ENV].strip()
        raise DeviceError(f"simulated device fault injected by {FAULT_ENV}={setting} ({operation} on {where})")


class DeviceMemory:
    """Bytes a simulated device holds, counted at the device's element size, released when arrays die."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.allocated_bytes = 0

    @property
    def free_bytes(self) -> int:
        return self.total_bytes - self.allocated_bytes

    def reserve(self, nbytes: int, where: str) -> None:
        if nbytes > self.free_bytes:
            raise DeviceError(
                f"out of memory on {where}: {nbytes} bytes requested, {self.free_bytes} of "
                f"{self.total_bytes} free (simulated)"
            )
        self.allocated_bytes += nbytes

    def release(self, nbytes: int) -> None:
        self.allocated_bytes -= nbytes


def device_info(model: GpuModel, index: int) -> DeviceInfo:
    """The DeviceInfo of a simulated `model` at `index`, built from the catalog."""
    details: dict[str, Any] = {
        "model": model.key,
        "host_link": model.host_link,
        "host_link_gbps": model.host_link_gbps,
        "launch_latency_us": model.launch_latency_us,
        "multiprocessor_count": model.multiprocessor_count,
        "memory_bus_width_bits": model.memory_bus_width_bits,
    }
    if model.compute_capability is not None:
        details["compute_capability"] = "{}.{}".format(*model.compute_capability)
    if model.gcn_arch_name is not None:
        details["gcn_arch_name"] = model.gcn_arch_name
    if model.notes:
        details["notes"] = model.notes
    details["sources"] = list(model.source)
    return DeviceInfo(
        backend="sim",
        index=index,
        vendor=model.vendor,
        name=f"{model.name} (simulated)",
        kind="gpu",
        memory_bytes=model.memory_bytes,
        dtypes=model.dtypes,
        runtime=_RUNTIME_TEXT[model.api],
        peak_tflops=dict(model.peak_tflops),
        peak_source=model.source[0],
        memory_bandwidth_gbps=model.memory_bandwidth_gbps,
        modelled=True,
        details=details,
    )


def list_devices() -> list[DeviceInfo]:
    """The whole catalog, index = position in it."""
    return [device_info(model, i) for i, model in enumerate(CATALOG)]


class SimBackend:
    """One simulated GPU: NumPy data in dtype.host representation, a modelled clock."""

    name = "sim"
    timing = TIMING_MODELLED

    def __init__(self, model: GpuModel, index: int = 0) -> None:
        self.model = model
        self.index = index
        self._info = device_info(model, index)
        self._memory = DeviceMemory(model.memory_bytes)
        self._clock_s = 0.0
        self._where = f"sim:{model.key}:{index} ({model.name}, simulated)"

    @property
    def modelled_seconds(self) -> float:
        """The modelled device clock: seconds of device time since the device was opened."""
        return self._clock_s

    @property
    def memory(self) -> DeviceMemory:
        """The device memory ledger: what this device's live arrays hold, at the device's element size."""
        return self._memory

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        # the data really lives in host memory, so the host can run out first
        available = host_memory_available_bytes()
        free = self._memory.free_bytes
        return free if available is None else min(free, available)

    def max_allocation_bytes(self) -> int | None:
        return None

    def _allocate(self, nbytes: int, make: Callable[[], np.ndarray]) -> np.ndarray:
        # reserve first, so an oversized request fails before the host copy is made; the bytes come back
        # when the array is garbage-collected, as a device buffer's do when its owner frees it
        self._memory.reserve(nbytes, self._where)
        try:
            array = make()
        except BaseException:
            self._memory.release(nbytes)
            raise
        weakref.finalize(array, self._memory.release, nbytes)
        return array

    def upload(self, host: np.ndarray, dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        _check_fault("upload", self._where)
        nbytes = int(np.size(host)) * dtype.itemsize
        array = self._allocate(
            nbytes, lambda: np.array(to_host_dtype(host, dtype), dtype=dtype.host, order="C", copy=True)
        )
        self._clock_s += transfer_model_seconds(self.model, nbytes)
        return array

    def download(self, array: np.ndarray, dtype: DType) -> np.ndarray:
        self._clock_s += transfer_model_seconds(self.model, array.size * dtype.itemsize)
        host = np.array(array, dtype=dtype.host, order="C", copy=True)
        if host.size and _fault_applies("corrupt-copy"):
            host.flat[0] += 1.0  # a copy that arrives wrong: what the collectives' check must catch
        return host

    def copy_to_host_async(self, array: np.ndarray, offset: int, out: np.ndarray, after: Any = ()) -> Done:
        """A chunk copied to the host (pipelined staging): done at once, its modelled time on the device clock and in
        the answer; corrupt-copy gets its first element wrong, as every whole copy's."""
        for pending in after:
            pending.wait()
        np.copyto(out, array[offset : offset + len(out)])
        if out.size and _fault_applies("corrupt-copy"):
            out[0] += 1.0
        seconds = transfer_model_seconds(self.model, out.nbytes)
        self._clock_s += seconds
        return Done(seconds)

    def copy_from_host_async(self, host: np.ndarray, array: np.ndarray, offset: int, after: Any = ()) -> Done:
        for pending in after:
            pending.wait()
        array[offset : offset + len(host)] = host
        seconds = transfer_model_seconds(self.model, host.nbytes)
        self._clock_s += seconds
        return Done(seconds)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self._allocate(nbytes, lambda: np.empty(shape, dtype=dtype.host))

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, dtype: DType) -> None:
        check_dtype(self._info, dtype)
        _check_fault("matmul", self._where)
        (m, k), (k2, n) = a.shape, b.shape
        if k2 != k or out.shape != (m, n):
            raise ValueError(f"matmul shapes do not fit: {a.shape} @ {b.shape} -> {out.shape}")
        if dtype.name in ("fp16", "bf16"):
            # as a GPU GEMM with half inputs does: products accumulated in fp32, the result rounded once to
            # the output type
            c = np.matmul(a.astype(np.float32), b.astype(np.float32))
            out[...] = round_to_bf16(c) if dtype.name == "bf16" else c.astype(np.float16)
        else:
            np.matmul(a, b, out=out)
        if _fault_applies("corrupt"):
            out.flat[out.size // 2] += 1.0  # one wrong element: what the verification must catch
        self._clock_s += gemm_model_seconds(self.model, m, n, k, dtype)

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        start = self._clock_s
        yield elapsed
        elapsed.seconds = self._clock_s - start

    def mpi_buffer(self, array: np.ndarray) -> np.ndarray | None:
        if self.mpi_memory_kind() == MPI_MEMORY_NONE:
            return None  # a simulated OpenCL device hands MPI nothing, as a real one does
        # simulated device memory is host memory: MPI can take it directly
        return array

    def mpi_memory_kind(self) -> str:
        """The kind the simulated device's real backend would answer: "cuda" for the NVIDIA models, "hip" for the
        AMD ones (both driven through CuPy), "none" for the Intel one, whose catalog api is OpenCL."""
        return _MPI_MEMORY_KIND[self.model.api]

    def close(self) -> None:
        pass


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> SimBackend:
    """spec.model names the catalog entry; spec.index (default: the local rank) tells simulated devices of the
    same model apart."""
    if spec.model is None:
        raise BackendUnavailable(
            f"the sim backend needs a GPU model: write sim:<model>, e.g. sim:h100; accepted: {', '.join(MODELS)}"
        )
    try:
        model = get_model(spec.model)
    except ValueError as e:
        raise BackendUnavailable(str(e)) from None
    fault_error = fault_setting_error()
    if fault_error is not None:
        raise BackendUnavailable(fault_error)
    index = local_rank if spec.index is None else spec.index
    if index < 0:
        raise BackendUnavailable(f"device index {index} is out of range for backend sim: indices start at 0")
    return SimBackend(model, index)
