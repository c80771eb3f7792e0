"""Backends: where hetbench computes. See base.py for the protocol and the registry."""

from hetbench.backends.base import (
    BACKEND_NAMES,
    MPI_MEMORY_KINDS,
    Backend,
    BackendModule,
    BackendSpec,
    BackendUnavailable,
    DeviceError,
    DeviceInfo,
    Elapsed,
    UnsupportedDtype,
    backend_module,
    check_dtype,
    devices_on_node,
    open_backend,
    resolve_auto,
)

__all__ = [
    "BACKEND_NAMES",
    "MPI_MEMORY_KINDS",
    "Backend",
    "BackendModule",
    "BackendSpec",
    "BackendUnavailable",
    "DeviceError",
    "DeviceInfo",
    "Elapsed",
    "UnsupportedDtype",
    "backend_module",
    "check_dtype",
    "devices_on_node",
    "open_backend",
    "resolve_auto",
]
