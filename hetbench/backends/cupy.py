"""The cupy backend: NVIDIA GPUs through a CUDA build of CuPy, AMD GPUs through a ROCm build, in one module.

`cupy.cuda.runtime.is_hip` tells which build is installed; the calls used here are the same in both.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Iterator

import numpy as np

from hetbench.backends.base import (
    Capabilities,
    TIMING_MEASURED,
    BackendSpec,
    DeviceError,
    DeviceInfo,
    Elapsed,
    check_download_target,
    check_dtype,
    index_for_rank,
    touched_empty,
)
from hetbench.dtypes import DType

CAPABILITIES = Capabilities(array_module="cupy", buffers_in_host_memory=False, gpu_aware_mpi=True,
                            torch_device="cuda")

# CuPy has no bfloat16 dtype, so bf16 is not offered
CUPY_DTYPES = ("fp64", "fp32", "fp16")
INSTALL_HINT = "CuPy is not installed: pip install 'hetbench[cuda12]' (or cuda13, rocm)"
BANDWIDTH_SOURCE = "device properties (DDR estimate)"


def _import_cupy():
    """The cupy module; raises ImportError when it is missing or its CUDA/ROCm libraries cannot be loaded."""
    import cupy

    return cupy


def unavailable_reason() -> str | None:
    try:
        cupy = _import_cupy()
    except ModuleNotFoundError as e:
        if e.name in (None, "cupy"):
            return INSTALL_HINT
        return f"CuPy failed to import: {e}"
    except ImportError as e:
        return f"CuPy failed to import: {e}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError (no driver, no device), or a HIP runtime failure; its text says which
        return str(e) or type(e).__name__
    if count <= 0:
        kind = "ROCm/HIP" if is_hip_build() else "CUDA"
        return f"CuPy ({kind} build) sees no GPU on this node (device count 0)"
    return None


def is_hip_build() -> bool | None:
    """True for a ROCm build of CuPy, False for a CUDA build, None when CuPy cannot be imported."""
    try:
        cupy = _import_cupy()
    except ImportError:
        return None
    return bool(cupy.cuda.runtime.is_hip)


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).split(b"\x00", 1)[0].decode("utf-8", "replace")
    return str(value).strip()


def _cuda_version(v: int) -> str:
    # CUDA encodes versions as 1000 * major + 10 * minor (12040 is 12.4)
    return f"{v // 1000}.{(v % 1000) // 10}"


def _hip_version(v: int) -> str:
    # HIP encodes versions as major * 10_000_000 + minor * 100_000 + patch (60241134 is 6.2.41134)
    return f"{v // 10_000_000}.{(v // 100_000) % 100}.{v % 100_000}"


def _runtime_text(runtime: Any, is_hip: bool) -> tuple[str, int, int]:
    rt, drv = int(runtime.runtimeGetVersion()), int(runtime.driverGetVersion())
    if is_hip:
        text = f"HIP runtime {_hip_version(rt)}"
        # older ROCm reports a fixed 4 as the driver version, which says nothing
        if drv >= 10_000_000:
            text += f", driver {_hip_version(drv)}"
        return text, rt, drv
    return f"CUDA runtime {_cuda_version(rt)}, driver {_cuda_version(drv)}", rt, drv


def _property(runtime: Any, props: dict, index: int, key: str, attribute: str) -> int | None:
    """props[key], or the same figure through deviceGetAttribute where the properties lack it.

    CUDA 13 removed clockRate and memoryClockRate from cudaDeviceProp, so a CuPy built against it may leave
    them out; cudaDevAttrClockRate / cudaDevAttrMemoryClockRate still give them.
    """
    if props.get(key) is not None:
        return int(props[key])
    get_attribute = getattr(runtime, "deviceGetAttribute", None)
    attribute_id = getattr(runtime, attribute, None)
    if get_attribute is None or attribute_id is None:
        return None
    try:
        return int(get_attribute(attribute_id, index))
    except RuntimeError:
        return None


def describe_device(runtime: Any, index: int, backend: str = "cupy") -> DeviceInfo:
    """The DeviceInfo of device `index`, from an object with CuPy's runtime interface (cupy.cuda.runtime).

    Reads only getDeviceProperties and the version calls: it never makes a device current, so listing the
    devices does not create a context (and spend memory) on every GPU of the node.
    """
    props = runtime.getDeviceProperties(index)
    is_hip = bool(runtime.is_hip)
    name = _text(props.get("name", b""))
    details: dict[str, Any] = {}
    if is_hip:
        arch = _text(props.get("gcnArchName", b""))
        if arch:
            details["gcn_arch_name"] = arch
        name = name or arch or f"AMD GPU {index}"
    else:
        details["compute_capability"] = f"{props['major']}.{props['minor']}"
    clock_khz = _property(runtime, props, index, "clockRate", "cudaDevAttrClockRate")
    memory_clock_khz = _property(runtime, props, index, "memoryClockRate", "cudaDevAttrMemoryClockRate")
    bus_width_bits = props.get("memoryBusWidth")
    details["multiprocessor_count"] = props.get("multiProcessorCount")
    details["clock_rate_khz"] = clock_khz
    details["memory_clock_rate_khz"] = memory_clock_khz
    details["memory_bus_width_bits"] = bus_width_bits
    if all(k in props for k in ("pciDomainID", "pciBusID", "pciDeviceID")):
        details["pci_bus_id"] = f"{props['pciDomainID']:04x}:{props['pciBusID']:02x}:{props['pciDeviceID']:02x}.0"

    bandwidth_gbps = None
    if memory_clock_khz and bus_width_bits:
        # two transfers per memory clock; an estimate, not a datasheet figure: HBM parts whose reported
        # memory clock is not the DDR clock come out off by their own factor
        bandwidth_gbps = 2 * memory_clock_khz * 1e3 * bus_width_bits / 8 / 1e9
        details["memory_bandwidth_source"] = BANDWIDTH_SOURCE

    runtime_text, rt, drv = _runtime_text(runtime, is_hip)
    details["runtime_version"] = rt
    details["driver_version"] = drv
    return DeviceInfo(
        backend=backend,
        index=index,
        vendor="AMD" if is_hip else "NVIDIA",
        name=name,
        kind="gpu",
        memory_bytes=int(props["totalGlobalMem"]),
        dtypes=CUPY_DTYPES,
        runtime=runtime_text,
        memory_bandwidth_gbps=bandwidth_gbps,
        details=details,
    )


def list_devices() -> list[DeviceInfo]:
    cupy = _import_cupy()
    runtime = cupy.cuda.runtime
    devices = []
    for i in range(runtime.getDeviceCount()):
        info = describe_device(runtime, i)
        info.details["cupy_version"] = getattr(cupy, "__version__", None)
        devices.append(info)
    return devices


def _device_error_types(cupy: Any) -> tuple[type[BaseException], ...]:
    """The exceptions CuPy raises when the device (not the caller) fails."""
    found: list[type[BaseException]] = []
    for path in ("cuda.runtime.CUDARuntimeError", "cuda.memory.OutOfMemoryError", "cuda.cublas.CUBLASError"):
        obj: Any = cupy
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except (AttributeError, ImportError):  # cupy.cuda.cublas is imported on first access
            continue
        if isinstance(obj, type) and issubclass(obj, BaseException):
            found.append(obj)
    return tuple(found)


class CupyBackend:
    """One GPU, with one non-blocking stream on which all of this backend's work is issued."""

    name = "cupy"
    timing = TIMING_MEASURED

    def __init__(self, index: int, runtime_module: Any = None, cupy_module: Any = None) -> None:
        self._cupy = cupy_module if cupy_module is not None else _import_cupy()
        self._runtime = runtime_module if runtime_module is not None else self._cupy.cuda.runtime
        self._index = index
        self._error_types = _device_error_types(self._cupy)
        self._info = None
        with self._device_errors("opening the device"):
            self._info = describe_device(self._runtime, index)
            self._device = self._cupy.cuda.Device(index)
            # a stream belongs to the device that is current when it is created
            with self._device:
                self._stream = self._cupy.cuda.Stream(non_blocking=True)

    @property
    def device_index(self) -> int:
        return self._index

    @property
    def array_module(self) -> Any:
        """The cupy module: this device's arrays support NumPy's API, so `hetbench train` keeps a rank's training
        state on the GPU and computes its elementwise work there too (hetbench/harness/ops.py)."""
        return self._cupy

    @property
    def stream(self) -> Any:
        """The stream all of this backend's work goes to."""
        return self._stream

    @contextlib.contextmanager
    def _device_errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._error_types as e:
            device = f"cupy:{self._index}" + (f" {self._info.name}" if self._info is not None else "")
            raise DeviceError(f"{what} failed on {device} (host {socket.gethostname()}): {e}") from e

    @contextlib.contextmanager
    def _on_stream(self, what: str) -> Iterator[None]:
        with self._device_errors(what), self._device, self._stream:
            yield

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        with self._device_errors("querying free memory"), self._device:
            free_bytes, _total = self._runtime.memGetInfo()
            # blocks CuPy's pool holds but does not use are free to this process, not to the driver
            pooled_bytes = self._cupy.get_default_memory_pool().free_bytes()
        return int(free_bytes) + int(pooled_bytes)

    def max_allocation_bytes(self) -> int | None:
        return None

    def upload(self, host: np.ndarray, dtype: DType) -> Any:
        check_dtype(self._info, dtype)
        with self._on_stream("upload"):
            array = self._cupy.asarray(np.ascontiguousarray(host, dtype=dtype.host), dtype=dtype.host)
            # the copy may still read `host` after asarray returns; the caller owns `host` again once we return
            self._stream.synchronize()
        return array

    def download(self, array: Any, dtype: DType) -> np.ndarray:
        with self._device_errors("download"), self._device:
            host = array.get(stream=self._stream)
            # older CuPy returns before a copy on an explicit stream has finished
            self._stream.synchronize()
        return np.ascontiguousarray(host, dtype=dtype.host)

    def download_buffer(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        """Pinned host memory for download_into (base.download_buffer): the copy engine writes it at the link's
        speed; pageable memory with its pages touched where pinning fails (the host is short of lockable memory)."""
        import cupyx

        try:
            with self._device_errors("pinned host buffer allocation"):
                return cupyx.empty_pinned(tuple(shape), dtype=dtype.host)
        except DeviceError:
            return touched_empty(tuple(shape), dtype)

    def download_into(self, array: Any, out: np.ndarray) -> None:
        check_download_target(array, out)
        with self._device_errors("download"), self._device:
            array.get(stream=self._stream, out=out)
            self._stream.synchronize()

    def empty(self, shape: tuple[int, ...], dtype: DType) -> Any:
        check_dtype(self._info, dtype)
        with self._on_stream("allocation"):
            return self._cupy.empty(shape, dtype=dtype.host)

    def matmul(self, a: Any, b: Any, out: Any, dtype: DType) -> None:
        check_dtype(self._info, dtype)
        with self._on_stream("matmul"):
            self._cupy.matmul(a, b, out=out)

    # --- pipelined host staging (hetbench.comm.staging): cudaMemcpyAsync on this backend's stream, an event each ---
    # (from CuPy's documented API: cupy.cuda.runtime.memcpyAsync, cupy.cuda.Event's record/done/synchronize,
    # cupyx.empty_pinned; the staged collectives ran once on an H100, docs/gpu.md; the suite drives it
    # with a fake CuPy, tests/unit/test_staging.py)

    def _copy_async(self, dst: int, src: int, nbytes: int, kind: int, what: str) -> "_CupyPending":
        runtime = self._cupy.cuda.runtime
        with self._on_stream(what):
            if nbytes:
                runtime.memcpyAsync(dst, src, nbytes, kind, self._stream.ptr)
            event = self._cupy.cuda.Event(disable_timing=True)
            event.record(self._stream)
        return _CupyPending(self, event)

    def copy_to_host_async(self, array: Any, offset: int, out: np.ndarray, after: Any = ()) -> "_CupyPending":
        """out[:] = array[offset : offset + len(out)] on the stream (one stream: `after` is met by its order). `out`
        should be pinned (staging_buffer): from pageable memory the copy is synchronous."""
        src = array.data.ptr + offset * array.dtype.itemsize
        return self._copy_async(out.ctypes.data, src, out.nbytes, self._cupy.cuda.runtime.memcpyDeviceToHost,
                                "chunk copy to the host")

    def copy_from_host_async(self, host: np.ndarray, array: Any, offset: int, after: Any = ()) -> "_CupyPending":
        dst = array.data.ptr + offset * array.dtype.itemsize
        return self._copy_async(dst, host.ctypes.data, host.nbytes, self._cupy.cuda.runtime.memcpyHostToDevice,
                                "chunk copy to the device")

    def staging_buffer(self, count: int, dtype: DType) -> np.ndarray:
        """Pinned (page-locked) host memory, which the GPU's copy engines read and write while the host works."""
        import cupyx

        with self._device_errors("pinned staging buffer allocation"):
            return cupyx.empty_pinned((count,), dtype=dtype.host)

    def synchronize(self) -> None:
        with self._device_errors("synchronize"):
            self._stream.synchronize()

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        cuda = self._cupy.cuda
        # events belong to the device current when they are created, and must match the stream's
        with self._device_errors("timer"), self._device:
            start, end = cuda.Event(), cuda.Event()
            start.record(self._stream)
        yield elapsed
        with self._device_errors("timer"), self._device:
            end.record(self._stream)
            end.synchronize()
            elapsed.seconds = cuda.get_elapsed_time(start, end) / 1000.0

    def mpi_buffer(self, array: Any) -> Any:
        # MPI reads the device memory outside our stream's order: the producing work must be done
        self.synchronize()
        return array

    def mpi_memory_kind(self) -> str:
        return "hip" if self._runtime.is_hip else "cuda"

    def close(self) -> None:
        with self._device_errors("close"), self._device:
            self._stream.synchronize()
            # give the pool's unused blocks on this device back, so the next user sees them as free
            self._cupy.get_default_memory_pool().free_all_blocks()


class _CupyPending:
    """A CUDA/HIP event recorded after one chunk's copy (hetbench.backends.base.Pending)."""

    modelled_seconds = 0.0

    def __init__(self, backend: CupyBackend, event: Any) -> None:
        self._backend, self._event = backend, event

    def done(self) -> bool:
        with self._backend._device_errors("chunk copy"):
            return bool(self._event.done)

    def wait(self) -> None:
        with self._backend._device_errors("chunk copy"):
            self._event.synchronize()


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> CupyBackend:
    cupy = _import_cupy()
    index = index_for_rank(spec, cupy.cuda.runtime.getDeviceCount(), local_rank)
    return CupyBackend(index)
