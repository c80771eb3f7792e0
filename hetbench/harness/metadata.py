"""The metadata that makes a figure reproducible: versions, hosts, command line, date (after pyperf)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import secrets
import shlex
import sys
from typing import Any

import hetbench

_PACKAGES = ("numpy", "mpi4py", "cupy", "pyopencl", "pyclblast", "click", "rich", "threadpoolctl", "mpich")
_CUPY_DISTS = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy-rocm-7-0", "cupy-rocm-6-0", "cupy")


def package_versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (nothing is imported, so no device is touched)."""
    versions: dict[str, str | None] = {"hetbench": hetbench.__version__}
    for package in _PACKAGES:
        candidates = _CUPY_DISTS if package == "cupy" else (package,)
        versions[package] = None
        for dist in candidates:
            try:
                versions[package] = importlib.metadata.version(dist)
                if package == "cupy" and dist != "cupy":
                    versions["cupy_distribution"] = dist
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def command_line() -> str:
    program = os.path.basename(sys.argv[0]) if sys.argv else "hetbench"
    if program == "__main__.py":  # python -m hetbench: the command a user would type
        program = "hetbench"
    argv = [program, *sys.argv[1:]]
    return shlex.join(argv)


def new_run_id(when: _dt.datetime) -> str:
    """A short id for one run: the UTC time, compact, and 8 random hex digits (20261123T111500Z-3f9a2c1b), so runs
    started in the same second still differ."""
    return f"{when.astimezone(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}"


def job_metadata(world: Any) -> dict[str, Any]:
    """Facts of the whole job, taken on the calling rank (call on rank 0)."""
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "run_id": new_run_id(now),
        "date_utc": now.isoformat(timespec="seconds"),
        "command_line": command_line(),
        "world_size": world.size,
        "hosts": list(world.hosts),
        "mpi_library": world.mpi_library(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": package_versions(),
    }


def rank_metadata() -> dict[str, Any]:
    """Facts of one rank's process, gathered from every rank."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEYS}
    return {"host": platform.node(), "pid": os.getpid(), "python": platform.python_version(), "env": env}


# Environment variables that change what a run measures
_ENV_KEYS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUPY_TF32",
    "HETBENCH_OPENCL_GEMM",
    "HETBENCH_SIM_FAULT",
    "MPICH_GPU_SUPPORT_ENABLED",
    "UCX_TLS",
)


def rank_description(world: Any, device: Any) -> dict[str, Any]:
    """One rank's device and process, for the metadata's "ranks" list (gathered from every rank)."""
    return {"rank": world.rank, "host": world.host, "backend": device.spec, "device_timing": device.backend.timing,
            "device_info": device.info.to_dict(), "process": rank_metadata()}
