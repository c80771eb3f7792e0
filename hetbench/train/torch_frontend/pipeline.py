"""`hetbench train --frontend torch --pp N`: the model's blocks cut into N pipeline stages by the weights (auto:
each rank's measured forward + backward time per block) and the ranks' memory, run by torch's GPipe or 1F1B
schedule (hetbench/pytorch/pipeline.py), with the rest of the ranks data parallel by --strategy on a pp x dp mesh,
each group on its native backend where one serves it.

Every replica (a pipeline) takes its rows of the batch in whole micro-batches, rows shared by each replica's
speed through its stages; the loss of a micro-batch is its rows' part of the global batch's mean, so the step is
exact against one process."""

from __future__ import annotations

import importlib
import inspect
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

# the module, not hetbench.pytorch.pipeline the library call of the same name
pp = importlib.import_module("hetbench.pytorch.pipeline")
from hetbench.pytorch import tensor as tpl
from hetbench.pytorch.logger import hetbench_group
from hetbench.train.outcome import ROOT, RankOutcome
from hetbench.train.run import resolve_weights
from hetbench.train.strategies import get as strategy
from hetbench.train.torch_frontend.checkpoint import writer
from hetbench.pytorch.offload import offload_linears, step_seconds
from hetbench.train.torch_frontend.models import (
    build_model,
    make_batch,
    output_row_losses,
    pipeline_parts,
    tensor_plan,
)
from hetbench.train.torch_frontend.parallel import ApplyContext, Parallel, state_memory_bytes

# bytes of training state per parameter, beside its 4 (fp32): its gradient, AdamW's two moments
STATE_BYTES = {"adamw": 16, "sgd": 8}
# auto: the steps after which the cut is made again from the stages' measured times, and the least gain in the
# slowest stage's time a new cut must promise (below it, the measurement's noise would move layers to and fro)
RECUT_STEPS = 2
RECUT_GAIN = 0.03


@dataclass
class Plan:
    """What every rank decides alike before the process group: the mesh, the cut, each replica's rows."""

    mesh: pp.Mesh
    cut: pp.Cut
    weights: list[float]
    kinds: list[tuple[str, str]]  # each rank's (device kind, torch device type)
    replica_rows: list[int]
    block_seconds: list[list[float]] | None = None  # auto: each rank's measured seconds per part (pre, blocks, post)
    block_param_bytes: list[int] = field(default_factory=list)
    activation_bytes: list[int] = field(default_factory=list)  # per part, one micro-batch
    caps: list[int | None] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)  # cut_stages's memory arguments, for a re-cut

    def cut_for(self, parts_cost: list[list[float]]) -> tuple[pp.Cut, pp.Cut]:
        """(the best cut for per-rank part costs, the current cut at those costs)."""
        block_costs, fixed = pp.split_costs(_costs(self.weights, self.mesh, parts_cost))
        return (pp.cut_stages(block_costs, fixed, **self.limits),
                pp.fixed_cut(self.cut.bounds, block_costs, fixed))


def _rank_kind(state: Any) -> tuple[str, str]:
    """The rank's kind for the groups' backends: its device (backend and model: two simulated models are two
    vendors, as two real ones) and where torch keeps its tensors."""
    opened = state.opened
    return f"{opened.backend.name}:{opened.info.vendor}:{opened.info.name}", state.device.device.type


