"""hetbench's own fully sharded data parallel for torch modules, with every rank's shard sized by its weight.

torch's FSDP2 shards every parameter evenly (torch.chunk; `shard_placement_fn` picks only the dimension), so a slow
or small device holds as much as a fast one. Here each wrapped unit's parameters are flattened into one float32
vector of P elements and rank r owns the slice shares(weights, P)[r] of it (hetbench.harness.split_plan.shares:
largest remainder; a weight of 0 owns nothing; memory caps bound a share), taken from rank 0's values, and only
that slice's gradient and optimizer state: any torch optimizer over model.parameters() (the ranks' flat shards)
updates only its part.

    import hetbench.pytorch as hb
    hb.init()
    model = MyModel()
    sharded = hb.shard_module(model, units=list(model.blocks), weights="3,1")   # collective
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)                       # this rank's shards only
    loss = hb.part_of_mean(per_row_losses(model, x_mine, y_mine), global_batch)
    loss.backward(); opt.step(); opt.zero_grad()                               # gradients summed to the owners
    full = sharded.full_state_dict()                                            # collective: rank 0 gets it

How a step runs (the NumPy trainer's fsdp, hetbench/train/data_parallel.py, for any module):
- forward: a unit's forward pre-hook gathers its flat vector (MPI Allgatherv of the uneven shards into a fresh
  buffer), points the unit's parameters at views of it, and the post-hook drops them: the buffer is freed as the
  unit ends. The root (the model itself, holding every parameter no unit holds) stays gathered from its forward
  to the end of its backward, as FSDP's root does.
- the views that autograd saves for the backward are not kept: a saved-tensor hook stores where in the unit they
  lay, and the backward gathers the unit again (a hook on the unit's outputs, when their gradient arrives) and
  reads them from the new buffer. Saved-tensor hooks the caller has around the model keep what is not a unit's.
- activation checkpointing (transformers' gradient_checkpointing_enable, torch.utils.checkpoint around a unit or
  inside one, reentrant or not): the backward also points the unit's parameters at the new buffer, through a second
  _Gather node, for the recomputation to read; the unit's hooks run inside a backward only gather and point. One of
  the two nodes is reached (the forward's, or the backward's where a reentrant checkpoint's forward built no graph):
  one reduce-scatter a unit. A checkpoint around the whole model is refused as it recomputes.
- the gradient of the whole flat vector, once autograd has summed it, is reduce-scattered (MPI Reduce_scatter with
  the shares as counts, SUM) straight into the owners' flat-shard gradients; the buffer is then freed.
- prefetch: the next unit's gather (forward order, recorded each forward; reversed in the backward) is handed to
  the progress engine (hetbench/comm/progress.py, Progress.launch) as soon as the current unit is in hand; the
  engine's thread starts it (MPI Iallgatherv, on a duplicate communicator of the gathers' own, so that its start
  cannot cross this thread's collectives) and moves it while this unit computes: neither MPICH nor Open MPI moves a
  started gather between calls into it, and a torch GEMM is one call (docs/pytorch.md has the bench rounds that
  showed it). Where MPI gives no MPI_THREAD_MULTIPLE it is tested after every such operation (and after every
  device GEMM of an offloaded rank) instead. exposed_seconds lists, per prefetched gather, the time this rank spent
  starting, testing and waiting for it; measured against a blocking gather's time (blocking_gather_seconds) it
  tells how much was hidden, as OSU's non-blocking benchmarks measure overlap.

Exactness: with each rank's loss its rows' part of the global mean (uneven.part_of_mean) the summed gradients are
the whole batch's, so any weights, zero included, train the same model as one process, up to the order of float32
sums. Bytes a rank holds between steps (state_bytes): 4 * S_r of parameters, 4 * S_r of gradients and the
optimizer's state of S_r elements (AdamW: 8 * S_r and one step count per unit), S_r = the rank's elements summed
over the units; at a step's peak it also holds the gathered units (gathered_bytes_peak).

What cannot be wrapped (WrapError, one line naming the module): a unit that is not a submodule of the model, is
the model itself, is listed twice, holds no parameter of its own, or is a TorchScript module; a parameter shared by
two units; parameters that are not float32 or not all on one device; a model already sharded. The ranks compare
their arguments and layouts before any shard is made (_agree): a refusal or a difference raises alike on every rank.
Frozen parameters (requires_grad False) lie after the trainable ones in a unit's vector: gathered for the forward,
never given a gradient nor reduced nor seen by the optimizer (hetbench_frozen_shard, requires_grad False).
State: full_state_dict (each parameter once), plain_state_dict (the unsharded model's state_dict: tied names,
buffers), full_params() (every parameter readable for a block), save_checkpoint / load_checkpoint (sharded, each rank
its slices, the manifest last; loaded onto any ranks and weights) and read_checkpoint (one process). A sharded
parameter read outside the forward raises ShardedParameterError naming them; a transformers model's num_parameters
and save_pretrained (collective, rank 0 writes) answer for the whole model.
Communication: the communicator of the "hetbench" torch.distributed group (dist.init_process_group("hetbench"), or
hb.init()); its figures go into that group's metrics (allgather, reduce_scatter), so StepLogger counts them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from hetbench.harness import split_plan as plan
from hetbench.comm.vcollectives import displacements as _displs
from hetbench.comm.vcollectives import gatherv
from hetbench.comm.progress import Progress, threads_allowed
from hetbench.pytorch.logger import held_bytes, hetbench_group
from hetbench.pytorch.uneven import resolve_weights
from hetbench.results.io import (commit, fsync_folder, load_flat_piece, regular_file_problem, stage, to_json,
                                 write_json_atomic, write_npy_atomic)

SHARD_NAME = "hetbench_flat_shard"  # the flat-shard parameter each unit (and the root) registers
FROZEN_NAME = "hetbench_frozen_shard"  # a unit's frozen elements of the rank's slice, where it has any
ATTR = "_hetbench_fsdp"
BLOCKING_PROBES = 5
# ShardedModule.save_checkpoint's folder: its manifest (written last), rank 0's persistent buffers
CHECKPOINT_FORMAT = "hetbench-fsdp-checkpoint/1"
CHECKPOINT_MANIFEST = "manifest.json"
BUFFERS_FILE = "buffers.pt"
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists parameters and pieces: KBs to MBs for any model
# optimizer state saved under the names `hetbench train --strategy fsdp` gives AdamW's moments (rank-<r>.m.npy)
ARRAY_NAMES = {"exp_avg": "m", "exp_avg_sq": "v"}
# bytes a rank holds per element of its shard between steps: parameter and gradient (float32), optimizer state
STATE_BYTES_PER_ELEMENT = {"sgd": 8, "adamw": 16}


def numel(shape: Sequence[int]) -> int:
    """Elements of a tensor of `shape`."""
    return int(np.prod(shape, dtype=np.int64))


class WrapError(ValueError):
    """A module that cannot be sharded: the one-line reason, naming the module."""


class ShardedCheckpointError(ValueError):
    """A sharded checkpoint that cannot be saved or loaded: the one-line reason, naming the folder or file."""


class ShardedParameterError(AttributeError):
    """A sharded parameter read outside its unit's forward (an AttributeError, so that hasattr() says False)."""


@dataclass
class UnitLayout:
    """One unit's flat vector: its parameters' names (fully qualified in the model), shapes, in order."""

    name: str  # the unit module's name in the model ("" for the root)
    params: list[tuple[str, tuple[int, ...]]]
    # the parameters whose requires_grad is False, last in `params`: held and gathered, never updated
    frozen: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(numel(shape) for _, shape in self.params)

    @property
    def trainable_size(self) -> int:
        """Elements of the trainable parameters, which lead the flat vector."""
        return sum(numel(shape) for name, shape in self.params if name not in self.frozen)

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "size": self.size, "params": [[n, list(s)] for n, s in self.params]}
        if self.frozen:
            out["frozen"] = list(self.frozen)
        return out


def _type_name(m: nn.Module) -> str:
    return type(m).__name__


def _plan_units(model: nn.Module, units: Sequence[nn.Module]) -> tuple[list[tuple[nn.Module, str]], dict]:
    """(module, name) for each unit in the order given then the root, and which unit owns each parameter (by id):
    a parameter belongs to the innermost unit holding it. Raises WrapError."""
    if hasattr(model, ATTR):
        raise WrapError(f"the model ({_type_name(model)}) is already sharded by hetbench")
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    seen: set[int] = set()
    for i, u in enumerate(units):
        what = f"unit {i} ({_type_name(u)})" if isinstance(u, nn.Module) else f"unit {i} ({type(u).__name__})"
        if not isinstance(u, nn.Module):
            raise WrapError(f"{what} is not a torch.nn.Module")
        if u is model:
            raise WrapError(f"{what} is the model itself, which is the root unit already; list only its submodules")
        if id(u) not in names:
            raise WrapError(f"{what} is not a submodule of the model ({_type_name(model)})")
        if id(u) in seen:
            raise WrapError(f"{what} {names[id(u)]!r} is listed twice")
        seen.add(id(u))
    for m in [model, *units]:
        if isinstance(m, torch.jit.ScriptModule):
            raise WrapError(f"{names.get(id(m)) or 'the model'} ({_type_name(m)}) is a TorchScript module, whose "
                            "forward hetbench cannot hook")
    # innermost unit first: a parameter is owned by the deepest unit that holds it
    order = sorted(range(len(units)), key=lambda i: -names[id(units[i])].count(".") - 1)
    owner: dict[int, int] = {}
    for i in order:
        u = units[i]
        for pname, p in u.named_parameters(remove_duplicate=False):
            full = f"{names[id(u)]}.{pname}"
            if id(p) in owner and owner[id(p)] != i and not _inside(names[id(units[owner[id(p)]])], names[id(u)]):
                raise WrapError(f"parameter {full!r} is shared by units {names[id(units[owner[id(p)]])]!r} and "
                                f"{names[id(u)]!r}; a parameter must belong to one unit (or the root)")
            owner.setdefault(id(p), i)
    listed = [(u, names[id(u)]) for u in units] + [(model, "")]
    params = dict(model.named_parameters())
    devices = {p.device for p in params.values()}
    if len(devices) > 1:
        raise WrapError(f"the model's parameters are on {len(devices)} devices "
                        f"({', '.join(sorted(str(d) for d in devices))}); shard a model on one device")
    for name, p in params.items():
        if p.dtype != torch.float32:
            raise WrapError(f"parameter {name!r} is {str(p.dtype).replace('torch.', '')}; hetbench fsdp shards "
                            "float32 parameters (mixed precision: keep float32 masters, compute under autocast)")
    own = {i: 0 for i in range(len(units))}
    for p in params.values():
        if id(p) in owner:
            own[owner[id(p)]] += 1
    for i, count in own.items():
        if count == 0:
            raise WrapError(f"unit {i} {names[id(units[i])]!r} ({_type_name(units[i])}) holds no parameter of its own "
                            "(it has none, or inner units hold them all): nothing to shard; leave it out")
    return listed, owner


