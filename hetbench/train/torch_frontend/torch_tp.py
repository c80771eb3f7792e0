"""torch's own even tensor parallelism for hetbench's two task models (hetbench/train/torch_frontend/models.py): the
baseline that hetbench's uneven tensor parallelism (hetbench/pytorch/tensor.py) is measured against. The model is cut
by torch.distributed.tensor.parallel.parallelize_module with ColwiseParallel / RowwiseParallel over a 1-D DeviceMesh
made from the group (the "hetbench" backend's, so a group can span vendors); torch splits every cut dimension as
torch.chunk does.

    tp = torch_tensor_parallel(model)          # collective over the group (default: the world)
    loss = row_losses(tp.module, x, y).sum()   # every rank the same rows: loss and gradients those of one process
    whole = tp.full_state_dict()               # collective: every parameter whole, the model's own names and layout

mlp (ResidualMLP): each layers.*.linear column-parallel, its output gathered whole (the residual needs every column).
gpt (CharGPT): attention by whole heads, heads // ranks a rank (heads % ranks == 0, else refused): the fused qkv's
rows permuted first so that each rank's contiguous chunk is [its q | its k | its v] (torch's chunk of the fused
[q | k | v] would give rank 0 all of q and part of k), qkv column-parallel, attn.proj row-parallel, attn.heads set to
the rank's heads; the MLP's fc column-parallel, proj row-parallel. Embeddings, LayerNorms and the head stay whole
(plain tensors) on every rank. Every style uses use_local_output=True, so the model's own code (chunk, view, gelu)
sees plain tensors.

A Linear offloaded to a hetbench device (hetbench.pytorch.offload: `offload_ops` set), before or after this call, runs
its local product there: the DTensor operands' local shards go through device_linear, and the result is wrapped as
the DTensor the style expects (column: Shard(-1); row: Partial, its bias added as torch's F.linear adds it there,
b / ranks to each rank's part, so that ranks that offload and ranks that do not sum the same thing).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetbench.pytorch.offload import device_linear
from hetbench.train.torch_frontend.models import CharGPT, ResidualMLP

COLWISE, ROWWISE = "colwise", "rowwise"


class TorchTPError(ValueError):
    """A model torch's even tensor parallelism cannot cut here: one line naming the value and what is accepted."""


