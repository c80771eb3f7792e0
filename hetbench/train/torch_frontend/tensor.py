"""`hetbench train --frontend torch --tp N`: the task model tensor parallel over groups of N ranks, each rank's
columns, rows and heads of every cut layer by its weight (hetbench/pytorch/tensor.py), the groups data parallel
with each other by --strategy (a tp x dp mesh, tp innermost as torchtitan lays it out: rank r is replica r // tp,
tensor rank r % tp). Every rank of a tensor-parallel group takes its replica's rows; the replicas share the batch by
their ranks' summed weights.

The rest of train is as for any strategy: the step lines (with each rank's seconds in tp's collectives), the check
against one process, the checkpoint (the whole model and optimizer state at rank 0 as state.pt, the form ddp and
fsdp2 save, so that any strategy and any tp weights resume it) and the resume.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from hetbench.harness.split_plan import shares as split_shares
from hetbench.pytorch.pipeline import GroupInfo, group_backend_problem, groups_for
from hetbench.pytorch import tensor as tpl
from hetbench.train.outcome import ROOT, RankOutcome
from hetbench.train.strategies import get as strategy
from hetbench.train.torch_frontend.checkpoint import writer
from hetbench.pytorch.logger import hetbench_group
from hetbench.train.torch_frontend.models import build_model, row_losses, tensor_plan
from hetbench.train.torch_frontend.parallel import ApplyContext, Parallel, autocast
from hetbench.train.torch_frontend.torch_tp import torch_tensor_parallel
from hetbench.pytorch.offload import offload_linears, step_seconds
from hetbench.train.torch_frontend.pipeline import (
    RECUT_GAIN,
    RECUT_STEPS,
    _Held,
    _rank_kind,
    _same_optimizer,
    _stage_optimizer_state,
)


@dataclass(frozen=True)
class TPMesh:
    """tp x dp ranks, tp innermost: rank r is replica r // tp, tensor rank r % tp."""

    tp: int
    dp: int

    def replica_of(self, rank: int) -> int:
        return rank // self.tp

    def tp_index(self, rank: int) -> int:
        return rank % self.tp

    def tp_ranks(self, replica: int) -> list[int]:
        return [replica * self.tp + t for t in range(self.tp)]

    def dp_ranks(self, t: int) -> list[int]:
        return [j * self.tp + t for j in range(self.dp)]


def make_tp_groups(mesh: TPMesh, kinds: Sequence[tuple[str, str]], choice: str = "auto",
                   hetbench_only: Sequence[str] = ()) -> list[GroupInfo]:
    """Collective over the world: every replica's tensor-parallel group ("tp j") and every tensor rank's
    data-parallel group ("dp t"), alike on every rank, each on its native backend where one serves all its ranks
    (auto), else hetbench's (pipeline.make_groups's rule)."""
    problem = group_backend_problem(choice, kinds)
    if problem:
        raise tpl.TensorParallelError(problem)
    specs = [(f"tp {j}", "tp", mesh.tp_ranks(j)) for j in range(mesh.dp)]
    specs += [(f"dp {t}", "dp", mesh.dp_ranks(t)) for t in range(mesh.tp)]
    return groups_for(specs, kinds, choice, hetbench_only)


def tensor_weights(mesh: TPMesh, weights: Sequence[float]) -> list[float]:
    """Each tensor rank's weight for the cut, the same in every replica (the replicas' slices must match for data
    parallelism over them): tensor rank t's weights summed over the replicas."""
    return [sum(weights[r] for r in mesh.dp_ranks(t)) for t in range(mesh.tp)]


def replica_rows(mesh: TPMesh, weights: Sequence[float], batch: int) -> list[int]:
    """Each replica's rows, by its speed under the common cut: a layer takes the replica as long as its slowest
    rank's share over its weight, so its speed is the least of its ranks' weight over their tensor rank's share;
    at least one row each."""
    if mesh.dp == 1:
        return [batch]
    cut = tensor_weights(mesh, weights)
    total = sum(cut)
    speeds = []
    for j in range(mesh.dp):
        ranks = mesh.tp_ranks(j)
        speeds.append(min((weights[r] / (cut[t] / total) for t, r in enumerate(ranks) if cut[t] > 0),
                          default=0.0))
    if sum(speeds) <= 0:
        speeds = [1.0] * mesh.dp
    return [c + 1 for c in split_shares(speeds, batch - mesh.dp)]


