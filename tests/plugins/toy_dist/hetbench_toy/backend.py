"""A toy backend, `--backend toy`: NumPy arrays behind a device of its own (fp32 and fp64 only, one device per node
unless HETBENCH_TOY_DEVICES says more), timed by the host's clock. It is the whole of what adding a backend takes:
this module (the BackendModule protocol of hetbench/backends/base.py: CAPABILITIES, unavailable_reason,
list_devices, open_device) and an entry point in the "hetbench.backends" group."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Iterator

import numpy as np

from hetbench.backends.base import (
    MPI_MEMORY_HOST,
    TIMING_MEASURED,
    BackendSpec,
    Capabilities,
    DeviceInfo,
    Elapsed,
    check_dtype,
    index_for_rank,
)
from hetbench.dtypes import DType

CAPABILITIES = Capabilities(array_module="numpy", buffers_in_host_memory=True, torch_device="cpu")
DEVICES_ENV = "HETBENCH_TOY_DEVICES"


def unavailable_reason() -> str | None:
    return "HETBENCH_TOY_DEVICES=0: no toy device" if _count() == 0 else None


def _count() -> int:
    return int(os.environ.get(DEVICES_ENV, "1"))


def _info(index: int) -> DeviceInfo:
    return DeviceInfo(backend="toy", index=index, vendor="Toy", name=f"Toy Device {index}", kind="accelerator",
                      memory_bytes=None, dtypes=("fp32", "fp64"), runtime=f"NumPy {np.__version__}")


def list_devices() -> list[DeviceInfo]:
    return [_info(i) for i in range(_count())]


class ToyBackend:
    name = "toy"
    timing = TIMING_MEASURED

    def __init__(self, index: int) -> None:
        self._info = _info(index)
        self.device_index = index

    def info(self) -> DeviceInfo:
        return self._info

    def free_memory_bytes(self) -> int | None:
        return None

    def max_allocation_bytes(self) -> int | None:
        return None

    def upload(self, host: np.ndarray, dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.array(host, dtype=dtype.host, order="C", copy=True)

    def download(self, array: Any, dtype: DType) -> np.ndarray:
        return np.array(array, dtype=dtype.host, copy=True)

    def empty(self, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
        check_dtype(self._info, dtype)
        return np.empty(shape, dtype=dtype.host)

    def matmul(self, a: Any, b: Any, out: Any, dtype: DType) -> None:
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

    def mpi_buffer(self, array: Any) -> Any | None:
        return array

    def mpi_memory_kind(self) -> str:
        return MPI_MEMORY_HOST

    def close(self) -> None:
        pass


def open_device(spec: BackendSpec, local_rank: int, local_size: int) -> ToyBackend:
    return ToyBackend(index_for_rank(spec, _count(), local_rank))
