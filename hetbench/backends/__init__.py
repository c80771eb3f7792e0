"""Backends: where hetbench computes. See base.py for the protocol and the registry."""

from hetbench.backends.base import (
    BACKEND_NAMES,
    Backend,
    BackendSpec,
    BackendUnavailable,
    DeviceError,
    DeviceInfo,
    Elapsed,
    backend_module,
    devices_on_node,
    open_backend,
    resolve_auto,
)

__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendSpec",
    "BackendUnavailable",
    "DeviceError",
    "DeviceInfo",
    "Elapsed",
    "backend_module",
    "devices_on_node",
    "open_backend",
    "resolve_auto",
]