def _inside(inner: str, outer: str) -> bool:
    return inner.startswith(outer + ".")


def flat_layout(model: nn.Module, units: Sequence[nn.Module] = ()) -> list[UnitLayout]:
    """The flat vectors sharding `model` with `units` makes, in the units' order, the root's last (omitted when it
    holds no parameter): each parameter once, in the model's named_parameters order. Pure: wraps nothing."""
    listed, owner = _plan_units(model, units)
    per: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in listed]
    frozen: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in listed]
    for name, p in model.named_parameters():  # each parameter once, under its first name
        (per if p.requires_grad else frozen)[owner.get(id(p), len(listed) - 1)].append((name, tuple(p.shape)))
    # the frozen parameters after the trainable ones: each rank's slice of the trainable part is then one piece, its
    # gradient one reduce-scatter (hetbench/pytorch/fsdp.py _Unit.train_counts)
    return [UnitLayout(n, params + still, tuple(name for name, _ in still))
            for (m, n), params, still in zip(listed, per, frozen) if params or still or m is not model]


def _parameter_aliases(model: nn.Module) -> tuple[dict[int, list[tuple[nn.Module, str]]], dict[int, str]]:
    """Every name each parameter of `model` has ({id(parameter): [(module, attribute)]}, tied ones under each of
    their modules) and each module's first name ({id(module): name})."""
    aliases: dict[int, list[tuple[nn.Module, str]]] = {}
    module_names: dict[int, str] = {}
    for mname, m in model.named_modules(remove_duplicate=False):
        module_names.setdefault(id(m), mname)
        for attr, p in list(m._parameters.items()):
            if p is not None:
                aliases.setdefault(id(p), []).append((m, attr))
    return aliases, module_names


@dataclass
class _Unit:
    index: int
    name: str
    module: nn.Module
    layout: UnitLayout
    counts: list[int]
    offset: int  # where this rank's slice starts in the flat vector
    shard: nn.Parameter  # what the optimizer updates: this rank's slice of the trainable part
    held: torch.Tensor  # this rank's whole slice (the shard, then any frozen elements): what its gathers send
    train_counts: list[int]  # each rank's elements of the trainable part (its gradient's reduce-scatter counts)
    aliases: list[list[tuple[nn.Module, str]]]  # per parameter: every (module, attribute) that names it
    root: bool = False
    frozen_shard: nn.Parameter | None = None  # the frozen elements of this rank's slice (requires_grad False)
    full: torch.Tensor | None = None  # the gathered flat vector, while held
    pointed: bool = False  # the unit's parameters are views of `full` now (in its forward, or its backward)
    # a started gather: [request, buffer, host buffer, send buffer, exposed s, copy s, the progress engine's flight
    # (None where the caller's thread tests it)]
    pending: Any = None

    @property
    def size(self) -> int:
        return self.layout.size


class _Gather(torch.autograd.Function):
    """full = the unit's gathered flat vector (forward); its gradient reduce-scattered to the owners (backward).

    Each forward of a unit makes one such node, and so may its backward (ShardedModule._point_for_backward: the
    views a recomputation reads under activation checkpointing). Only one of them is reached by a backward: the
    forward's where the forward built the unit's graph, the backward's where a reentrant checkpoint ran the forward
    without one; so the unit's gradient is reduce-scattered once."""

    @staticmethod
    def forward(  # type: ignore[override]
            ctx: Any, shard: torch.Tensor, engine: "ShardedModule", index: int) -> torch.Tensor:
        ctx.engine, ctx.index = engine, index
        # a new tensor over the held storage: autograd gives this node's output its own history, never the held
        # vector's (which an earlier node of the same unit may have made its output)
        return engine._acquire(engine.units[index]).detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        engine, unit = ctx.engine, ctx.engine.units[ctx.index]
        out = engine._reduce_scatter(unit, grad)
        engine._unpoint(unit)
        engine._drop(unit)
        return out, None, None


@dataclass
class _Saved:
    """A tensor autograd saved that lay in a unit's gathered vector: where, so the backward's gather can serve it."""

    index: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass
class _OuterSaved:
    """A tensor the saved-tensor hooks around the model packed (what it made of it, and how to get it back)."""

    packed: Any
    unpack: Callable[[Any], torch.Tensor]


@dataclass
class StepFigures:
    exposed_seconds: list[float] = field(default_factory=list)  # per prefetched gather, in the order waited for
    exposed_units: list[int] = field(default_factory=list)
    gathered_bytes_peak: int = 0


