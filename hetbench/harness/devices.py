"""Opening each rank's device for a run: the backend its spec names, checked against the run's dtype."""

from __future__ import annotations

from dataclasses import dataclass

from hetbench.backends.base import (
    capabilities,
    MPI_MEMORY_HOST,
    MPI_MEMORY_NONE,
    Backend,
    BackendSpec,
    BackendUnavailable,
    DeviceInfo,
    UnsupportedDtype,
    check_dtype,
    open_backend,
    spec_label,
)
from hetbench.backends.host import share_blas_threads
from hetbench.comm import gpu
from hetbench.comm.world import World
from hetbench.dtypes import DType


@dataclass
class OpenDevice:
    """One rank's device, open and able to compute in the run's dtype."""

    backend: Backend
    info: DeviceInfo
    spec: str  # as the user named it, or what `auto` chose


def open_rank_device(spec: BackendSpec, dtype: DType, world: World) -> tuple[OpenDevice | None, list[str]]:
    """Open this rank's device and check its dtype. Returns (device, errors) for World.agree."""
    try:
        backend = open_backend(spec, world.local_rank, world.local_size)
    except (BackendUnavailable, ValueError) as e:
        return None, [str(e)]
    if not capabilities(backend.name).limits_own_threads:  # the host backend limits its BLAS itself, and records it
        share_blas_threads(world.local_size)
    info = backend.info()
    try:
        check_dtype(info, dtype)
    except UnsupportedDtype as e:
        backend.close()
        return None, [str(e)]
    return OpenDevice(backend, info, spec_label(spec, info)), []


def device_path_error(backend: Backend, info: DeviceInfo, dtype: DType, world: World) -> str | None:
    """Why this rank's device cannot hand its buffers to MPI directly (`--path device`), or None when it can:
    host memory, or GPU memory with an MPI library built for that GPU."""
    # no device index in the message: ranks with the same kind of device then report one line
    label = f"{info.backend} device {info.name}"
    kind = backend.mpi_memory_kind()
    if kind == MPI_MEMORY_NONE:
        return f"--path device: {label} has no buffer MPI can take directly (OpenCL buffers have none); use --path host"
    if kind == MPI_MEMORY_HOST:
        return None  # host memory is what every MPI takes
    support = gpu.gpu_support()
    if kind not in support:
        return f"--path device: no GPU-aware MPI path exists for {info.vendor} device {label}; use --path host"
    answer = support[kind]
    if answer:
        return None
    said = "reports no" if answer is False else "has no query for"
    return (f"--path device hands {label}'s buffers to MPI directly, but this MPI library ({world.mpi_library()}) "
            f"{said} {kind.upper()} support; {gpu.HOW_TO_GET_GPU_AWARE_MPI}")
