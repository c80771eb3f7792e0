"""Memory facts every benchmark's pre-check reads: whether a device's buffers are host memory, and byte counts
said alike on every rank."""

from __future__ import annotations

from hetbench.backends.base import DeviceInfo, capabilities

MIB = 1024**2


def device_in_host_memory(info: DeviceInfo) -> bool:
    """Whether a device's buffers are host memory: the host itself, simulated GPUs (NumPy arrays underneath) and
    CPU OpenCL devices. Their buffers then count against the host's memory too."""
    return capabilities(info.backend).buffers_in_host_memory or info.kind == "cpu"


def approx_bytes(n: int) -> str:
    """A byte count to two significant digits (about 810 MiB): what ranks report alike though their own figures
    differ a little, so the job prints one line for them."""
    for unit, size in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if n >= size:
            return f"about {float(f'{n / size:.2g}'):g} {unit}"
    return f"{n} bytes"
