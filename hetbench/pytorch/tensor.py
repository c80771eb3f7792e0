"""Tensor parallelism with shards sized by each rank's speed: Megatron's column- and row-parallel Linear pairs (an
MLP's up and down projections, attention's query/key/value and output projections split by whole heads, grouped
key/value heads kept with their queries), each rank's columns, rows or heads in proportion to its weight, over any
torch.distributed group (the hetbench backend's, so a group can span vendors).

    plan = {"layers.*.attn": heads(("q_proj", "k_proj", "v_proj"), "o_proj", kv_heads=8),
            "layers.*.mlp": pair(("gate_proj", "up_proj"), "down_proj")}
    tp = tensor_parallel(model, plan, weights=[3, 1])   # collective over the group (default: the world)
    loss = model(x).sum(); loss.backward()              # every rank the same rows: forward and backward exact

A Pair's column Linears keep their output rows of this rank's units (a unit: a head, a key/value head with its
queries, or one column of an MLP's hidden layer), its row Linears the matching input columns. The pair's input goes
through the identity whose backward all-reduces (Megatron's f), the row Linear's partial product through the
all-reduce whose backward is the identity (g), its bias added once after it: each rank's replicated parameters
(norms, embeddings, row biases) get the same gradient, its sharded ones its slice's, and the sum is the one-process
model's. `Gathered` is a lone column-parallel Linear whose output is gathered whole (a residual layer that no row
Linear follows). A rank whose weight rounds to no unit of a layer holds none of it (its Linears 0 wide), and still
takes part in the layer's collectives.

Plain columns are rounded to the `tile` (whole groups of `tile` columns per rank) where that moves no rank's
modelled time by more than TILE_SLACK; heads are never cut.
"""

from __future__ import annotations

import fnmatch
import time
import types
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hetbench.harness.split_plan import shares as _largest_remainder
from hetbench.pytorch.offload import device_linear

TILE_COLUMNS = 32  # plain columns go to ranks in whole tiles of this many where that costs little (TILE_SLACK)
TILE_SLACK = 0.01  # the most a tile rounding may add to the slowest rank's modelled time, as a fraction


class TensorParallelError(ValueError):
    """A tensor-parallel plan that cannot be applied: the one line says which module or value and why."""


@dataclass(frozen=True)
class Pair:
    """Column-parallel Linears feeding row-parallel ones inside one block (names relative to it). `columns` maps
    each column Linear to the segments its output holds (fused q/k/v: 3, each `units` x its unit size); `units`
    is the count of indivisible units (heads; key/value heads where queries are grouped), None for plain columns
    (the row Linear's input width); `attributes` are the block's attributes set to (the rank's units) x value
    (a head count the block's forward reads)."""

    columns: Mapping[str, int]
    rows: Sequence[str]
    units: int | None = None
    attributes: Mapping[str, int] = field(default_factory=dict)
    what: str = "columns"  # what a unit is called in messages and the summary


@dataclass(frozen=True)
class Gathered:
    """A lone column-parallel Linear (the plan's pattern names the Linear itself): its output columns split by
    the weights, then gathered whole (forward) and the gradient's own columns taken (backward)."""

    what: str = "columns"


def pair(columns: str | Sequence[str], rows: str | Sequence[str]) -> Pair:
    """An MLP's Linears: `columns` (up, or gate and up) column-parallel, `rows` (down) row-parallel, by
    columns."""
    cols = (columns,) if isinstance(columns, str) else tuple(columns)
    return Pair({c: 1 for c in cols}, (rows,) if isinstance(rows, str) else tuple(rows))