class ShardedModule:
    """The sharding of one model (made by shard_module; model._hetbench_fsdp)."""

    def __init__(self, model: nn.Module, units: Sequence[nn.Module], weights: Sequence[float], comm: Any,
                 metrics: Any = None, split_idle: bool = False, prefetch: bool = True,
                 memory_bytes: Sequence[int | None] | None = None, optimizer: str = "adamw", pg: Any = None) -> None:
        self.model, self.comm, self.metrics, self.pg = model, comm, metrics, pg
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.split_idle = split_idle
        self.weights = [float(w) for w in weights]
        if len(self.weights) != self.size:
            raise WrapError(f"{len(self.weights)} weights given for {self.size} ranks")
        layouts = flat_layout(model, units)
        listed, _ = _plan_units(model, units)
        params = dict(model.named_parameters())
        self.device = next(iter(params.values())).device if params else torch.device("cpu")
        self.element_weights = self._capped_weights(sum(lay.size for lay in layouts), memory_bytes, optimizer)
        modules = {n: m for m, n in listed}
        aliases, module_names = _parameter_aliases(model)
        # the model's own state dict, as it was: every key in order (a tied parameter under each of its names, the
        # persistent buffers), each parameter's key naming the flat-vector entry that holds it (None: a buffer)
        first_name = {id(p): n for n, p in params.items()}
        every_name = dict(model.named_parameters(remove_duplicate=False))
        self.state_keys: list[tuple[str, str | None]] = [
            (key, first_name[id(every_name[key])] if key in every_name else None) for key in model.state_dict()]
        self.units: list[_Unit] = [
            self._make_unit(index, lay, modules[lay.name], [params[n] for n, _ in lay.params], aliases)
            for index, lay in enumerate(layouts)]
        self._replace_originals(module_names)
        self.root = next((u for u in self.units if u.root), None)
        self.prefetch = bool(prefetch) and self.size > 1 and len(self.units) > 1
        self.progress: Any = None  # the progress engine, made on the first prefetched gather
        # where MPI lets a second thread call it, the prefetched gathers' own communicator: the engine's thread starts
        # them there (Progress.launch), later than this thread's next collective may come
        self._gather_comm: Any = None
        if self.prefetch:
            from mpi4py import MPI


            if threads_allowed(MPI):
                self._gather_comm = self.comm.Dup()
        self.order = [u.index for u in self.units if not u.root]  # the units' forward order (recorded each forward)
        self._seen: list[int] = []
        self._live: dict[int, _Unit] = {}  # storage data_ptr of a gathered vector -> its unit
        self._hooks_ctx: Any = None
        self._outer_hooks: Any = None  # (pack, unpack) of saved-tensor hooks around the forward, if any
        self._after_queued = False  # _release_units is queued on the running backward
        self.figures = StepFigures()
        self._install()
        self._full_params = False  # inside full_params(): every unit gathered, its parameters readable
        setattr(model, ATTR, self)
        _adopt_transformers_methods(model, self)

    def _make_unit(self, index: int, lay: UnitLayout, module: nn.Module, tensors: list[torch.Tensor],
                   aliases: dict[int, list[tuple[nn.Module, str]]]) -> _Unit:
        """Collective: the unit of layout `lay` (its parameters `tensors`, in order), holding this rank's slice of
        rank 0's values of them (the originals are still in place)."""
        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
        counts = plan.shares(self.element_weights, lay.size)
        offset = sum(counts[:self.rank])
        # every rank's slice of rank 0's values (MPI Scatterv): the ranks start alike even where the model was
        # made without a common seed
        mine = np.empty(counts[self.rank], dtype=np.float32)
        self.comm.Scatterv([flat.detach().to("cpu").numpy(), (counts, _displs(counts))] if self.rank == 0 else
                           None, mine, root=0)
        held = torch.from_numpy(mine).to(self.device)
        trainable = lay.trainable_size
        train_counts = [max(0, min(start + c, trainable) - start) for start, c in zip(_displs(counts), counts)]
        if lay.frozen:  # the trainable part a parameter, the frozen rest one that takes no gradient
            shard = nn.Parameter(held[:train_counts[self.rank]])
            frozen = nn.Parameter(held[train_counts[self.rank]:], requires_grad=False)
        else:
            shard, frozen = nn.Parameter(held), None
            held = shard
        unit = _Unit(index, lay.name, module, lay, counts, offset, shard, held, train_counts,
                     [aliases[id(t)] for t in tensors], root=module is self.model)
        unit.frozen_shard = frozen
        return unit

    def _replace_originals(self, module_names: dict[int, str]) -> None:
        """The original parameters go; each unit (and the root) registers its flat shard instead. A module that held
        one reads its name as sharded from now on (_mark_sharded): outside the forward, one line says what to call."""
        for unit in self.units:
            for (pname, _), names_ in zip(unit.layout.params, unit.aliases):
                for m, attr in names_:
                    del m._parameters[attr]
                    _mark_sharded(m, attr, module_names.get(id(m), ""), pname)
            unit.module.register_parameter(SHARD_NAME, unit.shard)
            if unit.frozen_shard is not None:
                unit.module.register_parameter(FROZEN_NAME, unit.frozen_shard)

    # -- shares -------------------------------------------------------------------------------------------------
    def _capped_weights(self, total: int, memory_bytes: Sequence[int | None] | None, optimizer: str) -> list[float]:
        """The weights, bounded by each rank's memory (bytes; None: no cap): a rank's elements across all units
        may not need more than its memory at STATE_BYTES_PER_ELEMENT. Raises plan.PlacementError when the caps
        together hold less than the model."""
        if memory_bytes is None or all(m is None for m in memory_bytes):
            return list(self.weights)
        per = STATE_BYTES_PER_ELEMENT.get(optimizer, STATE_BYTES_PER_ELEMENT["adamw"])
        caps = [None if m is None else max(0, int(m) // per) for m in memory_bytes]
        try:
            capped = plan.shares(self.weights, total, caps, unit="elements")
            if capped == plan.shares(self.weights, total):
                return list(self.weights)  # no cap binds
            return [float(c) for c in capped]
        except plan.PlacementError:
            each = ", ".join(f"rank {r}: {'no cap' if m is None else f'{int(m)} bytes'}"
                             for r, m in enumerate(memory_bytes))
            raise plan.PlacementError(f"the model's {total} parameters need {per} bytes each of sharded state "
                                      f"({optimizer}), {total * per} bytes in all; the ranks' memory holds less "
                                      f"({each})") from None

    @property
    def elements(self) -> int:
        """This rank's elements, summed over the units."""
        return sum(u.counts[self.rank] for u in self.units)

    def summary(self) -> dict[str, Any]:
        """What the sharding holds: its units, parameters (the frozen ones among them: held and gathered, never
        updated, no gradient reduced), elements, and this rank's."""
        frozen = [name for u in self.units for name in u.layout.frozen]
        return {"units": len(self.units), "parameters": sum(len(u.layout.params) for u in self.units),
                "frozen_parameters": len(frozen), "frozen": frozen, "elements": sum(u.size for u in self.units),
                "frozen_elements": sum(u.size - u.layout.trainable_size for u in self.units),
                "rank_elements": self.elements, "weights": list(self.weights)}

    def __repr__(self) -> str:
        s = self.summary()
        return (f"ShardedModule({s['units']} units, {s['parameters']} parameters ({s['frozen_parameters']} frozen), "
                f"{s['elements']} elements, rank {self.rank} holds {s['rank_elements']})")

    def empty_units(self) -> list[str]:
        """The units this rank holds no element of (its weight too small for them)."""
        return [u.name or "root" for u in self.units if u.counts[self.rank] == 0 and u.size > 0]

    # -- hooks --------------------------------------------------------------------------------------------------
    def _install(self) -> None:
        self.model.register_forward_pre_hook(self._root_pre)
        for u in self.units:
            if not u.root:
                u.module.register_forward_pre_hook(lambda m, a, u=u: self._unit_pre(u))
                u.module.register_forward_hook(lambda m, a, out, u=u: self._unit_post(u, out))
        self.model.register_forward_hook(self._root_post)

    def _root_pre(self, module: nn.Module, args: Any) -> None:
        if _in_backward():
            raise WrapError(f"the sharded model ({_type_name(self.model)}) ran its forward inside a backward (an "
                            "activation checkpoint around the whole model recomputing it): checkpoint its units, or "
                            "modules inside them, instead")
        if self._full_params:
            raise WrapError(f"the sharded model ({_type_name(self.model)}) ran its forward inside full_params(): "
                            "leave the block first")
        self._drain()
        self._seen = []
        self._release_units()  # what a forward whose backward never came (or failed) left gathered
        if self._hooks_ctx is not None:  # a forward that raised before its end left them on
            self._hooks_ctx.__exit__(None, None, None)
        # saved-tensor hooks the caller has on around the whole model (torch's save_on_cpu, a non-reentrant
        # checkpoint of the whole model) would be set aside by these, the innermost: they keep what is not a unit's
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        self._outer_hooks = top(False) if top is not None else None
        self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks_ctx.__enter__()
        if self.root is not None:
            self._unit_pre(self.root)

    def _root_post(self, module: nn.Module, args: Any, out: Any) -> None:
        if self._hooks_ctx is not None:
            self._hooks_ctx.__exit__(None, None, None)
            self._hooks_ctx = None
        seen = [i for i in self._seen if not self.units[i].root]
        if seen:
            self.order = seen
        if self.root is not None:
            self._unit_post(self.root, out)

    def _unit_pre(self, u: _Unit) -> None:
        if _in_backward():  # an activation checkpoint recomputing the unit, its hooks inside the checkpoint
            self._pre_backward(u)
            return
        self._seen.append(u.index)
        full = _Gather.apply(u.shard, self, u.index)
        self._point(u, full)
        if self.prefetch:
            self._start_next(u, self._sequence(backward=False))

    def _point(self, u: _Unit, full: torch.Tensor) -> None:
        """The unit's parameters as views of the gathered vector (every name a parameter has)."""
        views = full.split([numel(s) for _, s in u.layout.params])
        for (name, shape), view, names_ in zip(u.layout.params, views, u.aliases):
            v = view.view(shape)
            if name in u.layout.frozen:
                v = v.detach()  # frozen: autograd computes no gradient for it, as for a parameter not requiring one
            for m, attr in names_:
                setattr(m, attr, v)
        u.pointed = True

    def _unpoint(self, u: _Unit) -> None:
        """The unit's parameter views gone from its modules (each name reads as sharded again)."""
        if u.pointed:
            for names_ in u.aliases:
                for m, attr in names_:
                    m.__dict__.pop(attr, None)
            u.pointed = False

    def _unit_post(self, u: _Unit, out: Any) -> None:
        if _in_backward():  # a recomputation: its views stay until the unit's gradient is reduced (_Gather.backward)
            return
        self._unpoint(u)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(out))
        # the root, and the unit the forward ends with, stay gathered for the backward, which starts with them
        keep = u.root or (bool(self.order) and u.index == self.order[-1])
        if not grad or not keep:
            self._drop(u)  # the autograd graph keeps only _Saved markers: the buffer is freed here
        if grad:
            outs = [t for t in _tensors(out) if t.requires_grad]
            torch.autograd.graph.register_multi_grad_hook(outs, lambda _g, u=u: self._pre_backward(u), mode="any")

    def _pre_backward(self, u: _Unit) -> None:
        """The unit's backward is next (its outputs' gradient arrived, or a checkpoint recomputes it): gathered
        again, its parameters pointed at the vector for a recomputation to read, the next unit's gather started."""
        self._queue_after_backward()
        self._ensure(u)
        if not u.pointed:
            self._point_for_backward(u)
        if self.prefetch:
            self._start_next(u, self._sequence(backward=True))

    def _point_for_backward(self, u: _Unit) -> None:
        """Views of the held vector through a new _Gather node, for an activation checkpoint's recomputation of the
        unit inside the backward: a non-reentrant checkpoint only reads them (its gradient goes to the forward's
        node), a reentrant one differentiates through them (its forward built no graph), so this node's backward
        then reduce-scatters the unit's gradient. Without a checkpoint nothing reads them; _Gather.backward or the
        end of the backward removes them."""
        with torch.enable_grad():  # the views too: one made without grad mode has no gradient edge to the node
            self._point(u, _Gather.apply(u.shard, self, u.index))

    def _queue_after_backward(self) -> None:
        """Once per backward: at its end, every view and gathered vector a unit still holds goes (a unit whose
        gradient never reached its _Gather node: frozen throughout, or unused)."""
        if not self._after_queued:
            self._after_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._release_units)

    def _release_units(self) -> None:
        """Every unit's parameter views and gathered vector gone (the end of a backward, the start of a forward)."""
        self._after_queued = False
        for u in self.units:
            self._unpoint(u)
            self._drop(u)

    def prefetched_units(self) -> list[int]:
        """The units whose gathers a step prefetches, in order (with prefetch): the forward's after the first
        (the root, else the first unit, is gathered blocking), the backward's after the last unit (kept gathered
        from the forward, as the root is)."""
        if not self.prefetch:
            return []
        return self._sequence(backward=False)[1:] + list(reversed(self.order))[1:]

    def _sequence(self, backward: bool) -> list[int]:
        """The order units are needed in: the root (gathered first in both passes), then the units in forward
        order, or the reverse in the backward."""
        units = list(reversed(self.order)) if backward else list(self.order)
        return ([self.root.index] if self.root is not None else []) + units

    # -- saved tensors ------------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        self.poll()
        try:
            unit = self._live.get(t.untyped_storage().data_ptr()) if t.layout == torch.strided else None
        except RuntimeError:  # a tensor without a storage of its own
            unit = None
        if unit is None or t.dtype != torch.float32:
            if self._outer_hooks is not None:  # the caller's own hooks around the model keep the rest
                pack, unpack = self._outer_hooks
                return _OuterSaved(pack(t), unpack)
            return t
        return _Saved(unit.index, t.storage_offset(), tuple(t.size()), tuple(t.stride()))

    def _unpack(self, saved: Any) -> torch.Tensor:
        self.poll()
        if isinstance(saved, _OuterSaved):
            return saved.unpack(saved.packed)
        if not isinstance(saved, _Saved):
            return saved
        u = self.units[saved.index]
        self._ensure(u)
        return u.full.as_strided(saved.size, saved.stride, saved.offset)  # type: ignore[union-attr]

    # -- communication ------------------------------------------------------------------------------------------
    def _np(self, t: torch.Tensor) -> np.ndarray:
        return t.detach().reshape(-1).numpy()

    def _host(self, t: torch.Tensor) -> tuple[np.ndarray, float]:
        """MPI's view of a tensor: itself on the CPU, a host copy of a GPU tensor (and the copy's seconds)."""
        if t.device.type == "cpu":
            return self._np(t), 0.0
        start = time.perf_counter()
        host = t.detach().to("cpu").reshape(-1).numpy()
        return host, time.perf_counter() - start

    def _record(self, op: str, nbytes: int, seconds: float, copy_seconds: float, idle: float) -> None:
        if self.metrics is not None:
            self.metrics.add(op, nbytes, seconds, copy_seconds, idle)

    def _barrier(self) -> tuple[float, float]:
        start = time.perf_counter()
        # the wait for the slowest rank timed apart as idle, where this engine or its group (a StepLogger sets it)
        # splits it off, as the backend's collectives do
        if self.split_idle or getattr(self.pg, "split_idle", False):
            self.comm.Barrier()
        now = time.perf_counter()
        return now - start, now

    def _acquire(self, u: _Unit) -> torch.Tensor:
        """The unit's gathered vector: a started gather waited for, or a blocking one."""
        if u.full is not None:
            return u.full
        if u.pending is not None:
            return self._wait(u)
        idle, start = self._barrier()
        full, send, recv, copy = self._gather_buffers(u)
        self.comm.Allgatherv(send, [recv, (u.counts, _displs(u.counts))])
        if full.device.type != "cpu":
            t0 = time.perf_counter()
            full.copy_(torch.from_numpy(recv))
            copy += time.perf_counter() - t0
        self._record("allgather", 4 * u.size, time.perf_counter() - start, copy, idle)
        return self._hold(u, full)

    def _gather_buffers(self, u: _Unit) -> tuple[torch.Tensor, np.ndarray, np.ndarray, float]:
        """A fresh vector for the unit's gather, what MPI sends (its shard) and receives into (the vector itself on
        the CPU, a host buffer for a GPU one), and the seconds of the shard's host copy."""
        full = torch.empty(u.size, dtype=torch.float32, device=self.device)
        send, copy = self._host(u.held)
        recv = self._np(full) if full.device.type == "cpu" else np.empty(u.size, dtype=np.float32)
        return full, send, recv, copy

    def _hold(self, u: _Unit, full: torch.Tensor) -> torch.Tensor:
        u.full = full
        self._live[full.untyped_storage().data_ptr()] = u
        self._note_peak()
        return full

    def _note_peak(self) -> None:
        """The gathered vectors held now (in use, or arriving), against the step's peak."""
        held = sum(x.size for x in self.units if x.full is not None or x.pending is not None)
        self.figures.gathered_bytes_peak = max(self.figures.gathered_bytes_peak, 4 * held)

    def _drop(self, u: _Unit) -> None:
        if u.full is not None:
            self._live.pop(u.full.untyped_storage().data_ptr(), None)
            u.full = None

    def _ensure(self, u: _Unit) -> None:
        if u.full is None:
            with torch.no_grad():
                self._acquire(u)

    def _start_next(self, u: _Unit, order: list[int]) -> None:
        if u.index not in order:
            return
        at = order.index(u.index)
        if at + 1 >= len(order):
            return
        nxt = self.units[order[at + 1]]
        if nxt.full is not None or nxt.pending is not None:
            return
        if self.progress is None:
            self.progress = Progress(threaded=self._gather_comm is not None)
        t0 = time.perf_counter()
        counts = (nxt.counts, _displs(nxt.counts))
        if self.progress.threaded and self._gather_comm is not None and self.device.type == "cpu":
            # the engine's thread makes the unit's fresh vector as well as the call: on the computing thread, right
            # after a GEMM, that allocation took 40-80 us of a 180 us gather (2-12 us in a loop of them alone)
            comm, pending = self._gather_comm, [None, None, None, None, 0.0, 0.0, None]

            def begin() -> list[Any]:
                full, send, recv, copy = self._gather_buffers(nxt)
                pending[1:4], pending[5] = [full, recv, send], copy
                return [comm.Iallgatherv(send, [recv, counts])]

            pending[6] = self.progress.launch(begin)
            pending[4] = time.perf_counter() - t0
            nxt.pending = pending
            self._note_peak()
            return
        full, send, recv, copy = self._gather_buffers(nxt)
        if self.progress.threaded and self._gather_comm is not None:  # the engine's thread starts and moves it
            comm = self._gather_comm
            request, flight = None, self.progress.launch(lambda: [comm.Iallgatherv(send, [recv, counts])])
        else:  # every operation of this rank tests it (poll)
            request, flight = self.comm.Iallgatherv(send, [recv, counts]), None
        exposed = time.perf_counter() - t0
        nxt.pending = [request, full, recv, send, exposed, copy, flight]
        self._note_peak()

    def poll(self) -> None:
        """Test every started gather the progress engine does not hold (MPI moves it only inside MPI calls where
        it has no progress thread); one the engine holds is its thread's to test."""
        for u in self.units:
            if u.pending is not None and u.pending[6] is None:
                t0 = time.perf_counter()
                u.pending[0].Test()
                u.pending[4] += time.perf_counter() - t0

    def _complete(self, pending: list[Any]) -> None:
        """A started gather completed on this thread: taken back from the engine, or waited for."""
        if pending[6] is not None:
            self.progress.wait(pending[6])
        else:
            pending[0].Wait()

    def close(self) -> None:
        """End the progress engine's thread and free the gathers' communicator (collective; a started gather left
        is the caller's to drain first)."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        if self._gather_comm is not None:
            self._gather_comm.Free()
            self._gather_comm = None

    def _wait(self, u: _Unit) -> torch.Tensor:
        t0 = time.perf_counter()
        self._complete(u.pending)  # a launched gather's buffers are in the list once it has begun
        _request, full, recv, _send, exposed, copy, _flight = u.pending
        if full.device.type != "cpu":
            t1 = time.perf_counter()
            full.copy_(torch.from_numpy(recv))
            copy += time.perf_counter() - t1
        exposed += time.perf_counter() - t0
        u.pending = None
        self.figures.exposed_seconds.append(exposed)
        self.figures.exposed_units.append(u.index)
        self._record("allgather", 4 * u.size, exposed, copy, 0.0)
        return self._hold(u, full)

    def _drain(self) -> None:
        """Gathers started and never used (a unit the last forward skipped) are finished and dropped."""
        for u in self.units:
            if u.pending is not None:
                self._complete(u.pending)
                u.pending = None

    def _reduce_scatter(self, u: _Unit, grad: torch.Tensor) -> torch.Tensor:
        from mpi4py import MPI

        idle, start = self._barrier()
        trainable = u.layout.trainable_size  # the frozen rest has no gradient: nothing of it is reduced
        send, copy = self._host(grad[:trainable].contiguous().to(torch.float32))
        out = torch.empty(u.train_counts[self.rank], dtype=torch.float32)
        self.comm.Reduce_scatter(send, self._np(out), u.train_counts, op=MPI.SUM)
        if self.device.type != "cpu":
            t0 = time.perf_counter()
            out = out.to(self.device)
            copy += time.perf_counter() - t0
        self._record("reduce_scatter", 4 * trainable, time.perf_counter() - start, copy, idle)
        return out

    # -- figures ------------------------------------------------------------------------------------------------
    def take_figures(self) -> StepFigures:
        """This step's prefetch figures and gathered peak; then afresh."""
        out, self.figures = self.figures, StepFigures()
        return out

    def blocking_gather_seconds(self, repeats: int = BLOCKING_PROBES) -> list[float]:
        """Collective: each unit's gather when nothing else runs, the median of `repeats` after a barrier each
        (after one warm-up), the slowest rank's: the yardstick of how much of a prefetched gather was hidden."""
        from mpi4py import MPI

        out = []
        for u in self.units:
            times = []
            send, _ = self._host(u.held)
            recv = np.empty(u.size, dtype=np.float32)
            for i in range(repeats + 1):
                self.comm.Barrier()
                t0 = time.perf_counter()
                self.comm.Allgatherv(send, [recv, (u.counts, _displs(u.counts))])
                if i:
                    times.append(time.perf_counter() - t0)
            mine = np.array([statistics.median(times)], dtype=np.float64)
            self.comm.Allreduce(MPI.IN_PLACE, mine, op=MPI.MAX)
            out.append(float(mine[0]))
        return out

    def state_bytes(self, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
        """What this rank holds between steps: its shards, their gradients, the optimizer's state of them."""
        p, g, o = held_bytes(self.model, optimizer)
        return {"param_bytes": p, "grad_bytes": g, "optimizer_bytes": o}

    # -- state --------------------------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: every parameter whole, once, by its name in the model (a tied one under its first name, as
        named_parameters() gives it), on the CPU at rank 0 (None elsewhere)."""
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            full = gatherv(self.comm, self._host(u.held)[0], u.counts, root=0)
            if full is not None:
                out.update(unflatten(u.layout, torch.from_numpy(full)))
        return out if self.rank == 0 else None

    def plain_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Collective: the state dict the model had before it was sharded, whole, on the CPU at rank 0 (None
        elsewhere): every key in the model's own order, a tied parameter (a language model's embedding and head)
        one tensor under each of its names, the persistent buffers as they are now. `load_state_dict` of an
        unsharded copy takes it as it is (strict)."""
        params = self.full_state_dict()
        if params is None:
            return None
        buffers = self._buffers()
        return {key: params[name] if name is not None else buffers[key] for key, name in self.state_keys}

    def _buffers(self) -> dict[str, torch.Tensor]:
        """The model's persistent buffers now (not sharded: every rank holds them), CPU copies by state-dict key."""
        keys = {key for key, name in self.state_keys if name is None}
        if not keys:
            return {}
        return {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items() if k in keys}

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """The whole model's parameters, each once (a tied one once), as transformers' num_parameters counts an
        unsharded model: `only_trainable` leaves out the frozen ones, `exclude_embeddings` every nn.Embedding's
        weight."""
        skip: set[str] = set()
        if exclude_embeddings:
            skip = {f"{name}.weight" for name, m in self.model.named_modules() if isinstance(m, nn.Embedding)}
        return sum(numel(shape) for u in self.units for name, shape in u.layout.params
                   if name not in skip and not (only_trainable and name in u.layout.frozen))

    @contextlib.contextmanager
    def full_params(self, writeback: bool = False) -> Iterator[nn.Module]:
        """Collective context manager: every unit gathered whole on every rank for the block, each sharded
        parameter readable under its names as a tensor (`model.get_input_embeddings().weight`), as FSDP's
        summon_full_params. With `writeback`, each rank's slice of what the block left there is kept (change the
        values alike on every rank). No forward or backward inside; the whole model is held meanwhile."""
        if self._full_params or self._hooks_ctx is not None or _in_backward() or any(u.pointed for u in self.units):
            raise WrapError("full_params(): the sharded model is in a forward, a backward or full_params() "
                            "already; enter it between steps")
        self._drain()
        with torch.no_grad():
            for u in self.units:
                self._acquire(u)
                self._point(u, u.full)
        self._full_params = True
        try:
            yield self.model
        finally:
            self._full_params = False
            with torch.no_grad():
                for u in self.units:
                    if writeback and u.full is not None:
                        u.held.copy_(u.full[u.offset:u.offset + u.counts[self.rank]])
                    self._unpoint(u)
                    self._drop(u)

    def save_pretrained(self, original: Callable[..., Any], save_directory: Any, *args: Any, **kwargs: Any) -> None:
        """transformers' save_pretrained for the sharded model (model.save_pretrained calls this): collective, the
        whole model (plain_state_dict) written by rank 0 alone through `original` (the model's own
        save_pretrained); a failure there is raised on every rank. A `state_dict` the caller passes is saved as
        given, by every rank that calls (transformers' own rule)."""
        if kwargs.get("state_dict") is not None or len(args) >= 2 and args[1] is not None:
            original(save_directory, *args, **kwargs)
            return
        full = self.plain_state_dict()
        problem = None
        if self.rank == 0:
            try:
                original(save_directory, *args, **{**kwargs, "state_dict": full})
            except Exception as e:  # noqa: BLE001 - raised on every rank below, rank 0's own exception kept
                problem = e
        said = self.comm.bcast(None if problem is None else f"{type(problem).__name__}: {problem}", root=0)
        if problem is not None:
            raise problem
        if said is not None:
            raise RuntimeError(f"save_pretrained({str(save_directory)!r}) failed at rank 0, which writes the "
                               f"whole model: {said}")

    # -- sharded checkpoints ------------------------------------------------------------------------------------
    def save_checkpoint(self, folder: Any, optimizer: torch.optim.Optimizer | None = None,
                        extra: dict[str, Any] | None = None) -> Path:
        """Collective: the model's state sharded as it is held, and `optimizer`'s state of its shards, into the new
        folder `folder` (one every rank sees): each rank writes its slice of every unit's flat vector
        (rank-<r>.param.npy; AdamW's exp_avg and exp_avg_sq as .m.npy and .v.npy, as `hetbench train
        --strategy fsdp` saves them; another optimizer's state by its key), rank 0 the persistent buffers
        (buffers.pt) and last the manifest (manifest.json: the layout, each rank's pieces, the optimizer's class,
        step counts and hyperparameters, `extra`, which must be JSON). All of it is written into a temporary
        folder beside `folder`, renamed into place once complete: a save that fails leaves no `folder`. Returns
        the folder. Raises ShardedCheckpointError, the same on every rank."""
        folder = Path(folder)
        tmp = self._checkpoint_tmp(folder, extra)
        # what each rank's optimizer holds of its shards, agreed before any file is written (every rank writes the
        # same arrays)
        mine = _optimizer_facts(self, optimizer)
        every = self.comm.allgather(mine)
        opt, problem = _agree_optimizer(self, every)
        pieces: list[list[int]] = []
        if problem is None:
            try:
                pieces = self._write_pieces(tmp, optimizer, opt)
            except OSError as e:
                problem = _write_problem(folder, e)
        said = self.comm.allgather((pieces, problem))
        failed = [p for _, p in said if p]
        if failed:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            self.comm.Barrier()  # every rank raises once nothing of the save is left
            raise ShardedCheckpointError(failed[0])
        error = self._finish_checkpoint(folder, tmp, opt, said, extra) if self.rank == 0 else None
        error = self.comm.bcast(error, root=0)
        if error:
            raise ShardedCheckpointError(error)
        return folder

    def _checkpoint_tmp(self, folder: Path, extra: dict[str, Any] | None) -> Path:
        """Collective: the temporary folder beside `folder` that save_checkpoint writes into, made by rank 0 once
        `folder` is found absent and `extra` JSON. Raises ShardedCheckpointError, the same on every rank."""
        tmp, error = None, None
        if self.rank == 0:
            try:
                if folder.exists() or folder.is_symlink():
                    raise ShardedCheckpointError(f"checkpoint folder {str(folder)!r} exists already; save each "
                                                 "checkpoint to a new folder")
                to_json({"extra": extra})  # the caller's extra must be JSON before anything is written
                folder.parent.mkdir(parents=True, exist_ok=True)
                tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
                tmp.mkdir()
            except ShardedCheckpointError as e:
                error = str(e)
            except (TypeError, ValueError) as e:
                error = f"save_checkpoint: extra is not JSON ({e})"
            except OSError as e:
                error = f"cannot write checkpoint folder {str(folder)!r}: {e.strerror or e}"
        tmp, error = self.comm.bcast((tmp, error), root=0)
        if error:
            raise ShardedCheckpointError(error)
        return tmp

    def _finish_checkpoint(self, folder: Path, tmp: Path, opt: dict[str, Any] | None,
                           said: list[tuple[list[list[int]], str | None]], extra: dict[str, Any] | None) -> str | None:
        """Rank 0's end of save_checkpoint, once every rank's files are in `tmp` (`said`: each rank's pieces): the
        buffers, then the manifest, then `tmp` renamed to `folder`. Returns None, or the error (`tmp` removed)."""
        arrays = ["param", *(_array_name(k) for k in (opt or {}).get("state", []))]
        document = {
            "format": CHECKPOINT_FORMAT, "torch_version": torch.__version__, "ranks_saved": self.size,
            "weights": list(self.weights), "element_weights": list(self.element_weights),
            "layout": [u.layout.to_dict() for u in self.units], "counts": [list(u.counts) for u in self.units],
            "state_keys": [[k, n] for k, n in self.state_keys], "arrays": arrays,
            "ranks": [{"rank": r, "pieces": p, "files": {a: f"rank-{r}.{a}.npy" for a in arrays} if p else {}}
                      for r, (p, _) in enumerate(said)],
            "optimizer": opt, "buffers": None, "extra": extra}
        try:
            buffers = self._buffers()
            if buffers:
                commit([stage(tmp / BUFFERS_FILE, lambda f: torch.save(buffers, f), binary=True)])
                document["buffers"] = BUFFERS_FILE
            write_json_atomic(tmp / CHECKPOINT_MANIFEST, document)  # last: a folder without it is no checkpoint
            if folder.exists():
                raise OSError(17, "it exists already (made while this save ran)", str(folder))
            os.rename(tmp, folder)
            fsync_folder(folder.parent)  # the rename itself durable
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return _write_problem(folder, e)
        return None

    def _write_pieces(self, tmp: Path, optimizer: torch.optim.Optimizer | None,
                      opt: dict[str, Any] | None) -> list[list[int]]:
        """This rank's files in `tmp`: per array, its slices of the units one after another (the optimizer's
        arrays are its state of the trainable part, zeros over the frozen rest); its pieces [unit, start, stop,
        offset in its files]."""
        pieces, at = [], 0
        slices: dict[str, list[np.ndarray]] = {"param": []}
        keys = (opt or {}).get("state", [])
        for k in keys:
            slices[_array_name(k)] = []
        for u in self.units:
            count = u.counts[self.rank]
            if count == 0:
                continue
            pieces.append([u.index, u.offset, u.offset + count, at])
            at += count
            slices["param"].append(u.held.detach().to("cpu").numpy().astype(np.float32))
            state = optimizer.state.get(u.shard, {}) if optimizer is not None else {}
            for k in keys:
                out = np.zeros(count, dtype=np.float32)
                value = state.get(k)
                if isinstance(value, torch.Tensor) and value.dim() == 1:
                    out[:value.numel()] = value.detach().to("cpu", torch.float32).numpy()
                slices[_array_name(k)].append(out)
        if pieces:
            for name, parts in slices.items():
                write_npy_atomic(tmp / f"rank-{self.rank}.{name}.npy", np.concatenate(parts))
        return pieces

    def load_checkpoint(self, folder: Any, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Collective: the state save_checkpoint wrote into `folder`, on any ranks and weights, re-sharded onto
        this run's: each rank reads the elements of every unit it owns now (and, with `optimizer`, its state of
        them: moments re-sliced, step counts and hyperparameters as saved). Everything is checked on every rank
        before anything is changed: another model (layout), a missing, truncated or damaged file, an optimizer of
        another class or without the sharded parameters raise the same ShardedCheckpointError on every rank and
        leave the model and optimizer as they were. Returns the `extra` saved with it."""
        problem, got = None, None
        try:
            ck = _OpenCheckpoint(Path(folder))
            ck.check_model(self)
            ck.check_optimizer(self, optimizer)
            got = ck.read_shards(self, optimizer is not None)
        except ShardedCheckpointError as e:
            problem = str(e)
        every = self.comm.allgather(problem)
        bad = [(r, p) for r, p in enumerate(every) if p is not None]
        if bad:
            if len({p for _, p in bad}) == 1:
                raise ShardedCheckpointError(bad[0][1])
            raise ShardedCheckpointError("; ".join(f"rank {r}: {p}" for r, p in bad))
        assert got is not None
        params, states, buffers = got
        with torch.no_grad():
            for u, values in zip(self.units, params):
                u.held.copy_(values.to(self.device))
            if buffers:
                own = dict(self.model.named_buffers())
                for key, value in buffers.items():
                    own[key].copy_(value.to(own[key].device, own[key].dtype))
        if optimizer is not None:
            opt = ck.manifest.get("optimizer") or {}
            for u, state in zip(self.units, states):
                if state is None:
                    optimizer.state.pop(u.shard, None)
                else:
                    optimizer.state[u.shard] = {k: v.to(self.device) if isinstance(v, torch.Tensor) and v.dim()
                                                else v for k, v in state.items()}
            for group, saved in zip(optimizer.param_groups, opt.get("param_groups") or []):
                for key, value in saved.items():
                    if key in group:
                        group[key] = tuple(value) if isinstance(group[key], tuple) else value
        return ck.manifest.get("extra")

    def optimizer_pieces(self, optimizer: torch.optim.Optimizer) -> list[tuple[_Unit, dict[str, torch.Tensor]]]:
        """Per unit, this rank's optimizer state of its shard ({} before the first step; AdamW: exp_avg,
        exp_avg_sq)."""
        out = []
        for u in self.units:
            state = optimizer.state.get(u.shard, {})
            out.append((u, {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() == 1}))
        return out

    def load_flat(self, read: Callable[[str, int, int, int], np.ndarray], optimizer: torch.optim.Optimizer | None,
                  state_keys: dict[str, str] | None = None, optimizer_steps: int = 0) -> None:
        """Each unit's shard (and optimizer state, `state_keys` saved name -> torch's key, e.g. {"m": "exp_avg"})
        from `read(name, unit, start, stop)`, which reads elements [start, stop) of a unit's flat vector from
        wherever they were saved: re-sharding onto this run's weights."""
        names = state_keys or {}
        with torch.no_grad():
            for u in self.units:
                lo, hi = u.offset, u.offset + u.counts[self.rank]
                u.held.copy_(torch.from_numpy(np.array(read("param", u.index, lo, hi), dtype=np.float32)))
                if optimizer is not None and names:
                    hi = lo + u.train_counts[self.rank]  # the optimizer holds state of the trainable part only
                    state = {key: torch.from_numpy(np.array(read(name, u.index, lo, hi), dtype=np.float32)).to(
                        self.device) for name, key in names.items()}
                    state["step"] = torch.tensor(float(optimizer_steps))
                    optimizer.state[u.shard] = state


