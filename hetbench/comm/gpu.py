"""Whether the MPI library can take GPU buffers directly ("GPU-aware" or "device-direct" MPI).

mpi4py passes a device buffer's pointer to MPI as it is; only the MPI library knows whether it can read it.
MPICH answers through MPIX_GPU_query_support / MPIX_Query_cuda_support / MPIX_Query_hip_support /
MPIX_Query_ze_support (Level Zero, Intel GPUs), Open MPI through MPIX_Query_cuda_support and (5.x)
MPIX_Query_rocm_support. These are extensions outside mpi4py's API, so they are
looked up in the MPI library this process has loaded.
"""

from __future__ import annotations

import contextlib
import ctypes
from functools import lru_cache

# keyed by Backend.mpi_memory_kind's GPU kinds
_QUERIES = {
    "cuda": ("MPIX_Query_cuda_support",),
    "hip": ("MPIX_Query_hip_support", "MPIX_Query_rocm_support"),
    "ze": ("MPIX_Query_ze_support",),
}
# MPICH's MPIX_GPU_query_support(type, &flag), mpi.h: MPIX_GPU_SUPPORT_CUDA 0, MPIX_GPU_SUPPORT_ZE 1,
# MPIX_GPU_SUPPORT_HIP 2
_MPICH_GPU_TYPES = {"cuda": 0, "ze": 1, "hip": 2}

HOW_TO_GET_GPU_AWARE_MPI = (
    "for a GPU-aware MPI, build MPICH with --with-cuda (or --with-hip) and run with MPIR_CVAR_ENABLE_GPU=1, or "
    "Open MPI with UCX built with CUDA (or ROCm) support, then build mpi4py against it "
    "(pip install --no-binary mpi4py mpi4py); or use --path host"
)


def _loaded_mpi_libraries() -> list[str]:
    paths: list[str] = []
    with contextlib.suppress(OSError):
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                name = path.rsplit("/", 1)[-1]
                if (name.startswith("libmpi") or name.startswith("MPI.")) and ".so" in name and path not in paths:
                    paths.append(path)
    return paths


@lru_cache(maxsize=None)
def gpu_support() -> dict[str, bool | None]:
    """{"cuda": ..., "hip": ..., "ze": ...}: True or False as the MPI library answers, None where it has no such
    query.

    Call after MPI is initialised."""
    answers: dict[str, bool | None] = {kind: None for kind in _QUERIES}
    for path in _loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for kind in answers:
            if answers[kind] is not None:
                continue
            if hasattr(lib, "MPIX_GPU_query_support"):
                flag = ctypes.c_int(0)
                if lib.MPIX_GPU_query_support(_MPICH_GPU_TYPES[kind], ctypes.byref(flag)) == 0:
                    answers[kind] = bool(flag.value)
                    continue
            for symbol in _QUERIES[kind]:
                if hasattr(lib, symbol):
                    answers[kind] = bool(getattr(lib, symbol)())
                    break
    return answers
