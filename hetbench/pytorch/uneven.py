"""Training across unequal ranks with torch's own DDP and FSDP2, exact under uneven batch shares.

The rule that makes uneven shares exact: each rank's loss is its rows' part of the GLOBAL mean (the sum of its
rows' losses over the global batch), and the ranks' gradients are SUMMED, not averaged. Then any split of the batch,
a zero share included, gives the gradient of the whole batch. DDP averages by default (wrong with uneven rows, and
silently so): `exact_ddp` registers a SUM comm hook. FSDP2 divides by the world size: `exact_fully_shard` sets a
divide factor of 1 and sum-only reductions on EVERY fully_shard'ed module (set on the root alone, the others still
average).

A rank with no rows must still run forward and backward, or the other ranks wait forever in collectives it never
reaches (DDP's bucket all-reduces, FSDP2's and shard_module's gathers and reduce-scatters). Many models cannot take
an empty batch (Hugging Face attention cannot): `local_batch` gives such a rank one placeholder row, whose loss
counts exactly zero while its forward and backward run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hetbench.harness import split_plan as plan
from hetbench.results.profile import ProfileError, load_profile

PROBE_SHAPE = 256  # auto weights: each rank's torch matmul rate at PROBE_SHAPE^3, fp32
PROBE_REPEATS = 5


def matmul_rate(device: torch.device | str = "cpu", n: int = PROBE_SHAPE, repeats: int = PROBE_REPEATS,
                m: int | None = None, k: int | None = None) -> float:
    """This rank's torch fp32 matmul rate (flop/s) at m x n x k (default n x n x n) on `device`: the median of
    `repeats` timed runs after one warm-up."""
    device = torch.device(device)
    m = n if m is None else m
    k = n if k is None else k
    a = torch.randn(m, k, device=device)
    b = torch.randn(k, n, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.matmul(a, b)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        times.append(time.perf_counter() - start)
    return 2.0 * m * n * k / statistics.median(times)


def _world(group: Any) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def resolve_weights(weights: str | Sequence[float], group: Any = None, device: torch.device | str = "cpu",
                    rate: Callable[[], float] | None = None) -> list[float]:
    """One weight per rank of `group` (default: the world) from `weights`: "even", "auto" (each rank's
    matmul_rate on `device`, or `rate()`, gathered: collective), a profile path from `hetbench calibrate` (its rows
    rates), a list of numbers, or the same as text "3,1". Raises plan.WeightsError with a one-line message."""
    _, size = _world(group)
    if not isinstance(weights, str):
        weights = ",".join(repr(float(w)) for w in weights)
    parsed = plan.parse_weights(weights, size)
    if parsed.kind == "even":
        return [1.0] * size
    if parsed.kind == "list":
        return list(parsed.values)
    if parsed.kind == "profile":
        try:
            return list(load_profile(parsed.path, size, "fp32", "rows", None).rates)
        except ProfileError as e:
            raise plan.WeightsError(str(e)) from None
    mine = rate() if rate is not None else matmul_rate(device)
    if size == 1:
        return [mine]
    rates: list[Any] = [None] * size
    dist.all_gather_object(rates, mine, group=group)
    return [float(r) for r in rates]


def batch_rows(batch: int, weights: str | Sequence[float] = "even", group: Any = None,
               device: torch.device | str = "cpu", rate: Callable[[], float] | None = None) -> list[int]:
    """Rows of a global batch of `batch` for every rank, in proportion to the weights (see resolve_weights),
    summing to `batch` (largest remainder; a zero weight gets zero rows)."""
    return plan.shares(resolve_weights(weights, group, device, rate), batch)


def row_range(rows: Sequence[int], rank: int | None = None) -> tuple[int, int]:
    """[start, stop) of `rank`'s rows (default: this rank, and then `rows` must hold one count per rank of the
    world) in the global batch split into `rows`. Raises ValueError, the same on every rank: the checks read
    nothing that differs between ranks."""
    rows = list(rows)
    if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0 for r in rows):
        raise ValueError(f"row_range: rows must be counts >= 0 (one per rank), got {rows}")
    if rank is None:
        rank, size = _world(None)
        if len(rows) != size:
            raise ValueError(f"row_range: {len(rows)} row counts given for a world of {size} ranks: give one per "
                             "rank (batch_rows makes them)")
    if not 0 <= rank < len(rows):
        raise ValueError(f"row_range: rank {rank} has no count in {rows} (ranks 0-{len(rows) - 1})")
    start = int(sum(rows[:rank]))
    return start, start + int(rows[rank])


def part_of_mean(losses: torch.Tensor, global_batch: int) -> torch.Tensor:
    """This rank's part of the global mean loss: the sum of its rows' losses over the global batch. Summed over
    the ranks (which exact_ddp and exact_fully_shard do with the gradients), it is the whole batch's mean."""
    return losses.sum() / global_batch


