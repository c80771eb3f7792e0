"""hetbench's PyTorch front end: `import hetbench.pytorch` registers the torch.distributed backend "hetbench" (MPI
underneath, so one job can span NVIDIA, AMD, OpenCL, simulated and CPU ranks), and gives a user's own script what
it needs to train across unequal devices: the rank's device, batch rows by weights, DDP and FSDP2 made exact under
uneven batch shares, a placeholder row for a rank with none (local_batch), hetbench's own FSDP with shards sized by
the weights (shard_module, its sharded checkpoints and read_checkpoint), pipeline stages and tensor-parallel slices
cut by the weights (pipeline, tensor_parallel), a hetbench device for the rank that torch cannot drive (open_device,
its offload), and a per-step metrics logger. Needs torch (the `torch` extra); hetbench without it works.
"""

from __future__ import annotations

from hetbench.pytorch_support import torch_problem

_problem = torch_problem()
if _problem is not None:
    raise ImportError(_problem)

from hetbench.pytorch import backend as _backend  # noqa: E402
from hetbench.pytorch import rendezvous as _rendezvous  # noqa: E402
from hetbench.pytorch.backend import BACKEND_NAME, BackendError, HetbenchProcessGroup, set_path  # noqa: E402
from hetbench.pytorch.device import RankDevice, rank_device  # noqa: E402
from hetbench.pytorch.fsdp import (  # noqa: E402
    ShardedCheckpointError,
    ShardedModule,
    ShardedParameterError,
    WrapError,
    read_checkpoint,
    shard_module,
    sharded,
)
from hetbench.pytorch.logger import StepLogger, hetbench_group  # noqa: E402
from hetbench.pytorch.offload import Offloaded, OffloadMode  # noqa: E402
from hetbench.pytorch.pipeline import PipelineError, PipelinedModel, pipeline  # noqa: E402
from hetbench.pytorch.rank_backend import HetbenchDevice, open_device  # noqa: E402
from hetbench.pytorch.tensor import (  # noqa: E402
    Gathered,
    Pair,
    TensorParallel,
    TensorParallelError,
    heads,
    pair,
    tensor_parallel,
)
from hetbench.pytorch.uneven import (  # noqa: E402
    LocalBatch,
    batch_rows,
    exact_ddp,
    exact_fully_shard,
    local_batch,
    matmul_rate,
    part_of_mean,
    resolve_weights,
    row_range,
    sum_gradients,
)

_backend.register()
_rendezvous.install()


def init(path: str | None = None) -> None:
    """init_process_group("hetbench") unless a default group exists; `path` host or device (default: the
    HETBENCH_TORCH_PATH variable, else host). Rank and world size come from MPI."""
    import torch.distributed as dist

    if path is not None:
        set_path(path)
    if not dist.is_initialized():
        dist.init_process_group(BACKEND_NAME)


def all_ranks(value: object, group: object = None) -> list:
    """Collective: every rank's `value` (any picklable object), in rank order, on every rank."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [value]
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


def collective_metrics(group: object = None) -> dict:
    """The hetbench backend's figures per collective since the group was made (this rank's), {} under another
    backend."""
    pg = hetbench_group(group)
    return pg.metrics.totals() if pg is not None else {}


__all__ = [
    "BACKEND_NAME", "BackendError", "Gathered", "HetbenchDevice", "HetbenchProcessGroup", "LocalBatch", "OffloadMode",
    "Offloaded", "Pair", "PipelineError", "PipelinedModel", "RankDevice", "ShardedCheckpointError", "ShardedModule",
    "ShardedParameterError", "StepLogger", "TensorParallel", "TensorParallelError", "WrapError", "all_ranks",
    "batch_rows", "collective_metrics", "exact_ddp", "exact_fully_shard", "heads", "hetbench_group", "init",
    "local_batch", "matmul_rate", "open_device", "pair", "part_of_mean", "pipeline", "rank_device",
    "read_checkpoint", "resolve_weights", "row_range", "set_path", "shard_module", "sharded", "sum_gradients",
    "tensor_parallel",
]