def unflatten(layout: UnitLayout, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """A unit's flat vector as its named parameters (copies)."""
    out, at = {}, 0
    for name, shape in layout.params:
        n = numel(shape)
        out[name] = flat[at:at + n].reshape(shape).clone()
        at += n
    return out


def flatten(layout: UnitLayout, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The unit's named tensors as its flat float32 vector (the inverse of unflatten)."""
    if not layout.params:
        return torch.zeros(0)
    return torch.cat([tensors[name].detach().to("cpu", torch.float32).reshape(-1) for name, _ in layout.params])


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread now (an activation checkpoint's
    recomputation runs a forward there)."""
    return torch._C._current_graph_task_id() != -1


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _tensors(o)]
    return []


def shard_module(model: nn.Module, units: Iterable[nn.Module] = (), weights: str | Sequence[float] = "even",
                 group: Any = None, prefetch: bool = True, memory_bytes: Sequence[int | None] | None = None,
                 optimizer: str = "adamw", rate: Callable[[], float] | None = None) -> ShardedModule:
    """Collective: shard `model`'s parameters over the ranks of `group` (default: the world; the "hetbench"
    backend), each of `units` (in forward order) one flat vector, the root the rest, every rank's slice in
    proportion to its weight ("even", "auto": each rank's rate() or torch matmul rate, a calibrate profile, a list
    or "3,1"), bounded by `memory_bytes` (per rank, None: no cap; `optimizer` says how many bytes an element
    costs). Returns the ShardedModule (also model._hetbench_fsdp). Raises WrapError or
    hetbench.harness.split_plan.WeightsError / PlacementError with a one-line message."""
    units = list(units)
    pg = hetbench_group(group)
    if pg is None:
        raise WrapError("hetbench fsdp runs over the hetbench torch.distributed backend: call hetbench.pytorch.init() "
                        "(or dist.init_process_group('hetbench')) first")
    # what cannot be wrapped, and what the ranks must agree on, compared before any collective of the sharding
    problem: Exception | None = None
    layout: list[Any] = []
    try:
        layout = layout_facts(model, units)
        if isinstance(weights, str):
            plan.parse_weights(weights, pg.comm.Get_size())
    except (WrapError, plan.WeightsError, plan.PlacementError) as e:
        problem = e
    chosen = {"weights": weights if isinstance(weights, str) else [float(w) for w in weights],
              "memory_bytes": None if memory_bytes is None else list(memory_bytes), "optimizer": optimizer,
              "prefetch": bool(prefetch), "units": len(units)}
    _agree(pg.comm, problem, layout, chosen)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    problem, resolved = None, []
    try:
        resolved = resolve_weights(weights, group, device, rate)
    except plan.WeightsError as e:  # a profile one rank cannot read
        problem = e
    _agree(pg.comm, problem, [], {"resolved weights": resolved})
    return ShardedModule(model, units, resolved, pg.comm, pg.metrics, False, prefetch, memory_bytes, optimizer, pg)


def layout_facts(model: nn.Module, units: Sequence[nn.Module]) -> list[Any]:
    """The flat vectors sharding `model` makes, each parameter with its shape, dtype and whether it is trained: what
    every rank must have alike. Raises WrapError."""
    params = dict(model.named_parameters())
    return [[lay.name, [[name, list(shape), str(params[name].dtype).replace("torch.", ""), name not in lay.frozen]
                        for name, shape in lay.params]] for lay in flat_layout(model, units)]


_ERRORS = {"WrapError": WrapError, "WeightsError": plan.WeightsError, "PlacementError": plan.PlacementError}


def _agree(comm: Any, problem: Exception | None, layout: list[Any], chosen: dict[str, Any]) -> None:
    """Collective: every rank's problem, layout (by digest; whole only when they differ) and arguments compared;
    any problem or difference raises the same exception on every rank, naming the rank and the values, instead
    of one rank raising while the others wait in MPI (or a shard of another size truncating a message)."""
    import hashlib

    digest = hashlib.sha256(repr(layout).encode()).hexdigest()
    mine = (None if problem is None else (type(problem).__name__, str(problem)), digest, chosen)
    every = comm.allgather(mine)
    size = len(every)
    bad = [(r, p) for r, (p, _, _) in enumerate(every) if p is not None]
    if bad:
        kind = bad[0][1][0]
        if len(bad) == size and len({p for _, p in bad}) == 1:
            raise _ERRORS.get(kind, WrapError)(bad[0][1][1])  # every rank refused alike: the reason as it is
        raise _ERRORS.get(kind, WrapError)("shard_module refused on every rank: " +
                                           "; ".join(f"rank {r}: {p[1]}" for r, p in bad))
    for key in chosen:
        values = [c[key] for _, _, c in every]
        if any(v != values[0] for v in values):
            error = plan.WeightsError if "weights" in key else WrapError
            raise error(f"shard_module: the ranks pass different {key} ({_by_rank(values)}): every rank must pass "
                        "the same")
    if any(d != every[0][1] for _, d, _ in every):
        layouts = comm.allgather(layout)
        raise WrapError(f"shard_module: the ranks' models differ: {_first_difference(layouts)}; every rank must "
                        "shard the same model (names, shapes, dtypes and requires_grad alike)")


def _by_rank(values: list[Any]) -> str:
    groups: dict[str, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(repr(v), []).append(r)
    return "; ".join(f"{'rank' if len(rs) == 1 else 'ranks'} {','.join(map(str, rs))}: {v}" for v, rs in groups.items())


def _first_difference(layouts: list[list[Any]]) -> str:
    """The first place where a rank's layout departs from rank 0's, in words."""
    def params(layout: list[Any]) -> list[tuple[str, str]]:
        return [(f"{name} (unit {unit or 'root'})",
                 f"{dtype}[{', '.join(map(str, shape))}]{'' if trained else ' frozen'}")
                for unit, ps in layout for name, shape, dtype, trained in ps]

    ref = params(layouts[0])
    for r, layout in enumerate(layouts[1:], start=1):
        mine = params(layout)
        for i in range(max(len(ref), len(mine))):
            a = ref[i] if i < len(ref) else None
            b = mine[i] if i < len(mine) else None
            if a != b:
                said = lambda p: "nothing" if p is None else f"parameter {p[0]} {p[1]}"  # noqa: E731
                return f"rank 0 has {said(a)} where rank {r} has {said(b)}"
        if [u for u, _ in layout] != [u for u, _ in layouts[0]]:
            return f"rank 0's units are {[u for u, _ in layouts[0]]}, rank {r}'s {[u for u, _ in layout]}"
    return "their layouts differ"


def sharded(model: nn.Module) -> ShardedModule | None:
    """The ShardedModule of a model shard_module wrapped, else None."""
    return getattr(model, ATTR, None)


# -- a sharded parameter's name on its module ----------------------------------------------------------------------
_SHARDED_CLASSES: dict[type, type] = {}


def _mark_sharded(m: nn.Module, attr: str, module_name: str, param_name: str) -> None:
    """`m.attr` (parameter `param_name` of the model) is sharded: outside the forward, where no view stands in for
    it, reading it raises ShardedParameterError naming what to call instead. The module's class becomes a
    subclass of its own of the same name whose __getattr__ (only reached where the usual lookup failed) says so."""
    cls = type(m)
    if not getattr(cls, "_hetbench_sharded_class", False):
        if cls not in _SHARDED_CLASSES:
            _SHARDED_CLASSES[cls] = type(cls.__name__, (cls,), {
                "__getattr__": _sharded_getattr, "_hetbench_sharded_class": True, "__module__": cls.__module__,
                "__qualname__": cls.__qualname__})
        m.__class__ = _SHARDED_CLASSES[cls]
    m.__dict__.setdefault("_hetbench_sharded", {})[attr] = (module_name, param_name)


def _sharded_getattr(self: nn.Module, name: str) -> Any:
    try:
        return super(type(self), self).__getattr__(name)  # type: ignore[misc]
    except AttributeError:
        where = self.__dict__.get("_hetbench_sharded", {}).get(name)
        if where is None:
            raise
        module_name, param_name = where
        raise ShardedParameterError(
            f"{type(self).__name__} {module_name or '(the model)'!r}: its {name!r} (parameter {param_name!r}) is "
            "sharded by hetbench's shard_module and held whole only inside its unit's forward; read it inside "
            "`with sharded.full_params():`, or take sharded.plain_state_dict() (both collective; sharded = "
            "hetbench.pytorch.sharded(model))") from None


def _adopt_transformers_methods(model: nn.Module, engine: ShardedModule) -> None:
    """A transformers PreTrainedModel's num_parameters and save_pretrained, as they would be unsharded: the whole
    model counted (not this rank's shards), the whole model written by rank 0 (collective; not rank 0's flat
    shards). Set on the instance: its class is left as it is."""
    if callable(getattr(type(model), "num_parameters", None)):
        model.num_parameters = engine.num_parameters  # type: ignore[method-assign]
    if callable(getattr(type(model), "save_pretrained", None)):
        model.save_pretrained = functools.partial(engine.save_pretrained, model.save_pretrained)  # type: ignore


# -- sharded checkpoints -------------------------------------------------------------------------------------------
def _write_problem(folder: Path, e: OSError) -> str:
    """The one line a save of `folder` that failed with `e` says, naming the file it failed on."""
    name = f" ({Path(e.filename).name})" if e.filename else ""
    return f"cannot write checkpoint {str(folder)!r}{name}: {e.strerror or e}"


def _array_name(key: str) -> str:
    """The file name part of an optimizer state key's array (AdamW's moments as the CLI's fsdp names them)."""
    return ARRAY_NAMES.get(key, key)


def _json_value(v: Any) -> Any:
    """A hyperparameter as JSON holds it, or a marker that it cannot be (left out)."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in v):
        return list(v)
    return _SKIP


_SKIP = object()


def _optimizer_facts(engine: ShardedModule, optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
    """What this rank's optimizer holds of its shards: its class, the units whose shard it lacks, per unit the
    keys of its state that are slices of the shard (1-D, the shard's length), its scalars (a step count) and
    anything else; its param_groups' hyperparameters."""
    if optimizer is None:
        return None
    units: list[Any] = []
    for u in engine.units:
        state = optimizer.state.get(u.shard)
        if not state:
            units.append(None)
            continue
        sliced, scalars, other = [], {}, []
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() == 1 and v.numel() == u.train_counts[engine.rank]:
                sliced.append(k)
            elif isinstance(v, torch.Tensor) and v.dim() == 0:
                scalars[k] = {"value": v.item(), "dtype": str(v.dtype).replace("torch.", "")}
            elif isinstance(v, (bool, int, float)):
                scalars[k] = {"value": v, "dtype": None}
            elif v is not None:
                other.append(k)
        units.append({"sliced": sliced, "scalars": scalars, "other": other})
    groups = [{k: j for k, v in g.items() if k != "params" and (j := _json_value(v)) is not _SKIP}
              for g in optimizer.param_groups]
    return {"class": type(optimizer).__name__, "units": units, "param_groups": groups,
            "missing": _unheld_units(engine, optimizer)}


def _unheld_units(engine: ShardedModule, optimizer: torch.optim.Optimizer) -> list[str]:
    """The units (by name, the root's "root") whose trainable flat shard `optimizer` does not hold."""
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return [u.name or "root" for u in engine.units if u.layout.trainable_size > 0 and id(u.shard) not in held]


def _unheld_problem(call: str, unit: str) -> str:
    return (f"{call}: the optimizer does not hold the flat shard of unit {unit!r}: make it over model.parameters() "
            "after shard_module")


def _agree_optimizer(engine: ShardedModule, every: list[Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest's "optimizer" from every rank's _optimizer_facts, or why it cannot be saved (the same on every
    rank: made from the same list)."""
    if all(f is None for f in every):
        return None, None
    if any(f is None for f in every):
        return None, ("save_checkpoint: an optimizer was given on ranks "
                      f"{[r for r, f in enumerate(every) if f is not None]} only; give it on every rank, or on none")
    classes = {f["class"] for f in every}
    if len(classes) > 1:
        return None, f"save_checkpoint: the ranks' optimizers differ ({', '.join(sorted(classes))})"
    missing = next((f["missing"] for f in every if f["missing"]), None)
    if missing:
        return None, _unheld_problem("save_checkpoint", missing[0])
    units: list[Any] = []
    keys: list[str] = []
    for i, u in enumerate(engine.units):
        entries = [f["units"][i] for f in every if f["units"][i] is not None]
        if not entries:
            units.append(None)
            continue
        other = next((e["other"] for e in entries if e["other"]), None)
        if other:
            return None, (f"save_checkpoint: the optimizer's state {other[0]!r} of unit {u.name or 'root'!r} is "
                          "neither a tensor of the shard's length nor a scalar: hetbench cannot re-slice it")
        sliced = list(dict.fromkeys(k for e in entries for k in e["sliced"]))
        scalars: dict[str, Any] = {}
        for e in entries:
            for k, v in e["scalars"].items():
                if k in scalars and scalars[k] != v:
                    return None, (f"save_checkpoint: the ranks' optimizer state {k!r} of unit {u.name or 'root'!r} "
                                  f"differs ({scalars[k]['value']} and {v['value']}): a step every rank takes alike")
                scalars[k] = v
        units.append({"sliced": sliced, "scalars": scalars})
        keys += [k for k in sliced if k not in keys]
    return {"class": every[0]["class"], "state": keys, "units": units,
            "param_groups": every[0]["param_groups"]}, None


def _check(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise ShardedCheckpointError(f"{where} is not a checkpoint save_checkpoint wrote: {what}")


class _OpenCheckpoint:
    """A save_checkpoint folder opened for reading: the manifest read and its form checked; the files checked
    (read_shards) before any of their values is used."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        if not folder.exists():
            raise ShardedCheckpointError(f"checkpoint folder {str(folder)!r} does not exist")
        if not folder.is_dir():
            raise ShardedCheckpointError(f"checkpoint {str(folder)!r} is not a folder")
        path = folder / CHECKPOINT_MANIFEST
        if not path.exists():
            raise ShardedCheckpointError(f"checkpoint {str(folder)!r} has no {CHECKPOINT_MANIFEST}: not a complete "
                                         "checkpoint (a save that did not finish?)")
        problem = regular_file_problem(path, MAX_MANIFEST_BYTES)
        if problem:
            raise ShardedCheckpointError(f"checkpoint file {str(path)!r} {problem}")
        where = repr(str(path))
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ShardedCheckpointError(f"cannot read {where}: {e.strerror or e}") from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError):
            raise ShardedCheckpointError(f"{where} is not JSON: not a manifest save_checkpoint wrote (damaged?)") \
                from None
        if not isinstance(m, dict) or m.get("format") != CHECKPOINT_FORMAT:
            said = m.get("format") if isinstance(m, dict) else None
            raise ShardedCheckpointError(f"{where} is not a shard_module checkpoint ({CHECKPOINT_FORMAT}" +
                                         (f"; it says {said!r}" if said else "") + ")")
        try:
            self.layout = [UnitLayout(str(u["name"]), [(str(n), tuple(int(d) for d in shape)) for n, shape in
                                                       u["params"]], tuple(str(n) for n in u.get("frozen", ())))
                           for u in m["layout"]]
            self.arrays = [str(a) for a in m["arrays"]]
            self.pieces = [(int(v), int(lo), int(hi), int(r["rank"]), int(off))
                           for r in m["ranks"] for v, lo, hi, off in r["pieces"]]
            self.state_keys = [(str(k), None if n is None else str(n)) for k, n in m["state_keys"]]
        except (KeyError, TypeError, ValueError) as e:
            raise ShardedCheckpointError(f"{where} lacks {e} or holds it in another form: not a manifest "
                                         "save_checkpoint wrote") from None
        _check("param" in self.arrays, where, "it lists no param array")
        self.manifest = m
        self.where = where
        self._files: dict[tuple[int, str], np.ndarray] = {}

    def check_model(self, engine: ShardedModule) -> None:
        """The saved layout against the model's: the units, their parameters (names, shapes) and frozen ones."""
        want = [(u.layout.name, u.layout.params, u.layout.frozen) for u in engine.units]
        got = [(u.name, u.params, u.frozen) for u in self.layout]
        if want == got:
            return
        start = f"checkpoint {str(self.folder)!r} holds another model"
        for i, ((wn, wp, wf), (gn, gp, gf)) in enumerate(zip(want, got)):
            for (a, sa), (b, sb) in zip(wp, gp):
                if (a, sa) != (b, sb):
                    raise ShardedCheckpointError(f"{start}: {b} {list(sb)} in unit {gn or 'root'!r} where this model "
                                                 f"has {a} {list(sa)}")
            if len(wp) != len(gp) or wn != gn:
                raise ShardedCheckpointError(f"{start}: unit {i} is {gn or 'root'!r} of {len(gp)} parameters, this "
                                             f"model's {wn or 'root'!r} of {len(wp)}")
            if wf != gf:
                raise ShardedCheckpointError(f"{start}: unit {gn or 'root'!r} froze {list(gf)}, this model freezes "
                                             f"{list(wf)}")
        raise ShardedCheckpointError(f"{start}: {len(got)} units, this model shards into {len(want)} "
                                     "(shard_module's units)")

    def check_optimizer(self, engine: ShardedModule, optimizer: torch.optim.Optimizer | None) -> None:
        if optimizer is None:
            return
        opt = self.manifest.get("optimizer")
        if not opt:
            raise ShardedCheckpointError(f"checkpoint {str(self.folder)!r} holds no optimizer state: load it "
                                         "without an optimizer")
        if opt.get("class") != type(optimizer).__name__:
            raise ShardedCheckpointError(f"checkpoint {str(self.folder)!r} holds {opt.get('class')}'s state, this "
                                         f"optimizer is {type(optimizer).__name__}")
        missing = _unheld_units(engine, optimizer)
        if missing:
            raise ShardedCheckpointError(_unheld_problem("load_checkpoint", missing[0]))
        _check(isinstance(opt.get("units"), list) and len(opt["units"]) == len(self.layout), self.where,
               "its optimizer lists no state per unit")
        _check(len(opt.get("param_groups") or []) in (0, len(optimizer.param_groups)), self.where,
               f"it holds {len(opt.get('param_groups') or [])} parameter groups, this optimizer "
               f"{len(optimizer.param_groups)}")

    def verify(self) -> None:
        """Every piece within its unit, every unit covered once, every file there, a float32 .npy array long
        enough for its pieces (said the same on every rank: nothing here depends on the rank)."""
        sizes = [u.size for u in self.layout]
        spans: dict[int, list[tuple[int, int]]] = {}
        need: dict[int, int] = {}
        for v, lo, hi, r, off in self.pieces:
            _check(0 <= v < len(sizes) and 0 <= lo <= hi <= sizes[v] and off >= 0, self.where,
                   f"rank {r}'s piece [{v}, {lo}, {hi}, {off}] lies outside the units' elements")
            if hi > lo:
                spans.setdefault(v, []).append((lo, hi))
                need[r] = max(need.get(r, 0), off + hi - lo)
        for v, size in enumerate(sizes):
            reach = 0
            for lo, hi in sorted(spans.get(v, [])):
                _check(lo == reach, self.where, f"unit {v}'s elements {min(lo, reach)} to {max(lo, reach)} are "
                       + ("saved twice" if lo < reach else "saved by no rank"))
                reach = hi
            _check(reach == size, self.where, f"unit {v}'s elements {reach} to {size} are saved by no rank")
        for r, n in sorted(need.items()):
            for name in self.arrays:
                got = self._file(r, name).size
                if got < n:
                    raise ShardedCheckpointError(f"checkpoint file {str(self.folder / f'rank-{r}.{name}.npy')!r} "
                                                 f"holds {got} elements, its pieces need {n}: truncated")

    def _file(self, rank: int, name: str) -> np.ndarray:
        key = (rank, name)
        if key not in self._files:
            array = load_flat_piece(self.folder / f"rank-{rank}.{name}.npy", ShardedCheckpointError,
                                    CHECKPOINT_MANIFEST)
            self._files[key] = array
        return self._files[key]

    def read(self, name: str, unit: int, lo: int, hi: int) -> np.ndarray:
        """Elements [lo, hi) of array `name` of a unit's flat vector, from whichever pieces hold them (finite)."""
        out = np.empty(hi - lo, dtype=np.float32)
        for v, p_lo, p_hi, r, off in self.pieces:
            a, b = max(lo, p_lo), min(hi, p_hi)
            if v == unit and a < b:
                out[a - lo:b - lo] = self._file(r, name)[off + a - p_lo:off + b - p_lo]
        if not np.isfinite(out).all():
            at = int(np.argmin(np.isfinite(out)))
            raise ShardedCheckpointError(f"checkpoint {str(self.folder)!r} holds {out[at]} in {name} of unit "
                                         f"{self.layout[unit].name or 'root'!r}: the state of a run that diverged, "
                                         "or a damaged file, is not loaded")
        return out

    def unit_state(self, unit: int, lo: int, hi: int) -> dict[str, torch.Tensor] | None:
        """The optimizer's state of elements [lo, hi) of a unit's trainable part, as torch keeps it; None where none
        was saved for the unit."""
        entry = (self.manifest.get("optimizer") or {}).get("units", [None] * (unit + 1))[unit]
        if entry is None:
            return None
        state: dict[str, torch.Tensor] = {}
        try:
            for key in entry["sliced"]:
                _check(_array_name(key) in self.arrays, self.where, f"its optimizer state {key!r} has no array")
                state[key] = torch.from_numpy(self.read(_array_name(key), unit, lo, hi))
            for key, v in entry["scalars"].items():
                value = v["value"]
                state[key] = value if v["dtype"] is None else torch.tensor(value, dtype=getattr(torch, v["dtype"]))
        except (KeyError, TypeError, AttributeError) as e:
            raise ShardedCheckpointError(f"{self.where}: the optimizer state of unit {unit} lacks {e} or holds it "
                                         "in another form") from None
        return state

    def buffers(self, keys: set[str] | None) -> dict[str, torch.Tensor]:
        """The persistent buffers rank 0 saved (checked against `keys`, the model's; None: not checked)."""
        name = self.manifest.get("buffers")
        if not name:
            _check(not keys, self.where, "it holds no buffers, this model has " + ", ".join(sorted(keys or ())))
            return {}
        path = self.folder / str(name)
        where = f"checkpoint file {str(path)!r}"
        problem = regular_file_problem(path)
        if problem:
            raise ShardedCheckpointError(f"{where} {problem}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise ShardedCheckpointError(f"checkpoint {str(self.folder)!r} is incomplete: {name} is missing") from None
        except Exception:  # noqa: BLE001 - a truncated zip, an unpickler's refusal: one line either way
            raise ShardedCheckpointError(f"{where} is not a state torch.save wrote (truncated or damaged)") from None
        _check(isinstance(got, dict) and all(isinstance(v, torch.Tensor) for v in got.values()), where,
               "it holds no dict of tensors")
        if keys is not None and set(got) != keys:
            raise ShardedCheckpointError(f"checkpoint {str(self.folder)!r} holds another model: buffers "
                                         f"{sorted(got)}, this model's {sorted(keys)}")
        return got

    def read_shards(self, engine: ShardedModule, with_optimizer: bool) -> tuple[list[torch.Tensor], list[Any],
                                                                               dict[str, torch.Tensor]]:
        """This rank's slice of every unit (and its optimizer state), re-sharded: nothing of the engine changed."""
        self.verify()
        params, states = [], []
        for i, u in enumerate(engine.units):
            lo, hi = u.offset, u.offset + u.counts[engine.rank]
            params.append(torch.from_numpy(self.read("param", i, lo, hi)))
            states.append(self.unit_state(i, lo, lo + u.train_counts[engine.rank]) if with_optimizer else None)
        own = {key for key, name in engine.state_keys if name is None}
        return params, states, self.buffers(own)


def read_checkpoint(folder: Any) -> dict[str, Any]:
    """One process, no ranks: a save_checkpoint folder as plain state. {"model": the model's state dict as it was
    unsharded (every key, a tied parameter under each name, the persistent buffers), "optimizer": {parameter
    name: its optimizer state, whole} or None, "extra": what was saved with it}. `load_state_dict` of an
    unsharded model takes "model" as it is. Raises ShardedCheckpointError."""
    ck = _OpenCheckpoint(Path(folder))
    ck.verify()
    params: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, Any]] | None = {} if ck.manifest.get("optimizer") else None
    for i, lay in enumerate(ck.layout):
        params.update(unflatten(lay, torch.from_numpy(ck.read("param", i, 0, lay.size))))
        state = ck.unit_state(i, 0, lay.trainable_size) if optim is not None else None
        if state is None or optim is None:
            continue
        at = 0
        for name, shape in lay.params:
            if name in lay.frozen:
                continue
            n = numel(shape)
            optim[name] = {k: v[at:at + n].reshape(shape).clone() if isinstance(v, torch.Tensor) and v.dim() else v
                           for k, v in state.items()}
            at += n
    buffers = ck.buffers(None)
    try:
        model = {key: params[name] if name is not None else buffers[key] for key, name in ck.state_keys}
    except KeyError as e:
        raise ShardedCheckpointError(f"{ck.where} names {e} in its state_keys, which it does not hold") from None
    return {"model": model, "optimizer": optim, "extra": ck.manifest.get("extra")}