@dataclass
class TorchTP:
    """A model cut by torch_tensor_parallel (in place: `module` is the model itself). `styles`: each cut Linear's
    name -> "colwise" or "rowwise"; `permuted`: each fused qkv parameter's name -> the row order it was given (the
    original row of each row it holds now)."""

    module: nn.Module
    mesh: Any
    group: Any
    ranks: int
    rank: int
    task: str
    styles: dict[str, str] = field(default_factory=dict)
    permuted: dict[str, torch.Tensor] = field(default_factory=dict)
    heads: dict[str, int] = field(default_factory=dict)  # attention module -> its heads before the cut

    def whole(self, name: str, t: Any) -> torch.Tensor:
        """Collective over the group: parameter `name`'s value or gradient `t` whole (CPU), in the model's
        original layout (qkv's permutation undone)."""
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            whole = t.full_tensor() if isinstance(t, DTensor) else t
            whole = whole.detach().cpu().clone()
            order = self.permuted.get(name)
            if order is not None:
                unpermuted = torch.empty_like(whole)
                unpermuted[order] = whole
                whole = unpermuted
        return whole

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective over the group: every parameter whole (CPU), under the model's names and in its original
        layout, on every rank."""
        # the same order on every rank: the gathers match
        return {name: self.whole(name, p) for name, p in self.module.named_parameters()}

    def full_grads(self) -> dict[str, torch.Tensor | None]:
        """Collective over the group: every parameter's gradient whole (CPU), as full_state_dict lays them out."""
        return {name: None if p.grad is None else self.whole(name, p.grad)
                for name, p in self.module.named_parameters()}

    def local_param_bytes(self) -> int:
        """Bytes of parameters this rank holds: its shards of the cut ones, the whole of the others."""
        from torch.distributed.tensor import DTensor

        total = 0
        for p in self.module.parameters():
            t = p.to_local() if isinstance(p, DTensor) else p
            total += t.numel() * t.element_size()
        return total

    def offloaded(self) -> list[str]:
        """The cut Linears whose local product runs on a hetbench device (offload_ops set) now."""
        return [n for n in self.styles if getattr(self.module.get_submodule(n), "offload_ops", None) is not None]

    def widths(self) -> dict[str, list[int]]:
        """Each cut Linear's columns (colwise: outputs; rowwise: inputs) on every rank, as torch split them."""
        from torch.distributed.tensor import Shard

        out = {}
        for name, style in self.styles.items():
            lin = self.module.get_submodule(name)
            size = lin.out_features if style == COLWISE else lin.in_features
            out[name] = [Shard.local_shard_size_and_offset(size, self.ranks, r)[0] for r in range(self.ranks)]
        return out

    def summary(self) -> dict[str, Any]:
        """The ranks, the task, each cut Linear's style and every rank's columns of it, the attention heads per
        rank, which Linears this rank offloads, its parameter bytes."""
        return {"ranks": self.ranks, "task": self.task, "mesh": str(self.mesh), "sharded": dict(self.styles),
                "widths": self.widths(),
                "heads_per_rank": {n: h // self.ranks for n, h in self.heads.items()},
                "permuted": sorted(self.permuted), "offloaded": self.offloaded(),
                "local_param_bytes": self.local_param_bytes()}


def _plan(model: nn.Module, ranks: int) -> tuple[str, dict[str, str], dict[str, int], str | None]:
    """(task, each Linear's style by name, attention modules' heads, the problem that keeps torch's even cut from
    this model over `ranks` ranks or None)."""
    if isinstance(model, ResidualMLP):
        # any width: torch splits as torch.chunk does (uneven, a rank even of no columns, tested so)
        return "mlp", {f"layers.{i}.linear": COLWISE for i in range(len(model.layers))}, {}, None
    if isinstance(model, CharGPT):
        styles, heads = {}, {}
        for i, block in enumerate(model.blocks):
            attn, name = block.attn, f"blocks.{i}.attn"
            heads[name] = attn.heads
            if attn.heads % ranks:
                return "gpt", styles, heads, (f"{name}: {attn.heads} heads do not split evenly over {ranks} ranks "
                                              "(torch's even tensor parallelism needs heads % ranks == 0: a group "
                                              f"whose size divides {attn.heads})")
            if attn.qkv.out_features != 3 * attn.heads * attn.head_dim:
                return "gpt", styles, heads, (f"{name}.qkv: {attn.qkv.out_features} outputs are not 3 x {attn.heads} "
                                              f"heads x {attn.head_dim} (a fused [q | k | v] is accepted)")
            styles.update({f"{name}.qkv": COLWISE, f"{name}.proj": ROWWISE,
                           f"blocks.{i}.mlp.fc": COLWISE, f"blocks.{i}.mlp.proj": ROWWISE})
        return "gpt", styles, heads, None
    return "", {}, {}, (f"{type(model).__name__}: torch_tensor_parallel cuts the task models ResidualMLP (mlp) and "
                        "CharGPT (gpt) of hetbench.train.torch_frontend.models")


def _qkv_order(heads: int, head_dim: int, ranks: int) -> torch.Tensor:
    """The fused qkv's row order that makes rank r's contiguous chunk [q | k | v] of its heads: entry i is the
    original row now at row i."""
    hidden, per = heads * head_dim, heads // ranks * head_dim
    return torch.cat([torch.arange(s * hidden + r * per, s * hidden + (r + 1) * per)
                      for r in range(ranks) for s in range(3)])


def _linear_forward(style: str, mesh: Any) -> Any:
    """A cut Linear's forward: torch's own (F.linear on the DTensors), or, where `offload_ops` is set, the local
    product on the hetbench device, wrapped as the DTensor torch's style would have produced."""
    from torch.distributed.tensor import DTensor, Partial, Shard

    def forward(self: nn.Linear, x: Any) -> Any:
        ops = getattr(self, "offload_ops", None)
        if ops is None:
            return F.linear(x, self.weight, self.bias)
        weight, key = self.weight.to_local(), getattr(self, "weight_key", None)
        bias = self.bias.to_local() if self.bias is not None else None
        if style == COLWISE:
            # x is replicated; this rank's product gives only its columns' part of x's gradient: a Partial, summed
            # over the ranks by torch's backward of the input's from_local, as its own mm's would be
            local = device_linear(x.to_local(grad_placements=[Partial()]), weight, bias, ops, key)
            shape = (*local.shape[:-1], self.out_features)
            return DTensor.from_local(local, mesh, [Shard(local.dim() - 1)], run_check=False, shape=shape,
                                      stride=_contiguous_stride(shape))
        # row: x holds this rank's input columns, the product a Partial sum; the bias added as torch's own F.linear
        # adds it on the ranks that do not offload (b / ranks to every rank's part: the ranks must agree on it),
        # the style's output hook then sums the parts
        local = device_linear(x.to_local(), weight, None, ops, key)
        part = DTensor.from_local(local, mesh, [Partial()], run_check=False)
        return part + self.bias if self.bias is not None else part

    return forward


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, at = [], 1
    for n in reversed(shape):
        stride.append(at)
        at *= n
    return tuple(reversed(stride))


def torch_tensor_parallel(model: nn.Module, group: Any = None) -> TorchTP:
    """Collective over `group` (default: the world): the task model `model` cut in place by torch's
    parallelize_module (module docstring). Every rank must hold the same model; rank 0's initial parameters are
    scattered. A model torch's even split cannot cut raises TorchTPError on every rank."""
    if not dist.is_initialized():
        raise TorchTPError("torch_tensor_parallel needs a process group: call hetbench.pytorch.init() first")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    group = group if group is not None else dist.group.WORLD
    ranks, rank = dist.get_world_size(group), dist.get_rank(group)
    task, styles, heads, problem = _plan(model, ranks)
    if problem is None and any(isinstance(p, DTensor) for p in model.parameters()):
        problem = f"{type(model).__name__}: already holds DTensor parameters (cut once only)"
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    # every rank's verdict and shapes: a refusal (or a model that differs between ranks) raised on every rank
    said: list[Any] = [None] * ranks
    dist.all_gather_object(said, (problem, shapes), group=group)
    if problem is not None:
        raise TorchTPError(problem)
    for r, (their_problem, their_shapes) in enumerate(said):
        if their_problem is not None:
            raise TorchTPError(f"rank {r}: {their_problem}")
        if their_shapes != shapes:
            raise TorchTPError(f"rank {r}'s model differs from rank {rank}'s (names or shapes): every rank must hold "
                               "the same model")

    device = next(model.parameters()).device
    mesh = DeviceMesh.from_group(group, device.type)
    tp = TorchTP(model, mesh, group, ranks, rank, task, styles, heads=heads)
    # qkv's rows put in the order whose even chunks are whole heads of q, k and v (before torch distributes them)
    with torch.no_grad():
        for name in heads:
            attn = model.get_submodule(name)
            order = _qkv_order(attn.heads, attn.head_dim, ranks).to(device)
            for pname, p in attn.qkv.named_parameters():
                p.copy_(p[order])
                tp.permuted[f"{name}.qkv.{pname}"] = order.cpu()
    plan = {n: (ColwiseParallel(output_layouts=Replicate(), use_local_output=True) if task == "mlp"
                else ColwiseParallel(use_local_output=True)) if s == COLWISE else RowwiseParallel(use_local_output=True)
            for n, s in styles.items()}
    parallelize_module(model, mesh, plan)
    for name, style in styles.items():
        lin = model.get_submodule(name)
        lin.forward = types.MethodType(_linear_forward(style, mesh), lin)  # type: ignore[method-assign]
        # offload_linears (called after this) leaves a Linear so marked its forward, which reads offload_ops
        lin.row_parallel = True
    for name, h in heads.items():
        model.get_submodule(name).heads = h // ranks  # the attention's forward views its local q, k, v by it
    return tp