def heads(qkv: str | Sequence[str], out: str, heads: int | None = None, kv_heads: int | None = None,
          attributes: Mapping[str, int] | None = None) -> Pair:
    """Attention by whole heads: `qkv` the fused projection (one name; its output [q | k | v], each heads x
    head_dim; give `heads`) or the three (q, k, v), `out` the output projection. With `kv_heads` (grouped-query
    attention), a unit is one key/value head and its group of queries."""
    if isinstance(qkv, str):
        if heads is None:
            raise TensorParallelError(f"heads({qkv!r}, ...): a fused projection needs its head count (heads=)")
        return Pair({qkv: 3}, (out,), heads, dict(attributes or {}), "heads")
    q, k, v = qkv
    if heads is not None and kv_heads is not None and (kv_heads < 1 or heads % kv_heads):
        raise TensorParallelError(f"heads({heads}) is not a multiple of kv_heads ({kv_heads}): each key/value head "
                                  "needs a whole group of queries")
    return Pair({q: 1, k: 1, v: 1}, (out,), kv_heads or heads, dict(attributes or {}),
                "key/value heads" if kv_heads else "heads")


@dataclass
class ShardSpec:
    """How a parameter is cut: along `dim`, in `segments` equal segments, each of `units` units of `unit` rows
    (or columns); rank r holds units [starts[r], starts[r] + counts[r]) of every segment."""

    dim: int
    segments: int
    units: int
    unit: int
    counts: list[int]

    @property
    def starts(self) -> list[int]:
        out, at = [], 0
        for c in self.counts:
            out.append(at)
            at += c
        return out

    def local(self, full: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank `rank`'s part of the whole tensor `full`."""
        start, count = self.starts[rank], self.counts[rank]
        seg = self.units * self.unit
        pieces = [full.narrow(self.dim, j * seg + start * self.unit, count * self.unit) for j in range(self.segments)]
        return torch.cat(pieces, dim=self.dim) if len(pieces) > 1 else pieces[0]

    def whole(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """The whole tensor from every rank's part (rank order)."""
        segs = []
        for j in range(self.segments):
            for r, part in enumerate(parts):
                width = self.counts[r] * self.unit
                segs.append(part.narrow(self.dim, j * width, width))
        return torch.cat(segs, dim=self.dim)


@dataclass
class CommFigures:
    """The tensor-parallel collectives' time and bytes on this rank since the last take()."""

    seconds: float = 0.0
    bytes: int = 0
    calls: int = 0
    measured: bool = True  # False: the group's backend keeps no figures (torch's own tp over Gloo)

    def step_figures(self) -> dict[str, Any]:
        """A step line's figures of this rank's tp collectives (None where not measured); `extra_comm_seconds`
        makes them the step's communication (StepLogger)."""
        if not self.measured:
            return {"tp_comm_seconds": None, "tp_comm_bytes": None, "tp_comm_calls": None}
        return {"tp_comm_seconds": self.seconds, "tp_comm_bytes": self.bytes, "tp_comm_calls": self.calls,
                "extra_comm_seconds": self.seconds}

    def take(self) -> "CommFigures":
        out = CommFigures(self.seconds, self.bytes, self.calls)
        self.seconds, self.bytes, self.calls = 0.0, 0, 0
        return out


@dataclass
class Layer:
    """One cut layer of the plan: its module's name, what its units are, every rank's units."""

    name: str
    what: str
    units: int
    counts: list[int]


class _Comm:
    """The group the layers' collectives run over, and their clock."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.figures = CommFigures()
        self.uneven = dist.get_backend(group) == "hetbench"  # MPI_Allgatherv; other backends gather equal parts

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return t
        start = time.perf_counter()
        work = t.float() if t.dtype in (torch.float16, torch.bfloat16) else t  # partial sums added in fp32
        work = work.contiguous().clone() if work is t else work.contiguous()
        dist.all_reduce(work, group=self.group)
        self._count(start, work)
        return work.to(t.dtype)

    def gather_last(self, t: torch.Tensor, widths: Sequence[int]) -> torch.Tensor:
        """Every rank's columns (its `widths[r]` of the last dimension) side by side."""
        if self.size == 1:
            return t
        start = time.perf_counter()
        lead = t.shape[:-1]
        rows = t.reshape(lead.numel(), t.shape[-1]).contiguous()  # a rank of no columns: (rows, 0)
        if self.uneven:
            parts = [torch.empty(rows.shape[0], w, dtype=t.dtype, device=t.device) for w in widths]
            dist.all_gather(parts, rows, group=self.group)
        else:
            most = max(widths)
            padded = F.pad(rows, (0, most - rows.shape[1])) if rows.shape[1] < most else rows
            parts = [torch.empty_like(padded) for _ in widths]
            dist.all_gather(parts, padded.contiguous(), group=self.group)
            parts = [p[:, :w] for p, w in zip(parts, widths)]
        out = torch.cat(parts, dim=1).reshape(*lead, sum(widths))
        self._count(start, out)
        return out

    def _count(self, start: float, t: torch.Tensor) -> None:
        self.figures.seconds += time.perf_counter() - start
        self.figures.bytes += t.numel() * t.element_size()
        self.figures.calls += 1


class _Copy(torch.autograd.Function):
    """f: the identity forward; the gradient all-reduced backward (each rank's input gradient is its slice's)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: _Comm) -> torch.Tensor:  # type: ignore[override]
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:  # type: ignore[override]
        return ctx.comm.all_reduce(grad), None


class _Reduce(torch.autograd.Function):
    """g: the partial products all-reduced forward; the identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: _Comm) -> torch.Tensor:  # type: ignore[override]
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:  # type: ignore[override]
        return grad, None


class _Gather(torch.autograd.Function):
    """Every rank's columns gathered whole forward; this rank's columns of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: _Comm, widths: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.start, ctx.width = sum(widths[:comm.rank]), widths[comm.rank]
        return comm.gather_last(x, widths)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        return grad.narrow(-1, ctx.start, ctx.width).contiguous(), None, None


def _product(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T without the bias, on the rank's hetbench device where the Linear is offloaded."""
    ops = getattr(linear, "offload_ops", None)
    if ops is not None:
        return device_linear(x, linear.weight, None, ops, getattr(linear, "weight_key", None))
    return F.linear(x, linear.weight)


def _row_forward(comm: _Comm) -> Any:
    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        y = _Reduce.apply(_product(self, x), comm)
        return y + self.bias if self.bias is not None else y

    return forward


class _InputOnce:
    """A block's column Linears share its input's f: the first of them to see an input tensor passes it through
    _Copy, the others reuse that (one all-reduce of the input's gradient for q, k and v, not three)."""

    def __init__(self, comm: _Comm) -> None:
        self.comm = comm
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def clear(self, *_: Any) -> None:
        self.seen = []

    def __call__(self, _module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        for src, out in self.seen:
            if src is x:
                return (out, *args[1:])
        out = _Copy.apply(x, self.comm)
        self.seen.append((x, out))
        return (out, *args[1:])


def split_units(units: int, weights: Sequence[float], granule: int = 1) -> list[int]:
    """Each rank's share of `units` in proportion to its weight (largest remainder), in whole granules."""
    if units % granule:
        granule = 1
    return [c * granule for c in _largest_remainder(list(weights), units // granule)]


def _slowest(counts: Sequence[int], weights: Sequence[float]) -> float:
    return max((c / w for c, w in zip(counts, weights) if w > 0), default=0.0)


def tiled_units(units: int, weights: Sequence[float], tile: int) -> list[int]:
    """Plain columns' shares: whole tiles where that adds at most TILE_SLACK to the slowest rank's modelled time
    (its columns over its weight), else single columns."""
    exact = split_units(units, weights)
    if tile <= 1 or units % tile:
        return exact
    tiled = split_units(units, weights, tile)
    return tiled if _slowest(tiled, weights) <= _slowest(exact, weights) * (1 + TILE_SLACK) else exact


def _linear(block: nn.Module, name: str, where: str) -> nn.Linear:
    try:
        module = block.get_submodule(name)
    except AttributeError:
        raise TensorParallelError(f"{where}: has no submodule {name!r} (the plan cannot cut it)") from None
    if not isinstance(module, nn.Linear):
        raise TensorParallelError(f"{where}.{name} is a {type(module).__name__}, not an nn.Linear: the plan cuts "
                                  "only Linears")
    return module


def _shard_param(module: nn.Module, pname: str, spec: ShardSpec, rank: int) -> None:
    p = getattr(module, pname)
    local = spec.local(p.detach(), rank).clone()
    setattr(module, pname, nn.Parameter(local, requires_grad=p.requires_grad))


class TensorParallel:
    """A model cut by tensor_parallel: which parameters are cut and how (`specs`, by the model's names), the
    layers and every rank's units of each, the group's collectives' figures. The model itself is changed in
    place: its cut Linears hold this rank's slices, under their own names."""

    def __init__(self, model: nn.Module, comm: _Comm, weights: list[float]) -> None:
        self.model, self.comm, self.weights = model, comm, weights
        self.specs: dict[str, ShardSpec] = {}
        self.layers: list[Layer] = []

    @property
    def group(self) -> Any:
        return self.comm.group

    def take_figures(self) -> CommFigures:
        """The tp collectives' seconds, bytes and calls on this rank since the last take."""
        return self.comm.figures.take()

    def local_state(self, full: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of a whole state dict (parameters, or any tensor of a parameter's shape by its
        name); other entries as they are."""
        return {k: self.specs[k].local(v, self.comm.rank) if k in self.specs and v.dim() > 0 else v
                for k, v in full.items()}

    def local_optimizer_state(self, state: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """This rank's part of a whole optimizer state ({parameter name: {key: value}}): each tensor of a
        parameter's shape sliced as the parameter is, scalars (a step count) as they are."""
        return {k: {n: (self.local_state({k: t})[k] if isinstance(t, torch.Tensor) else t) for n, t in v.items()}
                for k, v in state.items()}

    def whole(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """Collective over the group: the whole of a tensor cut as parameter `name` is, from every rank's part."""
        spec = self.specs.get(name)
        if spec is None or local.dim() == 0:
            return local
        parts = _gather_parts(self.comm, local, spec)
        return spec.whole(parts)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective over the group: every parameter whole (CPU), under the model's names, on every rank."""
        return {k: self.whole(k, p.detach().cpu()).clone() for k, p in self.model.named_parameters()}

    def load_full(self, full: Mapping[str, torch.Tensor]) -> None:
        """Each parameter set to this rank's part of the whole state `full`."""
        local = self.local_state(full)
        with torch.no_grad():
            for k, p in self.model.named_parameters():
                p.copy_(local[k].to(p.device, p.dtype))

    def summary(self) -> dict[str, Any]:
        """The layers and each rank's units, those a rank holds none of, the parameter elements each holds."""
        return {"ranks": self.comm.size, "weights": list(self.weights),
                "layers": [{"name": x.name, "what": x.what, "units": x.units, "counts": x.counts}
                           for x in self.layers],
                "empty_layers_per_rank": [[x.name for x in self.layers if x.counts[r] == 0]
                                          for r in range(self.comm.size)]}


def _gather_parts(comm: _Comm, local: torch.Tensor, spec: ShardSpec) -> list[torch.Tensor]:
    """Collective: every rank's part of a cut tensor (shapes from the spec), by one padded all_gather."""
    shapes = []
    for c in spec.counts:
        shape = list(local.shape)
        shape[spec.dim] = spec.segments * c * spec.unit
        shapes.append(shape)
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    most = max(sizes)
    flat = local.reshape(-1)
    buf = torch.zeros(most, dtype=local.dtype, device=local.device)
    buf[:flat.numel()] = flat
    parts = [torch.empty_like(buf) for _ in sizes]
    if comm.size > 1:
        dist.all_gather(parts, buf, group=comm.group)
    else:
        parts = [buf]
    return [p[:n].reshape(s) for p, n, s in zip(parts, sizes, shapes)]


def _matches(model: nn.Module, pattern: str) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and fnmatch.fnmatchcase(n, pattern)]


def resolve_weights(weights: str | Sequence[float], size: int) -> list[float]:
    if isinstance(weights, str):
        if weights != "even":
            raise TensorParallelError(f"weights {weights!r}: give 'even' or one weight >= 0 per rank ({size})")
        return [1.0] * size
    out = [float(w) for w in weights]
    if len(out) != size or min(out) < 0 or sum(out) <= 0:
        raise TensorParallelError(f"weights {list(weights)!r}: give one weight >= 0 per rank of the tensor-parallel "
                                  f"group ({size}), not all 0, or 'even'")
    return out


def plan_problems(model: nn.Module, plan: Mapping[str, Pair | Gathered], ranks: int,
                  weights: Sequence[float] | None = None) -> list[str]:
    """What keeps `plan` from cutting `model` over `ranks` ranks (one line each): a pattern that matches no
    module, a named Linear missing or not a Linear, widths that do not split into the units, fewer units than
    ranks. With `weights`, too: a rank left under one unit where units are heads (it is given none: said, not
    refused) is not a problem."""
    out = []
    for pattern, style in plan.items():
        found = _matches(model, pattern)
        if not found:
            out.append(f"tensor-parallel plan entry {pattern!r} matches no module of the model")
            continue
        for name, block in found:
            try:
                _units_of(block, name, style)
            except TensorParallelError as e:
                out.append(str(e))
                continue
            units, _ = _units_of(block, name, style)
            if isinstance(style, Pair) and style.units is not None and units < ranks:
                out.append(f"{name}: {units} {style.what}, fewer than the {ranks} tensor-parallel ranks (each rank "
                           f"needs a whole one: a group of {units} ranks or fewer)")
    return out or _shared_problems(model, plan)  # ties only where every entry names Linears


def _shared_problems(model: nn.Module, plan: Mapping[str, Pair | Gathered]) -> list[str]:
    """A parameter the plan cuts that another module holds too (a head tied to the embedding): cutting it would
    untie them silently."""
    owners: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(n)
    out = []
    for pattern, style in plan.items():
        for name, block in _matches(model, pattern):
            linears = [block] if isinstance(style, Gathered) else \
                [block.get_submodule(c) for c in (*style.columns, *style.rows)]
            for lin in linears:
                for p in (lin.weight, lin.bias):
                    if p is not None and len(owners.get(id(p), [])) > 1:
                        out.append(f"{' and '.join(owners[id(p)])} are one parameter (tied): the plan cannot cut it "
                                   f"under {name} alone; leave that Linear out of the plan")
    return out


def _units_of(block: nn.Module, name: str, style: Pair | Gathered) -> tuple[int, dict[str, int]]:
    """(units, each Linear's unit size along its cut dimension) of a plan entry matched at `block`."""
    if isinstance(style, Gathered):
        if not isinstance(block, nn.Linear):
            raise TensorParallelError(f"{name} is a {type(block).__name__}, not an nn.Linear: Gathered cuts a "
                                      "Linear's columns")
        return block.out_features, {"": 1}
    sizes: dict[str, int] = {}
    row0 = _linear(block, style.rows[0], name)
    units = style.units if style.units is not None else row0.in_features
    for col, segments in style.columns.items():
        lin = _linear(block, col, name)
        if lin.out_features % (segments * units):
            raise TensorParallelError(f"{name}.{col}: its {lin.out_features} outputs do not split into {segments} "
                                      f"x {units} {style.what}")
        sizes[col] = lin.out_features // (segments * units)
    for row in style.rows:
        lin = _linear(block, row, name)
        if lin.in_features % units:
            raise TensorParallelError(f"{name}.{row}: its {lin.in_features} inputs do not split into {units} "
                                      f"{style.what}")
        sizes[row] = lin.in_features // units
    return units, sizes


def tensor_parallel(model: nn.Module, plan: Mapping[str, Pair | Gathered], group: Any = None,
                    weights: str | Sequence[float] = "even", tile: int = TILE_COLUMNS) -> TensorParallel:
    """Collective over `group` (default: the world): `model`'s layers named by `plan` (module-name patterns, `*`
    for any part, to a Pair or Gathered) cut across the group's ranks by `weights` ("even", or one weight >= 0 per
    rank), in place; every rank must hold the same whole model (same initial parameters) and give it the same rows.
    Offload (hetbench.pytorch.offload) before or after: the cut Linears' products stay on the rank's device."""
    if not dist.is_initialized():
        raise TensorParallelError("tensor_parallel needs a process group: call hetbench.pytorch.init() first")
    comm = _Comm(group)
    w = resolve_weights(weights, comm.size)
    problems = plan_problems(model, plan, comm.size)
    if problems:
        raise TensorParallelError(problems[0])
    tp = TensorParallel(model, comm, w)
    prefix_names = {id(p): n for n, p in model.named_parameters()}
    for pattern, style in plan.items():
        for name, block in _matches(model, pattern):
            units, sizes = _units_of(block, name, style)
            counts = (tiled_units(units, w, tile) if (isinstance(style, Gathered) or style.units is None)
                      else split_units(units, w))
            tp.layers.append(Layer(name, style.what, units, counts))
            if isinstance(style, Gathered):
                _cut_gathered(tp, block, name, counts, prefix_names)
            else:
                _cut_pair(tp, block, name, style, units, sizes, counts, prefix_names)
    return tp


def _record(tp: TensorParallel, module: nn.Module, pname: str, spec: ShardSpec, names: dict[int, str]) -> None:
    p = getattr(module, pname, None)
    if p is None:
        return
    tp.specs[names[id(p)]] = spec
    _shard_param(module, pname, spec, tp.comm.rank)


def _cut_pair(tp: TensorParallel, block: nn.Module, name: str, style: Pair, units: int, sizes: dict[str, int],
              counts: list[int], names: dict[int, str]) -> None:
    rank = tp.comm.rank
    once = _InputOnce(tp.comm)
    block.register_forward_pre_hook(once.clear)
    block.register_forward_hook(once.clear)
    for col, segments in style.columns.items():
        lin = _linear(block, col, name)
        spec = ShardSpec(0, segments, units, sizes[col], counts)
        _record(tp, lin, "weight", spec, names)
        _record(tp, lin, "bias", spec, names)
        lin.out_features = segments * counts[rank] * sizes[col]
        lin.register_forward_pre_hook(once)
    for row in style.rows:
        lin = _linear(block, row, name)
        _record(tp, lin, "weight", ShardSpec(1, 1, units, sizes[row], counts), names)
        lin.in_features = counts[rank] * sizes[row]
        lin.row_parallel = True  # offload_linears leaves this forward in place
        lin.forward = types.MethodType(_row_forward(tp.comm), lin)  # type: ignore[method-assign]
    for attr, per in style.attributes.items():
        setattr(block, attr, counts[rank] * per)


def _cut_gathered(tp: TensorParallel, lin: nn.Module, name: str, counts: list[int], names: dict[int, str]) -> None:
    assert isinstance(lin, nn.Linear)
    spec = ShardSpec(0, 1, lin.out_features, 1, counts)
    _record(tp, lin, "weight", spec, names)
    _record(tp, lin, "bias", spec, names)
    lin.out_features = counts[tp.comm.rank]
    comm = tp.comm
    lin.register_forward_pre_hook(lambda _m, args: (_Copy.apply(args[0], comm), *args[1:]))
    lin.register_forward_hook(lambda _m, _args, out: _Gather.apply(out, comm, list(counts)))
