"""The rank's torch device, from the rank map's backend: a CUDA or ROCm build's GPU (both show as device type
"cuda"; torch.version.hip tells them apart) for a GPU backend torch can drive, else the CPU. Where torch has no
device for the rank's backend (an OpenCL device, a simulated GPU, or a CuPy GPU that this torch build cannot drive:
a CPU build, a CUDA build beside a ROCm GPU or the reverse, no device visible) torch computes on the CPU, and the
RankDevice says so (`torch_has_device` False): `hetbench train --frontend torch`, and a user's script through
rank_backend.open_device and offload.offload, then run the model's matmuls on that device through hetbench
(hetbench/pytorch/offload.py; a CuPy GPU's through the CuPy backend); hetbench's backend runs that rank's
collectives either way."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from hetbench.backends.base import MPI_MEMORY_KINDS, TIMING_MODELLED, capabilities
from hetbench.config import parse_backend_spec

GPU_KINDS = tuple(k for k in MPI_MEMORY_KINDS if k in ("cuda", "hip"))


@dataclass(frozen=True)
class RankDevice:
    torch_device: str  # "cuda:0", "cpu"
    vendor: str  # of the device torch computes on: nvidia, amd, or cpu
    name: str  # torch's name of it
    backend: str  # the rank map's backend for this rank (host, cupy, opencl, sim:mi300x, auto)
    torch_has_device: bool  # False where the rank's backend names a device torch cannot drive
    note: str = ""

    @property
    def device(self) -> torch.device:
        return torch.device(self.torch_device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_vendor() -> str:
    return "amd" if getattr(torch.version, "hip", None) else "nvidia"


def torch_gpu_kind() -> str | None:
    """The GPU memory kind this torch build drives, as a backend's mpi_memory_kind names it: "hip" for a ROCm
    build, "cuda" for a CUDA build, None when torch sees no GPU (a CPU build, no device visible)."""
    if not torch.cuda.is_available():
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def _gpu(local_rank: int, backend: str, index: int | None = None) -> RankDevice:
    count = torch.cuda.device_count()
    index = index if index is not None and 0 <= index < count else local_rank % count
    return RankDevice(f"cuda:{index}", gpu_vendor(), torch.cuda.get_device_name(index), backend, True)


def _cpu(backend: str, has: bool, note: str = "") -> RankDevice:
    return RankDevice("cpu", "cpu", "cpu", backend, has, note)


def for_backend(backend: Any, spec: str, local_rank: int) -> RankDevice:
    """The torch device for a rank whose hetbench backend is open (`hetbench train --frontend torch`): the GPU of a
    GPU backend whose device is real and of the kind this torch build drives (CUDA, or ROCm: torch.version.hip),
    the same device the backend opened (its `device_index`, where it has one); the CPU for the host backend; else
    the CPU, noted (the trainer then offloads the model's matmuls to the backend)."""
    kind = backend.mpi_memory_kind()
    simulated = getattr(backend, "timing", "") == TIMING_MODELLED
    if kind in GPU_KINDS and not simulated:
        drives = torch_gpu_kind()
        if drives == kind:
            return _gpu(local_rank, spec, getattr(backend, "device_index", None))
        build = {"cuda": "CUDA", "hip": "ROCm"}
        why = (f"this torch build sees no GPU (torch {torch.__version__})" if drives is None else
               f"this torch is a {build[drives]} build and the {spec} device a {build[kind]} GPU")
        return _cpu(spec, False, f"{why}: this rank's model runs on the CPU, its matmuls on {spec} through hetbench")
    if kind == "host":
        return _cpu(spec, True)
    why = "a simulated GPU" if simulated else f"the {spec} device"
    return _cpu(spec, False, f"torch cannot compute on {why}: this rank's model runs on the CPU, its matmuls on "
                             f"{spec} through hetbench")


def rank_device(backend: str | None = None, local_rank: int | None = None) -> RankDevice:
    """The rank's torch device for a user's script, without opening anything. `backend` is this rank's entry of a
    rank map (host, cupy, opencl, sim:MODEL, auto; default auto), refused as --backend refuses it (ValueError, one
    line naming it and the accepted specs): auto and cupy take the GPU torch sees (the local rank's, round robin),
    host the CPU; opencl and sim ranks compute on the CPU in torch. To compute on the device itself, open it:
    hetbench.pytorch.rank_backend.open_device, then offload."""
    name = (backend or "auto").strip().lower()
    if local_rank is None:
        local_rank = _local_rank()
    family = parse_backend_spec(name).name
    where = "cuda" if family == "auto" else capabilities(family).torch_device
    if where == "cuda" and torch.cuda.is_available():
        return _gpu(local_rank, name)
    if family == "auto" or where == "cpu":
        return _cpu(name, True)
    if where == "cuda":
        return _cpu(name, False, "torch sees no GPU here (a CPU build of torch, or no device): the CPU computes")
    return _cpu(name, False, f"torch cannot compute on {name}: this rank's model runs on the CPU (open_device and "
                             "offload put its products on the device)")


def _local_rank() -> int:
    """The rank on its node that the launcher exports (MPICH, Open MPI, torchrun, Slurm), else 0."""
    return _launcher_count(("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"), 0)


def _local_size() -> int:
    """The ranks on this node that the launcher exports (MPICH, Open MPI, torchrun, Slurm), else 1."""
    return max(1, _launcher_count(("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                                   "SLURM_NTASKS_PER_NODE"), 1))


def _launcher_count(variables: tuple[str, ...], default: int) -> int:
    return next((int(os.environ[v]) for v in variables if os.environ.get(v, "").isdigit()), default)
