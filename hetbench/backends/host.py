"""The host backend: NumPy on the CPU, GEMM through whatever BLAS NumPy is linked against."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from typing import Any, Iterator

import numpy as np

from hetbench.backends.base import (
    MPI_MEMORY_HOST,
    TIMING_MEASURED,
    BackendSpec,
    BackendUnavailable,
    DeviceInfo,
    Elapsed,
    check_dtype,
)
from hetbench.dtypes import DType

# fp16 works (NumPy computes it without BLAS, slowly); bf16 has no host arithmetic
HOST_DTYPES = ("fp64", "fp32", "fp16")
_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def unavailable_reason() -> str | None:
    return None


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_vendor(name: str) -> str:
    for vendor in ("AMD", "Intel", "Apple", "Ampere", "NVIDIA"):
        if vendor.lower() in name.lower():
            return vendor
    return platform.machine()


def host_memory_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: what the host can still allocate without swapping."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return None


def _mem_total_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def _blas_pools() -> list[dict[str, Any]]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [p for p in threadpool_info() if p.get("user_api") == "blas"]


def blas_description() -> tuple[str, int | None]:
    """(e.g. 'openblas 0.3.27 SkylakeX', threads) for the BLAS NumPy uses."""
    pools = _blas_pools()
    if not pools:
        return "unknown BLAS", None
    p = pools[0]
    parts = [p.get("internal_api", "blas"), p.get("version") or ""]
    if p.get("architecture"):
        parts.append(p["architecture"])
    return " ".join(x for x in parts if x), p.get("num_threads")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _device_info(threads: int | None) -> DeviceInfo:
    name = _cpu_name()
    blas, blas_threads = blas_description()
    threads = threads if threads is not None else blas_threads
    return DeviceInfo(
        backend="host",
        index=0,
        vendor=_cpu_vendor(name),
        name=name,
        kind="cpu",
        memory_bytes=_mem_total_bytes(),
        dtypes=HOST_DTYPES,
        runtime=f"NumPy {np.__version__}, {blas}" + (f", {threads} threads" if threads else ""),
        details={"blas": blas, "blas_threads": threads, "cores": _cores()},
    )


def list_devices() -> list[DeviceInfo]:
    return [_device_info(None)]


class HostBackend:
    name = "host"
    timing = TIMING_MEASURED

    def __init__(self, threads: int | None = None) -> None:
        self._limiter = None
        if threads is not None:
            from threadpoolctl import threadpool_limits

            self._limiter = threadpool_limits(limits=threads, user_api="blas")
        self._info = _device_info(threads)

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        return host_memory_available_bytes()

    def max_allocation_bytes(self) -> int | None:
        return None

    def upload(self, host: np.ndarray, dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.array(host, dtype=dtype.host, order="C", copy=True)

    def download(self, array: np.ndarray, dtype: DType) -> np.ndarray:
        return np.array(array, dtype=dtype.host, order="C", copy=True)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.empty(shape, dtype=dtype.host)

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, dtype: DType) -> None:
        check_dtype(self._info, dtype)
        np.matmul(a, b, out=out)

    def synchronize(self) -> None:
        pass

    @contextlib.contextmanager
    def timer(self) -> Iterator[Elapsed]:
        elapsed = Elapsed()
        start = time.perf_counter()
        yield elapsed
        elapsed.seconds = time.perf_counter() - start

    def mpi_buffer(self, array: np.ndarray) -> np.ndarray:
        return array

    def mpi_memory_kind(self) -> str:
        return MPI_MEMORY_HOST

    def close(self) -> None:
        if self._limiter is not None:
            self._limiter.restore_original_limits()
            self._limiter = None


def threads_for_rank(local_size: int) -> int | None:
    """BLAS threads for one of `local_size` ranks on a node: the cores shared out, unless the user set a count."""
    if any(os.environ.get(v) for v in _THREAD_ENV) or local_size <= 1:
        return None
    return max(1, _cores() // local_size)


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> HostBackend:
    if spec.index not in (None, 0):
        raise BackendUnavailable(f"the host backend has one device, index 0; got index {spec.index}")
    return HostBackend(threads_for_rank(local_size))