def _kinds(state: Any) -> list[tuple[str, str]]:
    """Every rank's (device kind, torch device type), gathered: what decides a group's native backend."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, _rank_kind(state))
    return [tuple(k) for k in every]


class TensorParallel(Parallel):
    """--tp: this rank's slices of the task model's layers in its replica's tensor-parallel group, data parallel
    with the other replicas' same tensor rank by the strategy (ddp, fsdp2, fsdp) over their group."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        cfg = ctx.cfg
        rank, world = dist.get_rank(), dist.get_world_size()
        self.mesh = mesh = TPMesh(cfg.tp, world // cfg.tp)
        self.dp_class = strategy("torch", cfg.strategy).applier()
        needs_hetbench = ("dp",) if self.dp_class.group_backends() == ("hetbench",) else ()
        self.groups = make_tp_groups(mesh, _kinds(ctx.state), cfg.group_backend, needs_hetbench)
        self.replica, self.t = mesh.replica_of(rank), mesh.tp_index(rank)
        self.tp_info, self.dp_info = self.groups[self.replica], self.groups[mesh.dp + self.t]
        self.tp_weights = tensor_weights(mesh, ctx.weights)
        self.replica_rows = replica_rows(mesh, ctx.weights, cfg.batch)
        if cfg.tp_impl == "torch":  # torch's own even tensor parallelism, the baseline
            self.cut: Any = _TorchCut(model, self.tp_info)
        else:
            self.cut = tpl.tensor_parallel(model, tensor_plan(model), self.tp_info.group, self.tp_weights)
        self.inner: Parallel | None = None
        self.names = {n for n, _ in model.named_parameters()}  # before a data-parallel strategy renames them
        module = model
        if mesh.dp > 1:
            dp_weights = [ctx.weights[r] for r in mesh.dp_ranks(self.t)]
            self.inner = self.dp_class.for_stage(model, ApplyContext(cfg, ctx.world, ctx.state, dp_weights,
                                                                     group=self.dp_info.group))
            module = self.inner.module
        super().__init__(module, ctx)
        self.plain = model  # the cut model under its own names (a dp wrapper's inner module)
        # auto: the cut made again from the ranks' measured compute after the first steps (the probe timed the
        # whole model on each rank alone; a slice's time in the run is what the cut must balance)
        auto = cfg.weights.kind == "auto" and cfg.tp_impl == "hetbench" and mesh.dp == 1
        self.recuts_left = RECUT_STEPS if auto else 0
        self.recuts: list[dict[str, Any]] = []
        self.first_weights = list(self.tp_weights)
        self._skip_next = True
        self._last_tp = 0.0
        self._wall = 0.0
        self._seen: list[tuple[list[float], list[float]]] = []  # (each rank's share, its compute) at each check

    @staticmethod
    def check(cfg: Any, world: Any, state: Any, layouts: list[Any]) -> list[str]:
        """Collective: the plan cuts the task model over --tp ranks (a head count below the tp degree refused);
        the data-parallel strategy can run over the replicas."""
        with torch.device("meta"):
            meta = build_model(state.task)
        problems = tpl.plan_problems(meta, tensor_plan(meta), cfg.tp)
        if problems:
            return [f"--tp {cfg.tp}: {problems[0]}"]
        dp_class = strategy("torch", cfg.strategy).applier()
        if world.size > cfg.tp:
            if dp_class.stage_problem():
                return [dp_class.stage_problem()]
            kept = dp_class.stage_state_problem()
            if kept and (cfg.checkpoint is not None or cfg.resume is not None):
                flag = "--checkpoint" if cfg.checkpoint is not None else "--resume"
                return [f"{flag} with --tp and --strategy {cfg.strategy}: "
                        f"{kept.replace('a pipeline stage', 'a tensor rank')} (accepted with --tp and more ranks "
                        "than --tp: ddp, fsdp2)"]
        return []

    def rows(self, counts: list[int], rank: int) -> tuple[int, int]:
        start = sum(self.replica_rows[:self.replica])
        return start, start + self.replica_rows[self.replica]

    def shares(self, counts: list[int]) -> list[int]:
        """Each rank's rows: its replica's."""
        return [self.replica_rows[self.mesh.replica_of(r)] for r in range(len(counts))]

    def step(self, one_step: Callable[..., Any], x: torch.Tensor, y: torch.Tensor) -> Any:
        """One step on the replica's rows: every tensor rank computes the replica's loss (the same number); its
        first rank reports it (the step line sums the ranks' parts), the replicas' gradients summed by the
        strategy."""

        def backward(scale: float) -> torch.Tensor:
            with autocast(self.ctx.cfg, x.device):
                loss = row_losses(self.module, x, y).float().sum() / self.ctx.cfg.batch
            (loss * scale if scale != 1.0 else loss).backward()
            if self.inner is not None:
                self.inner.finish_backward()
            return loss

        start = time.perf_counter()
        loss, scale, skipped = one_step(self.module, x, y, backward=backward)
        self._wall = time.perf_counter() - start
        return (loss if self.t == 0 else torch.zeros_like(loss)), scale, skipped

    def after_step(self, step: int, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
        """Collective, auto weights: after each of the run's first steps but the first (its first allocations and
        kernel builds), each rank's compute in the step (its step less its seconds in tp's collectives; modelled on
        a simulated device) over its share of the cut gives its rate; where the cut by those rates promises the
        slowest rank RECUT_GAIN less time, the layers are cut again (the whole state moved) and the new optimizer
        returned."""
        if self.recuts_left <= 0 or step + 1 >= self.ctx.cfg.steps:  # none after the last step: no step would use it
            return None
        if self._skip_next:
            self._skip_next = False
            return None
        self.recuts_left -= 1
        compute = max(step_seconds(self.ctx.state.ops, self._wall) - self._last_tp, 1e-9)
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, compute)
        shares = _cut_shares(self.cut)
        weights, promised = balanced_shares(shares, every, self._seen[-1] if self._seen else None)
        self._seen.append((shares, list(every)))
        now = max(every)
        if promised > now * (1 - RECUT_GAIN):
            return None
        full = self._everything(optimizer)
        self.tp_weights = weights
        model = build_model(self.ctx.state.task).to(self.ctx.state.device.device)
        if self.ctx.state.ops is not None:
            offload_linears(model, self.ctx.state.ops)
        self.cut = tpl.tensor_parallel(model, tensor_plan(model), self.tp_info.group, self.tp_weights)
        self.recuts.append({"after_step": step, "weights": list(self.tp_weights),
                            "units": {x.name: x.counts for x in self.cut.layers},
                            "compute_seconds": list(every), "promised_seconds": promised})
        self.module = self.plain = model
        new = _same_optimizer(optimizer, model.parameters())
        self.resume(_Held(full), new)
        self._skip_next = True
        return new

    def attach(self, logger: Any) -> None:
        self.cut.take_figures()
        logger.rank_figures = self._step_figures

    def _step_figures(self) -> dict[str, Any]:
        f = self.cut.take_figures()
        self._last_tp = f.seconds
        return f.step_figures()

    # -- state ---------------------------------------------------------------------------------------------------

    def _dp_whole(self) -> dict[str, torch.Tensor]:
        """Collective over the dp group: this tensor rank's parameters whole over the replicas (CPU)."""
        full = self.inner.group_state() if self.inner is not None else None
        if full is not None:
            return full
        return {n: p.detach().cpu() for n, p in self.plain.named_parameters()}

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole model's parameters at rank 0 (replica 0's tensor-parallel group gathers them)."""
        mine = self._dp_whole()
        if self.replica != 0:
            return None
        whole = {k: self.cut.whole(k, v).clone() for k, v in mine.items()} if mine else {}
        return whole if dist.get_rank() == ROOT else None

    def _everything(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Collective: the whole model's parameters and optimizer state (replica 0's), state.pt's form."""
        model, states = _stage_optimizer_state(self.module, optimizer, {n: n for n in self.names}, self.cut.whole)
        if self.replica != 0:
            return {}
        return {"model": model, "optim": {"state": states, "param_groups": None}}

    def save(self, saver: Any, steps_done: int, optimizer: torch.optim.Optimizer) -> None:
        """Collective: the whole model and optimizer state written at rank 0 as one state.pt."""
        full = self._everything(optimizer)
        saver.save(steps_done, [], root_files=writer(full) if dist.get_rank() == ROOT else None)

    def resume(self, checkpoint: Any, optimizer: torch.optim.Optimizer) -> None:
        """Collective: each rank takes its slices of the whole model's parameters and optimizer state."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        full = checkpoint._full()
        names = [n for n, _ in self.plain.named_parameters()]
        model = self.cut.local_state({k: full["model"][k] for k in names})
        state = self.cut.local_optimizer_state({k: full["optim"]["state"][k] for k in names
                                                if k in full["optim"]["state"]})
        optim = {"state": state, "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                                                   "params": list(names)} for g in optimizer.param_groups]}
        set_state_dict(self.module, optimizer, model_state_dict=model, optim_state_dict=optim,
                       options=StateDictOptions(full_state_dict=True))
        checkpoint._state = None

    def manifest(self) -> dict[str, Any]:
        return {"tp": self.mesh.tp, "dp": self.mesh.dp,
                "tp_units": {x.name: x.counts for x in self.cut.layers}}

    # -- figures -------------------------------------------------------------------------------------------------

    def details(self, optimizer: torch.optim.Optimizer, logs: list[Any], mine: list[dict[str, Any]]) -> dict[str, Any]:
        """The rank's slices: its units of each layer, the parameter bytes it holds of the cut layers and in all,
        its seconds in tp's collectives each timed step beside the step's."""
        skip = min(int(self.ctx.cfg.warmup_steps), max(len(mine) - 1, 0))
        # the cut layers' bytes it holds: its tensor rank's slices, or its data-parallel shards of them
        holder = self.inner if self.inner is not None else self
        cut_bytes = holder.param_bytes_held(set(self.cut.specs))
        return {"tp_index": self.t, "replica": self.replica,
                "tp_units": [x.counts[self.t] for x in self.cut.layers],
                "tp_cut_param_bytes": cut_bytes,
                "tp_param_bytes": holder.param_bytes_held(self.names),
                "tp_comm_seconds": [m.get("tp_comm_seconds", 0.0) for m in mine][skip:],
                "tp_comm_bytes": [m.get("tp_comm_bytes", 0) for m in mine][skip:],
                "step_seconds": [log.step_seconds for log in logs][skip:],
                "tensor": {"tp": self.mesh.tp, "dp": self.mesh.dp, "replica_rows": self.replica_rows,
                           "first_weights": self.first_weights, "recuts": self.recuts,
                           "impl": self.ctx.cfg.tp_impl,
                           "tensor_weights": self.tp_weights,
                           "layers": self.cut.summary()["layers"] if self.replica == 0 else None,
                           "groups": [{"name": g.name, "ranks": g.ranks, "backend": g.backend}
                                      for g in self.groups]}}

    @staticmethod
    def summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
        return {"tensor": tensor_summary(gathered)}


class _TorchCut:
    """--tp-impl torch: torch's parallelize_module (torch_tp.py), even, read as TensorParallel reads hetbench's
    cut; its collectives' time is the tp group's hetbench backend figures (none on Gloo)."""

    def __init__(self, model: torch.nn.Module, info: GroupInfo) -> None:
        self.tp = torch_tensor_parallel(model, info.group)
        self.pg = hetbench_group(info.group)
        if self.pg is not None:
            self.pg.metrics.take()
        self.specs = set(self.tp.styles and {n for n, _ in model.named_parameters()
                                             if n.rsplit(".", 1)[0] in self.tp.styles})
        self.layers = [tpl.Layer(name, "columns", sum(w), w) for name, w in self.tp.widths().items()]

    def take_figures(self) -> tpl.CommFigures:
        if self.pg is None:
            return tpl.CommFigures(measured=False)
        ops = self.pg.metrics.take().values()
        return tpl.CommFigures(sum(o["seconds"] + o["idle_seconds"] for o in ops), sum(o["bytes"] for o in ops),
                               sum(o["count"] for o in ops))

    def whole(self, name: str, t: torch.Tensor) -> torch.Tensor:
        return self.tp.whole(name, t)

    def summary(self) -> dict[str, Any]:
        return {"layers": [{"name": x.name, "what": x.what, "units": x.units, "counts": x.counts}
                           for x in self.layers]}


def balanced_shares(shares: Sequence[float], compute: Sequence[float],
                    before: tuple[Sequence[float], Sequence[float]] | None = None) -> tuple[list[float], float]:
    """(each rank's share that gives every rank the same compute, that compute) from each rank's compute at its
    share. A rank's compute is taken as a + b x share: with an earlier check at other shares (`before`) both are
    fitted per rank (a, its share-independent work: the whole-width parts, the loss), else a = 0 (compute
    proportional to the share). Then T = (1 + sum(a / b)) / sum(1 / b) and share = (T - a) / b; where a fit gives
    b <= 0 or a share below 0, the proportional model instead."""
    fits = None
    if before is not None and all(abs(s - p) > 1e-9 for s, p in zip(shares, before[0])):
        fits = []
        for s, c, p, q in zip(shares, compute, *before):
            b = (c - q) / (s - p)
            fits.append((max(0.0, c - b * s), b))
        if any(b <= 0 for _, b in fits):
            fits = None
    if fits is not None:
        total = (1 + sum(a / b for a, b in fits)) / sum(1 / b for _, b in fits)
        out = [(total - a) / b for a, b in fits]
        if min(out) >= 0:
            return [x / sum(out) for x in out], total
    rates = [s / max(c, 1e-12) for s, c in zip(shares, compute)]
    return [r / sum(rates) for r in rates], 1.0 / sum(rates)


def _cut_shares(cut: Any) -> list[float]:
    """Each tensor rank's share of the cut's work: its units of every cut layer over all units, weighed by the
    layers' sizes in units (a layer's columns or heads alike)."""
    totals = [0.0] * len(cut.layers[0].counts) if cut.layers else [1.0]
    whole = sum(x.units for x in cut.layers) or 1
    for x in cut.layers:
        for t, c in enumerate(x.counts):
            totals[t] += c
    return [v / whole for v in totals]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def tensor_summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
    """The mesh and its groups; each cut layer's units per rank (replica 0's group; every replica's tensor rank t
    holds the same share where the weights agree); per rank the cut layers' parameter bytes beside its weight's
    share, and its share of the step in tp's collectives (the median over the timed steps of its collectives'
    seconds over the step's)."""
    d = [g.details for g in gathered]
    info = d[ROOT]["tensor"]
    tp = info["tp"]
    cut = [x["tp_cut_param_bytes"] for x in d]
    weights = gathered[ROOT].weights
    per_rank = []
    cut_weights = info.get("tensor_weights") or weights[:tp]
    for r, x in enumerate(d):
        group = [q for q in range(len(d)) if q // tp == r // tp]
        total_w = sum(cut_weights)
        total_b = sum(cut[q] for q in group)
        measured = all(c is not None for c in x["tp_comm_seconds"])
        share = [c / s for c, s in zip(x["tp_comm_seconds"], x["step_seconds"]) if s > 0] if measured else []
        per_rank.append({"rank": r, "replica": x["replica"], "tp_index": x["tp_index"], "units": x["tp_units"],
                         "cut_param_bytes": cut[r],
                         "cut_param_percent": 100.0 * cut[r] / total_b if total_b else 0.0,
                         # the cut's weight for this tensor rank (its weights over the replicas summed)
                         "weight_percent": 100.0 * cut_weights[r % tp] / total_w if total_w else 0.0,
                         "param_bytes": x["tp_param_bytes"],
                         # None where the group's backend keeps no figures (torch's own tp over Gloo)
                         "tp_comm_seconds_median": _median(x["tp_comm_seconds"]) if measured else None,
                         "tp_comm_bytes_per_step": (x["tp_comm_bytes"][-1] if x["tp_comm_bytes"] else 0) if measured
                         else None,
                         "tp_comm_step_fraction": _median(share) if measured else None,
                         # a simulated rank's step is its modelled GEMM and copy time (its collectives' measured)
                         "timing": gathered[r].facts.get("device_timing", "measured")})
    layers = info["layers"] or []
    return {"tp": tp, "dp": info["dp"], "impl": info.get("impl", "hetbench"), "replica_rows": info["replica_rows"],
            "groups": info["groups"],
            "tensor_weights": info.get("tensor_weights"), "layers": layers, "ranks": per_rank,
            # auto: the probe's cut weights, and each re-cut from the ranks' measured compute (the step after which)
            "first_weights": info.get("first_weights"), "recuts": info.get("recuts") or [],
            # a rank whose weight rounds to no unit of a layer holds none of it
            "empty_layers_per_rank": [[x["name"] for x in layers if x["counts"][t] == 0] for t in range(tp)],
            "tp_comm_step_fraction_max": (None if any(x["tp_comm_step_fraction"] is None for x in per_rank)
                                          else max((x["tp_comm_step_fraction"] for x in per_rank), default=0.0))}