_PASSED = (type(None), bool, int, float, str)  # batch values that are not rows: given to every rank as they are


@dataclass(frozen=True)
class LocalBatch:
    """This rank's part of a global batch (made by local_batch). `data` has the global batch's structure: its rows
    [start, stop) of every tensor, or, where the rank has none (rows 0), one placeholder row (row 0 of the global
    batch) that keeps the model's collectives in step. Take the loss through part_of_mean or counted, never
    hb.part_of_mean: they count the placeholder as nothing."""

    data: Any
    rows: int  # the rank's own rows; 0: data holds the placeholder row
    start: int
    stop: int

    @property
    def placeholder(self) -> bool:
        """True where data holds the placeholder row, not rows of the rank's own."""
        return self.rows == 0

    def part_of_mean(self, losses: torch.Tensor, global_count: int | float | torch.Tensor) -> torch.Tensor:
        """The sum of the rank's losses over `global_count` (the global batch's rows, or its tokens where `losses`
        holds (rows, tokens) per-token losses, ignored ones zero): its part of the global mean. `losses`' first
        dimension is data's rows. On a placeholder it is an exact 0 whose backward gives exact zero gradients, even
        where the placeholder's losses are NaN (a row whose labels are all ignored under a mean)."""
        data_rows = max(self.rows, 1)
        if losses.dim() == 0 or losses.shape[0] != data_rows:
            raise ValueError(f"LocalBatch.part_of_mean: losses of shape {tuple(losses.shape)} given for "
                             f"{data_rows} row{'s' if data_rows != 1 else ''}: give one loss (or one row of token "
                             "losses) per row of data")
        # a slice of no rows sums to 0 and sends zeros back: 0 * loss would be NaN where the loss is
        return losses[:self.rows].sum() / global_count

    def counted(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` as the rank's part of the step's loss: itself where the rank has rows; on a placeholder an exact 0
        (NaN or not) whose backward gives exact zero gradients. For a loss the model already reduced as the rank's
        part of the global mean, e.g. Hugging Face's model(**data, num_items_in_batch=GLOBAL_TOKENS).loss."""
        if self.rows:
            return loss
        return loss.masked_fill(torch.ones_like(loss, dtype=torch.bool), 0.0)


def _leaves(batch: Any, where: str) -> Iterable[tuple[str, torch.Tensor]]:
    """(where, tensor) of every tensor in a batch of tensors, mappings, lists and tuples; refuses anything else."""
    if isinstance(batch, torch.Tensor):
        yield where, batch
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from _leaves(value, f"{where}[{key!r}]")
    elif isinstance(batch, (list, tuple)):
        for i, value in enumerate(batch):
            yield from _leaves(value, f"{where}[{i}]")
    elif not isinstance(batch, _PASSED):
        raise ValueError(f"local_batch: {where} is a {type(batch).__module__}.{type(batch).__qualname__}; a batch "
                         "holds tensors (split by rows along their first dimension) in dicts, lists and tuples, and "
                         "None, numbers and text (given to every rank as they are)")


def _take(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        return {key: _take(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple keeps its type
        return type(batch)(*(_take(value, start, stop) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_take(value, start, stop) for value in batch)
    return batch


def local_batch(batch: Any, rows: Sequence[int], rank: int | None = None) -> LocalBatch:
    """This rank's rows of the global `batch` (a tensor, or dicts, lists and tuples of tensors whose first
    dimension is the batch's rows, as Hugging Face models take input_ids, attention_mask and labels), split into
    `rows` (one count per rank, batch_rows makes them; `rank` default: this rank, see row_range). A rank with no
    rows gets one placeholder row, row 0 of the batch, to run the model's forward and backward on, so that its
    collectives meet the other ranks'; LocalBatch.part_of_mean and .counted make its loss an exact 0. Tensors are
    sliced (views), mappings come back as dicts. Raises ValueError, one line, the same on every rank given the
    same batch: rows that do not sum to the batch's rows, tensors that disagree on them, a batch without rows."""
    try:
        start, stop = row_range(rows, rank)
    except ValueError as e:
        raise ValueError(str(e).replace("row_range:", "local_batch:", 1)) from None
    total = int(sum(rows))
    leaves = list(_leaves(batch, "batch"))
    if not leaves:
        raise ValueError("local_batch: the batch holds no tensor: give a tensor, or dicts, lists and tuples of "
                         "tensors whose first dimension is the batch's rows")
    for where, t in leaves:
        if t.dim() == 0:
            raise ValueError(f"local_batch: {where} is a 0-dimensional tensor: every tensor's first dimension is "
                             "the batch's rows")
        if t.shape[0] != total:
            raise ValueError(f"local_batch: {where} has {t.shape[0]} rows (its first dimension) but the rows "
                             f"{list(rows)} sum to {total}: give the global batch and one count per rank summing "
                             "to its rows")
    if total == 0:
        raise ValueError(f"local_batch: the batch has no rows (rows {list(rows)}): a step needs at least one row "
                         "to run the model on")
    if stop > start:
        return LocalBatch(_take(batch, start, stop), stop - start, start, stop)
    return LocalBatch(_take(batch, 0, 1), 0, start, stop)


def _sum_hook(group, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook: the bucket's gradients summed over the ranks (DDP's own hook averages). Unannotated: DDP
    refuses a hook whose annotations are not dist.GradBucket and torch.futures.Future, and this module's
    annotations are strings."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def exact_ddp(module: nn.Module, process_group: Any = None, **kwargs: Any) -> nn.parallel.DistributedDataParallel:
    """torch's DistributedDataParallel with gradients summed over the ranks: exact for any batch shares when each
    rank's loss is part_of_mean."""
    model = nn.parallel.DistributedDataParallel(module, process_group=process_group, **kwargs)
    model.register_comm_hook(process_group, _sum_hook)
    return model


def exact_fully_shard(model: nn.Module, units: Iterable[nn.Module] = (), **kwargs: Any) -> nn.Module:
    """FSDP2 (`fully_shard`) over each of `units` (in the order given), then the root `model`, with every
    FSDPModule summing its gradients (divide factor 1, sum-only reductions): exact for any batch shares when each
    rank's loss is part_of_mean. kwargs go to every fully_shard call (mesh, reshard_after_forward, ...).

    Without a mesh, each rank's mesh is the world group on the device its model's parameters lie on: fully_shard's
    own default takes the machine's accelerator, so on a node with a GPU a CPU (or OpenCL, or simulated) rank's
    parameters moved to cuda:0 and its host-side work failed (first seen on an H100)."""
    from torch.distributed.fsdp import fully_shard

    if "mesh" not in kwargs:
        kwargs["mesh"] = rank_mesh(model)
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    sum_gradients(model)
    return model


def rank_mesh(model: nn.Module, group: Any = None) -> Any:
    """A one-dimensional DeviceMesh over `group` (default: the world) whose device type is that of `model`'s first
    parameter on this rank (cpu on a CPU rank, cuda on a GPU rank): mixed ranks each name their own."""
    from torch.distributed.device_mesh import DeviceMesh

    param = next(model.parameters(), None)
    device_type = param.device.type if param is not None else "cpu"
    return DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)


def sum_gradients(model: nn.Module) -> int:
    """Make every FSDPModule in `model` sum its gradients over the ranks; returns how many were set."""
    from torch.distributed.fsdp import FSDPModule

    count = 0
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
            count += 1
    return count
