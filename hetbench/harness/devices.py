"""Opening each rank's device for a run: the backend its spec names, checked against the run's dtype."""

from __future__ import annotations

from dataclasses import dataclass

from hetbench.backends.base import (
    Backend,
    BackendSpec,
    BackendUnavailable,
    DeviceInfo,
    UnsupportedDtype,
    check_dtype,
    open_backend,
    spec_label,
)
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
    if backend.name != "host":  # the host backend limits its BLAS itself, and records it
        from hetbench.backends.host import share_blas_threads

        share_blas_threads(world.local_size)
    info = backend.info()
    try:
        check_dtype(info, dtype)
    except UnsupportedDtype as e:
        backend.close()
        return None, [str(e)]
    return OpenDevice(backend, info, spec_label(spec, info)), []