def _micro_rows(cfg: Any, dp: int) -> int:
    return max(1, cfg.batch // (cfg.micro_batches * dp))


def _measure(cfg: Any, state: Any, rows: int) -> tuple[list[float], list[int], list[int]]:
    """This rank's forward + backward seconds per part of the task's model on one micro-batch (on a throwaway copy
    placed as the run places it), the parts' parameter bytes and saved activation bytes."""

    model = build_model(state.task).to(state.device.device)
    if state.ops is not None:
        offload_linears(model, state.ops)
    blocks, pre, post = pipeline_parts(model)
    parts = pp.Parts(blocks, pre, post)
    x, _ = make_batch(state.task, 0, 0, rows)

    def clock(fn: Callable[[], Any]) -> float:
        import time

        if state.ops is not None:
            state.ops.reset()
        t0 = time.perf_counter()
        fn()
        return step_seconds(state.ops, time.perf_counter() - t0)

    seconds, acts = pp.measure_parts(parts, x.to(state.device.device), clock=clock)
    if state.ops is not None:
        state.ops.reset()
    sizes = [pp.parameter_bytes(m) for m in (pre, *blocks, post)]
    return seconds, sizes, acts


def _costs(plan_weights: list[float], mesh: pp.Mesh, parts_cost: list[list[float]]) -> list[list[float]]:
    """Each stage's cost of each part: with measured seconds per rank, the stage's ranks' rates added; with a
    proxy cost per part (one list), that over the stage's weights added."""
    if len(parts_cost) > 1:
        return pp.stage_costs(mesh, parts_cost)
    return [[c / sum(plan_weights[r] for r in mesh.stage_ranks(s)) for c in parts_cost[0]] for s in range(mesh.pp)]


def make_plan(cfg: Any, world: Any, state: Any, share: float) -> Plan:
    """Collective (mpi4py world): the cut and the replicas' rows. Raises PipelineError where none fits."""
    mesh = pp.mesh_for(world.size, cfg.pp, cfg.tp)
    seconds, sizes, acts = _measure(cfg, state, _micro_rows(cfg, mesh.dp))
    every = world.allgather(seconds if cfg.weights.kind == "auto" else None)
    if cfg.weights.kind == "auto":
        weights = [1.0 / max(sum(s), 1e-12) for s in every]
        parts_cost = every
    else:
        weights = resolve_weights(cfg, world, state.profile, lambda: 1.0)
        with torch.device("meta"):
            blocks, pre, post = pipeline_parts(build_model(state.task))
        parts_cost = [[float(pp.matmul_parameters(m)) for m in (pre, *blocks, post)]]
    if any(w <= 0 for w in weights):
        raise pp.PipelineError(f"--pp: every rank holds a stage and computes its rows, and the weights "
                               f"{weights} give rank {min(r for r, w in enumerate(weights) if w <= 0)} none")
    block_costs, fixed = pp.split_costs(_costs(weights, mesh, parts_cost))
    blocks = len(sizes) - 2
    memory = world.allgather(state_memory_bytes(state))
    # a stage's state is cut over its tensor ranks (tp): its cap, tp times its least rank's memory
    caps = [None if any(memory[r] is None for r in mesh.stage_ranks(s))
            else min(memory[r] for r in mesh.stage_ranks(s)) * mesh.tp for s in range(mesh.pp)]
    per = STATE_BYTES.get(cfg.optimizer, 16) / 4.0 * share
    block_bytes = [int(b * per) for b in sizes[1:-1]]
    fixed_bytes = [int(sizes[0] * per) * (s == 0) + int(sizes[-1] * per) * (s == mesh.pp - 1)
                   + (acts[0] if s == 0 else 0) + (acts[-1] if s == mesh.pp - 1 else 0) for s in range(mesh.pp)]
    flights = [pp.in_flight(cfg.schedule, s, mesh.pp, cfg.micro_batches) for s in range(mesh.pp)]
    limits = {"block_bytes": block_bytes, "act_bytes": acts[1:-1], "fixed_bytes": fixed_bytes, "caps": caps,
              "flights": flights}
    if cfg.weights.kind == "even":
        cut = pp.fixed_cut(pp.even_cut(blocks, mesh.pp), block_costs, fixed)
    else:
        cut = pp.cut_stages(block_costs, fixed, **limits)
    rows = _replica_rows(cfg, mesh, cut, weights, parts_cost)
    kinds = [tuple(k) for k in world.allgather(_rank_kind(state))]
    problem = pp.group_backend_problem(cfg.group_backend, kinds)
    if problem:
        raise pp.PipelineError(problem)
    return Plan(mesh, cut, weights, kinds, rows, every if cfg.weights.kind == "auto" else None, sizes, acts, caps,
                limits)


def _replica_rows(cfg: Any, mesh: pp.Mesh, cut: pp.Cut, weights: list[float],
                  parts_cost: list[list[float]]) -> list[int]:
    """Each replica's rows, whole micro-batches of equal size, shared by its speed (pp.pipeline_rows); a proxy cost
    per part (one list) is each rank's over its weight."""
    every = parts_cost if len(parts_cost) > 1 else [[c / w for c in parts_cost[0]] for w in weights]
    return pp.pipeline_rows(mesh, cut, every, cfg.micro_batches, cfg.batch)


def stage_tensor_weights(mesh: pp.Mesh, weights: Sequence[float], stage: int) -> list[float]:
    """--tp: a stage's cut over its tensor ranks, alike in every replica (data parallelism needs their slices
    alike): tensor rank t's weights over the stage's replicas summed."""
    return [sum(weights[r] for r in mesh.dp_ranks(stage, t)) for t in range(mesh.tp)]


class Pipelined(Parallel):
    """--pp: this rank's stage of its replica's pipeline, data parallel with the stage's other replicas by the
    strategy (ddp, fsdp2, fsdp) over the stage's group."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        cfg, plan = ctx.cfg, ctx.state.plan
        mesh, rank = plan.mesh, dist.get_rank()
        self.ctx, self.plan = ctx, plan
        self.dp_class = strategy("torch", cfg.strategy).applier()
        needs_hetbench = ("dp",) if _needs_hetbench(self.dp_class) else ()
        self.groups = pp.make_groups(mesh, plan.kinds, cfg.group_backend, needs_hetbench)
        self.stage, self.replica, self.t = mesh.stage_of(rank), mesh.replica_of(rank), mesh.tp_of(rank)
        self.pp_info, self.dp_info = pp.group_of(self.groups, rank, "pp"), pp.group_of(self.groups, rank, "dp")
        self.tp_info = pp.group_of(self.groups, rank, "tp") if mesh.tp > 1 else None
        self.pp_group, self.dp_group = self.pp_info.group, self.dp_info.group
        self.cut_tp: Any = None  # --tp: the stage's layers cut over its tensor ranks (hetbench/pytorch/tensor.py)
        # auto: the cut made again from the stages' measured times after each of the first steps (the probe before
        # the run measured each part alone; the machine's speed moves between it and the run)
        # (not with tp: a rank's measured time is its slices', which the parts' costs do not model)
        movable = (mesh.dp == 1 or not self.dp_class.stage_state_problem()) and mesh.tp == 1
        self.recuts_left = RECUT_STEPS if plan.block_seconds is not None and movable else 0
        self.recuts: list[dict[str, Any]] = []
        self.first_layers = plan.cut.counts
        self._last: tuple[float, ...] = ()  # this rank's last step: its compute per micro-batch
        self._skip_next = True
        self._build(model)
        super().__init__(self.pipe.module, ctx)

    def _build(self, model: torch.nn.Module) -> None:
        """This rank's stage of the plan's cut, taken from `model` (the whole task model, freshly made)."""
        cfg, ctx, mesh = self.ctx.cfg, self.ctx, self.plan.mesh
        blocks, pre, post = pipeline_parts(model)
        parts = pp.parts_of(model, blocks, pre, post)
        self.inner_parallel: Parallel | None = None

        def wrap(stage_module: torch.nn.Module) -> torch.nn.Module:
            if mesh.tp > 1:  # the stage's layers cut over its tensor ranks, alike in every replica
                self.cut_tp = tpl.tensor_parallel(stage_module, tensor_plan(stage_module), self.tp_info.group,
                                                  stage_tensor_weights(mesh, self.plan.weights, self.stage))
            if mesh.dp == 1:
                return stage_module
            dp_weights = [self.plan.weights[r] for r in mesh.dp_ranks(self.stage, self.t)]
            self.inner_parallel = self.dp_class.for_stage(stage_module, ApplyContext(cfg, ctx.world, ctx.state,
                                                                                     dp_weights, group=self.dp_group))
            return self.inner_parallel.module

        batch = cfg.batch

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return output_row_losses(out, y).float().sum() / batch

        self.pipe = pp.Pipeline(parts, loss_fn, self.plan.cut, self.stage, self.pp_group, ctx.state.device.device,
                                cfg.schedule, cfg.micro_batches, wrap=wrap if mesh.dp > 1 or mesh.tp > 1 else None,
                                clock=_device_clock(ctx.state.ops), autocast=_autocast(cfg, ctx.state.device.device),
                                group_name=self.pp_info.name)
        self.module = self.pipe.module

    def after_step(self, step: int, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
        """Collective, auto weights, after each of the run's first steps but the first (torch's stages infer their
        messages' shapes in it): every rank's part costs scaled by its stage's measured compute over the planned,
        the best cut for them; where it beats the current one by RECUT_GAIN, the stages are made again on it, the
        state moved (every stage's gathered on every rank), and the new optimizer returned."""
        if self.recuts_left <= 0 or step + 1 >= self.ctx.cfg.steps:  # none after the last step: no step would use it
            return None
        if self._skip_next:  # the stages' first step: torch's shape inference is in its times
            self._skip_next = False
            return None
        self.recuts_left -= 1
        measured = [None] * dist.get_world_size()
        dist.all_gather_object(measured, self._last)
        scaled = []
        for r, row in enumerate(self.plan.block_seconds):
            planned = sum(row[i] for i in _stage_parts(self.plan, self.plan.mesh.stage_of(r)))
            scaled.append([c * measured[r][0] / planned for c in row] if measured[r] and planned > 0 else row)
        best, current = self.plan.cut_for(scaled)
        if best.bounds == current.bounds or max(best.stage_seconds) > max(current.stage_seconds) * (1 - RECUT_GAIN):
            return None
        full = self._everything(optimizer)
        self.plan.cut, self.plan.block_seconds = best, scaled
        self.recuts.append({"after_step": step, "layers": best.counts})
        model = build_model(self.ctx.state.task).to(self.ctx.state.device.device)
        if self.ctx.state.ops is not None:
            offload_linears(model, self.ctx.state.ops)
        sent = self.pipe.sent_bytes
        self._build(model)
        self.pipe.sent_bytes.update(sent)  # the new stage's count goes on from the old one's
        self._skip_next = True
        new = _same_optimizer(optimizer, self.module.parameters())
        self.resume(_Held(full), new)
        return new

    def _everything(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Collective: the whole model's parameters and optimizer state (every stage's, replica 0's) on every rank,
        in state.pt's form."""
        whole = self.cut_tp.whole if self.cut_tp is not None else None
        model, state = _stage_optimizer_state(self.module, optimizer, self.pipe.inner.model_names, whole)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, (model, state) if self.replica == 0 and self.t == 0 else None)
        full: dict[str, Any] = {"model": {}, "optim": {"state": {}, "param_groups": None}}
        for part in every:
            if part is not None:
                full["model"].update(part[0])
                full["optim"]["state"].update(part[1])
        return full

    @staticmethod
    def check(cfg: Any, world: Any, state: Any, layouts: list[Any]) -> list[str]:
        """Collective: the plan (the cut, every replica's rows), made alike on every rank; its refusal in one
        line."""
        dp_class = strategy("torch", cfg.strategy).applier()
        if world.size > cfg.pp and dp_class.stage_problem():
            return [dp_class.stage_problem()]
        kept = dp_class.stage_state_problem() if world.size > cfg.pp else None
        if kept and (cfg.checkpoint is not None or cfg.resume is not None):
            flag = "--checkpoint" if cfg.checkpoint is not None else "--resume"
            return [f"{flag} with --pp and --strategy {cfg.strategy}: {kept} (accepted with --pp and more ranks "
                    "than stages: ddp, fsdp2)"]
        try:
            state.plan = make_plan(cfg, world, state, dp_class.state_share(world.size // max(cfg.pp, 1)))
        except pp.PipelineError as e:
            return [str(e)]
        return []

    def rows(self, counts: list[int], rank: int) -> tuple[int, int]:
        rows = self.plan.replica_rows
        start = sum(rows[:self.replica])
        return start, start + rows[self.replica]

    def step(self, one_step: Callable[..., Any], x: torch.Tensor, y: torch.Tensor) -> Any:
        def backward(scale: float) -> torch.Tensor:
            self.pipe.loss_scale = scale
            losses = self.pipe.step(x if self.pipe.is_first else None, y if self.pipe.is_last else None)
            if self.inner_parallel is not None:
                self.inner_parallel.finish_backward()
            # a last stage's tensor ranks each compute the loss: the first reports it (the step line sums the parts)
            return torch.stack(losses).sum() if losses and self.t == 0 else torch.zeros(())

        return one_step(self.module, x, y, backward=backward)

    def attach(self, logger: Any) -> None:
        self.pipe.times.take()
        logger.rank_figures = self._step_figures
        if self.cut_tp is not None:
            self.cut_tp.take_figures()
        for info in (self.pp_info, self.dp_info):
            pg = hetbench_group(info.group)
            if pg is not None and len(info.ranks) > 1:
                pg.split_idle = True  # its collectives' idle time apart from their transfers, as the world's
                pg.metrics.take()
                logger.groups[info.name] = pg

    def _step_figures(self) -> dict[str, Any]:
        forward, backward, schedule = self.pipe.times.take()
        self._last = ((sum(forward) + sum(backward)) / self.pipe.microbatches,)
        # --tp: its collectives run inside the stage's forward and backward
        tp = self.cut_tp.take_figures().step_figures() if self.cut_tp is not None else {}
        return {"stage": self.stage, "stage_forward_seconds": sum(forward), "stage_backward_seconds": sum(backward),
                "schedule_seconds": sum(schedule),
                "microbatch_forward_seconds": forward, "microbatch_backward_seconds": backward, **tp}

    def _stage_state(self) -> dict[str, torch.Tensor]:
        """Collective over the stage's groups: its parameters, whole, under the model's names (CPU)."""
        inner = self.pipe.inner
        full = self.inner_parallel.group_state() if self.inner_parallel is not None else None
        if full is None:
            full = {n: p.detach().cpu().clone() for n, p in inner.named_parameters()}
        if self.cut_tp is not None:  # the tensor ranks' slices made whole (at the dp group's first rank: replica 0)
            full = {k: self.cut_tp.whole(k, v).clone() for k, v in full.items()} if self.replica == 0 else {}
        return {inner.model_names[k]: v for k, v in full.items()}

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: every stage's parameters (replica 0's) gathered at rank 0 under the model's names."""
        mine = self._stage_state()
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine if self.replica == 0 and self.t == 0 else None)
        if dist.get_rank() != ROOT:
            return None
        out: dict[str, torch.Tensor] = {}
        for part in every:
            out.update(part or {})
        return out


    def shares(self, counts: list[int]) -> list[int]:
        """Each rank's rows: its replica's."""
        return [self.plan.replica_rows[self.plan.mesh.replica_of(r)] for r in range(len(counts))]

    def manifest(self) -> dict[str, Any]:
        return {"pp": self.plan.mesh.pp, "dp": self.plan.mesh.dp, "tp": self.plan.mesh.tp,
                "schedule": self.pipe.schedule_name,
                "micro_batches": self.pipe.microbatches, "stage_bounds": list(self.plan.cut.bounds)}

    def save(self, saver: Any, steps_done: int, optimizer: torch.optim.Optimizer) -> None:
        """Collective: the whole model and optimizer state (every stage's, replica 0's) written at rank 0 as one
        state.pt, the form a ddp or fsdp2 run saves, so that any strategy and any cut resumes it."""
        full = self._everything(optimizer)
        saver.save(steps_done, [], root_files=writer(full) if dist.get_rank() == ROOT else None)

    def resume(self, checkpoint: Any, optimizer: torch.optim.Optimizer) -> None:
        """Collective: each stage takes its parameters and their optimizer state from the whole model's."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        full = checkpoint._full()
        names = self.pipe.inner.model_names
        model = {k: full["model"][v] for k, v in names.items()}
        state = {k: full["optim"]["state"][v] for k, v in names.items() if v in full["optim"]["state"]}
        if self.cut_tp is not None:  # this tensor rank's slices of the whole
            model = self.cut_tp.local_state(model)
            state = self.cut_tp.local_optimizer_state(state)
        optim = {"state": state, "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                                   "params": list(names)} for g in optimizer.param_groups]}
        set_state_dict(self.module, optimizer, model_state_dict=model, optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
        checkpoint._state = None

    def details(self, optimizer: torch.optim.Optimizer, logs: list[Any], mine: list[dict[str, Any]]) -> dict[str, Any]:
        """The rank's stage: its blocks, its parameter bytes, its compute per micro-batch over the timed steps."""
        self._mine = mine
        inner, cut, mbs = self.pipe.inner, self.plan.cut, self.pipe.microbatches
        skip = min(int(self.ctx.cfg.warmup_steps), max(len(mine) - 1, 0))
        per_mb = [(m["stage_forward_seconds"] + m["stage_backward_seconds"]) / mbs for m in mine]
        return {"stage": self.stage, "replica": self.replica, "stage_layers": len(inner.block_indices),
                "stage_blocks": [inner.block_indices[0], inner.block_indices[-1] + 1],
                "stage_param_bytes": sum(self.plan.block_param_bytes[i] for i in _stage_parts(self.plan, self.stage)),
                "microbatch_compute_seconds": per_mb[skip:],
                "microbatch_forward_seconds": [m["stage_forward_seconds"] / mbs for m in mine][skip:],
                "microbatch_backward_seconds": [m["stage_backward_seconds"] / mbs for m in mine][skip:],
                "step_seconds": [log.step_seconds for log in logs][skip:],
                "schedule_seconds": [m["schedule_seconds"] for m in mine][skip:],
                "recuts": self.recuts, "first_layers": self.first_layers,
                "tp_units": [x.counts[self.t] for x in self.cut_tp.layers] if self.cut_tp is not None else None,
                "pipeline": {"pp": self.plan.mesh.pp, "dp": self.plan.mesh.dp, "tp": self.plan.mesh.tp,
                             "schedule": self.pipe.schedule_name,
                             "micro_batches": self.pipe.microbatches, "bounds": list(cut.bounds),
                             "planned_stage_cost": list(cut.stage_seconds), "replica_rows": self.plan.replica_rows,
                             "auto_part_seconds": self.plan.block_seconds,
                             "groups": [{"name": g.name, "ranks": g.ranks, "backend": g.backend}
                                        for g in self.groups]},
                "group_bytes": self._group_bytes()}

    def _group_bytes(self) -> dict[str, int]:
        """The bytes this rank sent over each of its groups in the steps: the pipeline's P2P (counted by the
        stage), and its stage's collectives where the hetbench backend carried them (Gloo keeps no figures)."""
        out = dict(self.pipe.sent_bytes)
        name = self.groups[self.plan.mesh.dp + self.stage].name
        steps = [m.get("group_collectives", {}).get(name, {}) for m in self._mine]
        if any(steps):
            out[name] = sum(o["bytes"] for step in steps for o in step.values())
        return out

    @staticmethod
    def summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
        return {"pipeline": pipeline_summary(gathered)}


def _autocast(cfg: Any, device: torch.device) -> Callable[[], Any] | None:
    """Mixed precision (--dtype fp16/bf16): each stage's forward and the loss under torch's autocast, as the
    one-process reference runs the whole model's (run._autocast); fp32: None."""
    if cfg.dtype.name == "fp32":
        return None
    dtype = torch.float16 if cfg.dtype.name == "fp16" else torch.bfloat16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def _device_clock(ops: Any) -> Callable[[], float]:
    """The stage's clock: wall time, except that on a simulated device the modelled GEMM and copy time replaces the
    host's emulating them (offload.step_seconds, read as a running clock)."""
    import time

    if ops is None or not ops.modelled:
        return time.perf_counter
    return lambda: time.perf_counter() - ops.wall_seconds + ops.compute_seconds + ops.copy_seconds


def _same_optimizer(optimizer: torch.optim.Optimizer, params: Any) -> torch.optim.Optimizer:
    """An optimizer of `optimizer`'s kind and settings over `params` (its defaults that its constructor takes:
    AdamW keeps one in them that it does not)."""
    accepted = inspect.signature(type(optimizer)).parameters
    return type(optimizer)(params, **{k: v for k, v in optimizer.defaults.items() if k in accepted})


class _Held:
    """A whole state at hand, read as a checkpoint is (Pipelined.resume)."""

    def __init__(self, full: dict[str, Any]) -> None:
        self.full, self._state = full, None

    def _full(self) -> dict[str, Any]:
        return self.full


def _stage_parts(plan: Plan, stage: int) -> list[int]:
    """The part indices stage `stage` holds under the plan's cut."""
    return pp.stage_parts(plan.cut, stage)


def _needs_hetbench(dp_class: Any) -> bool:
    """Whether the data-parallel strategy runs on the hetbench backend alone (hetbench's fsdp: MPI underneath)."""
    return dp_class.group_backends() == ("hetbench",)


def _stage_optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, names: dict[str, str],
                           whole: Callable[[str, torch.Tensor], torch.Tensor] | None = None
                           ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Collective over the stage's groups: its parameters and optimizer state whole (CPU), under the model's
    names; `whole(name, tensor)` (--tp, collective over the tensor ranks) makes a slice whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    def done(name: str, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().cpu()
        return (whole(name, t) if whole is not None and t.dim() > 0 else t).clone()

    model_sd, optim_sd = get_state_dict(module, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=False))
    model = {names[k]: done(k, v) for k, v in model_sd.items()}
    state = {names[k]: {n: (done(k, t) if isinstance(t, torch.Tensor) else t) for n, t in v.items()}
             for k, v in optim_sd.get("state", {}).items()}
    return model, state


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def pipeline_summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
    """Per stage: its ranks, blocks, parameter bytes, compute per micro-batch (the median over the timed steps,
    the slowest of its ranks), its measured idle share of the schedule (1 - its busy seconds over the schedule's
    span), beside the schedule's theory for equal stages, and the schedule modelled from the stages' measured
    times against the schedule and the step measured; the groups, their ranks, backends and bytes."""
    d = [g.details for g in gathered]
    info = d[ROOT]["pipeline"]
    stages, mbs = info["pp"], info["micro_batches"]
    step = _median([max(v) for v in zip(*(x["step_seconds"] for x in d))]) if d[ROOT]["step_seconds"] else 0.0
    # the schedule's span, each step's slowest rank's: the bubble is the schedule's (the optimizer's step is not)
    span = _median([max(v) for v in zip(*(x["schedule_seconds"] for x in d))]) if d[ROOT]["schedule_seconds"] else 0.0
    per_stage, forward, backward = [], [], []
    for s in range(stages):
        mine = [x for x in d if x["stage"] == s]
        # the stage's slowest rank, by its forward + backward (both its own: its replicas wait for none of them)
        f, b = max(((_median(x["microbatch_forward_seconds"]), _median(x["microbatch_backward_seconds"]))
                    for x in mine), key=sum)
        forward.append(f)
        backward.append(b)
        busy = mbs * (f + b)
        per_stage.append({"stage": s, "ranks": [r for r, x in enumerate(d) if x["stage"] == s],
                          "layers": mine[0]["stage_layers"], "blocks": mine[0]["stage_blocks"],
                          "param_bytes": mine[0]["stage_param_bytes"],
                          "microbatch_compute_seconds": f + b,
                          # a simulated rank's compute is its modelled GEMM and copy time
                          "timing": "modelled" if any(gathered[r].facts.get("device_timing") == "modelled"
                                                      for r, x in enumerate(d) if x["stage"] == s) else "measured",
                          "bubble_measured_fraction": 1.0 - busy / span if span > 0 else 0.0})
    modelled, idle = pp.modelled_step_seconds(info["schedule"], forward, backward, mbs)
    slowest = max(range(stages), key=lambda s: forward[s] + backward[s])
    # the plan's stage cost adds its replicas' rates (the stage's throughput); a rank takes its own micro-batch, its
    # replica's rows shared by speed, so a rank's planned time a micro-batch is dp times that
    planned = [c * info["dp"] for c in info["planned_stage_cost"]] if info.get("auto_part_seconds") else None
    predicted = (pp.modelled_step_seconds(info["schedule"], [c / 3 for c in planned], [2 * c / 3 for c in planned],
                                          mbs)[0] if planned else None)
    for x, i, c in zip(per_stage, idle, planned or [None] * stages):
        x["bubble_modelled_fraction"] = i
        x["planned_microbatch_seconds"] = c
    return {"pp": stages, "dp": info["dp"], "tp": info.get("tp", 1), "schedule": info["schedule"],
            "micro_batches": mbs,
            "stages": per_stage, "replica_rows": info["replica_rows"],
            # auto: the probe's cut, and each re-cut from the stages' measured times (the step after which)
            "first_layers": d[ROOT]["first_layers"], "recuts": d[ROOT]["recuts"],
            # the pipeline's bubble: the idle share of its slowest stage (the others idle for the imbalance too),
            # beside the schedule's at the stages' measured times, and the textbook's for equal stages
            "bubble_measured_fraction": per_stage[slowest]["bubble_measured_fraction"],
            "bubble_modelled_fraction": idle[slowest],
            "bubble_theory_fraction": pp.theoretical_bubble(stages, mbs),
            "idle_measured_fraction_mean": statistics.mean(x["bubble_measured_fraction"] for x in per_stage),
            "step_seconds_predicted": predicted, "step_seconds_modelled": modelled,
            "schedule_seconds_measured": span, "step_seconds_measured": step,
            "auto_part_seconds": info.get("auto_part_seconds"),
            "groups": [{**g, "bytes": _group_bytes(d, g["name"])} for g in info["groups"]]}


def _group_bytes(details: list[dict[str, Any]], name: str) -> int | None:
    """The bytes a group's ranks sent in the steps, None where none was measured (Gloo keeps no figures)."""
    sent = [x["group_bytes"][name] for x in details if name in x["group_bytes"]]
    return sum(sent) if sent else None
