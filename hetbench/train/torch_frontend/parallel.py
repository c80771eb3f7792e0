"""The torch front end's strategies, each the class its Strategy record names (`apply`): made with the plain model
and the run's context, it makes the model parallel (as torchtitan's apply_ddp / apply_fsdp) and answers what the
step loop asks of it: the module to train, the resume, the checkpoint's pieces, the full state, its own figures.

A strategy from another package subclasses Parallel (the defaults suit one whose every rank holds the whole model)
and registers a Strategy naming it (hetbench/train/strategies.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hetbench.pytorch.fsdp import STATE_BYTES_PER_ELEMENT, ShardedModule, numel
from hetbench.pytorch.logger import hetbench_group
from hetbench.pytorch.pipeline import sum_gradients_over
from hetbench.pytorch.uneven import exact_ddp, exact_fully_shard, rank_mesh
from hetbench.train.outcome import ROOT, RankOutcome
from hetbench.train.torch_frontend.checkpoint import full_state, shard_pieces, writer
from hetbench.train.torch_frontend.models import units


@dataclass
class ApplyContext:
    """What a strategy is applied with: the run's configuration, the rank's world and state, the weights."""

    cfg: Any
    world: Any
    state: Any  # run.TorchTrainState
    weights: list[float]
    group: Any = None  # the data-parallel group (None: the world); a pipeline's stage has its own


class Parallel:
    """A model made parallel by a torch strategy; this base keeps it whole on every rank (no wrapping)."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        self.module = model
        self.ctx = ctx

    @staticmethod
    def check(cfg: Any, world: Any, state: Any, layouts: list[Any]) -> list[str]:
        """Collective, before the process group: what the strategy needs of the ranks (the model's flat units'
        `layouts` at hand); every rank finds the same."""
        return []

    def attach(self, logger: Any) -> None:
        """Hook the strategy's own step figures into the step logger."""

    @staticmethod
    def state_share(ranks: int) -> float:
        """The share of the model's training state one of `ranks` data-parallel ranks holds (whole: 1)."""
        return 1.0

    @staticmethod
    def group_backends() -> tuple[str, ...] | None:
        """The torch backends its data-parallel group can run on (None: any)."""
        return None

    @staticmethod
    def stage_problem() -> str | None:
        """Why the strategy cannot run over a pipeline stage's replicas, or None."""
        return None

    @staticmethod
    def stage_state_problem() -> str | None:
        """Why a pipeline cannot save, resume or re-cut the strategy's state over a stage's replicas, or None."""
        return None

    @classmethod
    def for_stage(cls, module: torch.nn.Module, ctx: ApplyContext) -> "Parallel":
        """The strategy over a pipeline stage's replicas (ctx.group): by default as over a whole model."""
        return cls(module, ctx)

    def after_step(self, step: int, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
        """Collective, after each step: a new optimizer where the strategy made its module again (a pipeline's
        re-cut), else None."""
        return None

    def finish_backward(self) -> None:
        """Collective over its group, after a pipeline step's last micro-batch: what its backward left to do."""

    def group_state(self) -> dict[str, torch.Tensor] | None:
        """Collective over its group: the module's parameters whole (CPU), under the plain module's names, where
        the strategy shards them; None where every rank holds them whole."""
        return None

    def param_bytes_held(self, names: set[str]) -> int:
        """The bytes this rank holds of the module's parameters named (their shards where the strategy shards
        them)."""
        return sum(local_bytes(p) for n, p in self.module.named_parameters() if n in names)

    def shares(self, counts: list[int]) -> list[int]:
        """Each rank's rows of the batch, for its row and the summary."""
        return list(counts)

    def rows(self, counts: list[int], rank: int) -> tuple[int, int]:
        """This rank's rows [start, stop) of the step's batch, from every rank's count."""
        start = sum(counts[:rank])
        return start, start + counts[rank]

    def step(self, one_step: Callable[..., Any], x: torch.Tensor, y: torch.Tensor) -> Any:
        """One training step on this rank's rows: `one_step(module, x, y)` (forward, backward, the update) for a
        strategy whose module runs the whole model; a pipeline runs its schedule instead."""
        return one_step(self.module, x, y)

    def resume(self, checkpoint: Any, optimizer: torch.optim.Optimizer) -> None:
        """Collective: load the checkpoint's state into the model and optimizer."""
        checkpoint.load_into(self.module, optimizer)

    def manifest(self) -> dict[str, Any]:
        """The strategy's own entries in a checkpoint's manifest."""
        return {}

    def live_manifest(self, optimizer_steps: int) -> dict[str, Any]:
        """The strategy's own entries in a checkpoint's manifest, read at each save."""
        return {}

    def save(self, saver: Any, steps_done: int, optimizer: torch.optim.Optimizer) -> None:
        """Collective: one checkpoint; the full state gathered, written at rank 0."""
        full_now = full_state(self.module, optimizer)  # collective: every rank takes part in the gather
        saver.save(steps_done, [], root_files=writer(full_now) if dist.get_rank() == ROOT else None)

    def close(self) -> None:
        """After the last step."""

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: the model's full parameters (CPU) at rank 0, None elsewhere."""
        if dist.get_rank() != ROOT:
            return None
        return {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()}

    def details(self, optimizer: torch.optim.Optimizer, logs: list[Any], mine: list[dict[str, Any]]) -> dict[str, Any]:
        """The strategy's own facts for the rank's outcome (its StepLogs may take figures from the logger's
        `mine`)."""
        return {}

    def finish_lines(self, lines: list[dict[str, Any]]) -> None:
        """Rank 0: add the strategy's own figures to the step lines."""

    @staticmethod
    def summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
        """The strategy's own figures in the job's summary."""
        return {}


class Replicated(Parallel):
    """ddp: torch's DistributedDataParallel, gradients summed so that uneven batch shares are exact."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        super().__init__(exact_ddp(model, process_group=ctx.group), ctx)

    def full_state(self) -> dict[str, torch.Tensor] | None:
        if dist.get_rank() != ROOT:
            return None
        return {k: v.detach().cpu().clone() for k, v in self.module.module.state_dict().items()}

    @classmethod
    def for_stage(cls, module: torch.nn.Module, ctx: ApplyContext) -> Parallel:
        """A stage's replicas: the plain module, its gradients summed over the group once the schedule's
        micro-batches are done (DDP's no_sync accumulation under torch's schedules gave wrong gradients from the
        second micro-batch on, torch 2.13)."""
        return SummedReplica(module, ctx)


class SummedReplica(Parallel):
    """ddp over a pipeline stage's replicas: every gradient summed over the group in one flat all-reduce."""

    def finish_backward(self) -> None:
        sum_gradients_over(self.module.parameters(), self.ctx.group)


class FullyShard(Parallel):
    """fsdp2: torch's fully_shard over each unit, then the root, gradients summed."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        exact_fully_shard(model, units(model), mesh=rank_mesh(model, ctx.group))
        super().__init__(model, ctx)

    @staticmethod
    def state_share(ranks: int) -> float:
        return 1.0 / ranks

    def group_state(self) -> dict[str, torch.Tensor] | None:
        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=False))
        return {k: v.detach().cpu().clone() for k, v in full.items()}

    def full_state(self) -> dict[str, torch.Tensor] | None:
        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().cpu().clone() for k, v in full.items()} if dist.get_rank() == ROOT else None


class UnevenSharded(Parallel):
    """fsdp: hetbench's uneven FSDP (hetbench/pytorch/fsdp.py): each unit's parameters, gradients and optimizer
    state sharded by the weights, capped by each rank's free memory; gathers prefetched with --prefetch."""

    def __init__(self, model: torch.nn.Module, ctx: ApplyContext) -> None:
        super().__init__(model, ctx)
        pg = hetbench_group(ctx.group)
        cfg, state = ctx.cfg, ctx.state
        self.engine = ShardedModule(model, units(model), ctx.weights, pg.comm, pg.metrics, prefetch=cfg.prefetch,
                                    memory_bytes=state.memory_bytes, optimizer=cfg.optimizer, pg=pg)
        if state.ops is not None:
            state.ops.poll = self.engine.poll  # the started gathers are tested after every device GEMM too
        self.blocking: list[float] | None = None

    @staticmethod
    def state_share(ranks: int) -> float:
        return 1.0 / ranks

    @staticmethod
    def check(cfg: Any, world: Any, state: Any, layouts: list[Any]) -> list[str]:
        """The ranks' free memory (where each holds its state) can hold the model's sharded state."""
        state.memory_bytes = world.allgather(state_memory_bytes(state))
        per = STATE_BYTES_PER_ELEMENT[cfg.optimizer]
        caps = [None if m is None else int(m) // per for m in state.memory_bytes]
        total = sum(lay.size for lay in layouts)
        if all(c is not None for c in caps) and sum(caps) < total:  # type: ignore[arg-type]
            each = ", ".join(f"rank {r}: {m} bytes" for r, m in enumerate(state.memory_bytes))
            return [f"--strategy fsdp: the model's {total} parameters need {per} bytes each of sharded state "
                    f"({cfg.optimizer}), {total * per} bytes, more than the ranks' free memory ({each})"]
        return []

    def attach(self, logger: Any) -> None:
        self.blocking = self.engine.blocking_gather_seconds() if self.engine.prefetch else None
        self.engine.take_figures()
        logger.rank_figures = self._step_figures

    def _step_figures(self) -> dict[str, Any]:
        """A step's own figures for the step line: every prefetched gather's exposed seconds (and its unit), the
        gathered bytes at the step's peak."""
        f = self.engine.take_figures()
        return {"gather_exposed_seconds": f.exposed_seconds, "gather_units": f.exposed_units,
                "gathered_bytes_peak": f.gathered_bytes_peak}

    def resume(self, checkpoint: Any, optimizer: torch.optim.Optimizer) -> None:
        checkpoint.load_into(self.module, optimizer, self.engine)

    def param_bytes_held(self, names: set[str]) -> int:
        """The named parameters' elements inside this rank's slice of each unit's flat vector."""
        total, me = 0, self.engine.rank
        for u in self.engine.units:
            start, stop, at = u.offset, u.offset + u.counts[me], 0
            for name, shape in u.layout.params:
                n = numel(shape)
                if name in names:
                    total += max(0, min(stop, at + n) - max(start, at)) * u.held.element_size()
                at += n
        return total

    def manifest(self) -> dict[str, Any]:
        return {"layout": [u.layout.to_dict() for u in self.engine.units],
                "param_counts": [list(u.counts) for u in self.engine.units]}

    def live_manifest(self, optimizer_steps: int) -> dict[str, Any]:
        return {"optimizer_steps": optimizer_steps}

    def save(self, saver: Any, steps_done: int, optimizer: torch.optim.Optimizer) -> None:
        saver.save(steps_done, shard_pieces(self.engine, optimizer, self.ctx.cfg.optimizer))  # each rank its own

    def close(self) -> None:
        self.engine.close()  # its progress engine's thread: no gather is started after the last step

    def full_state(self) -> dict[str, torch.Tensor] | None:
        return self.engine.full_state_dict()

    @staticmethod
    def stage_problem() -> str | None:
        return None

    @staticmethod
    def stage_state_problem() -> str | None:
        return ("hetbench's fsdp over a pipeline stage's replicas keeps its state in flat shards that a pipeline's "
                "checkpoint and re-cut do not read yet")

    @classmethod
    def for_stage(cls, module: torch.nn.Module, ctx: ApplyContext) -> Parallel:
        """A stage's replicas: no prefetch (its order of gathers follows one forward and one backward a step, a
        schedule runs several of each)."""
        return cls(module, ApplyContext(dataclasses.replace(ctx.cfg, prefetch=False), ctx.world, ctx.state,
                                        ctx.weights, group=ctx.group))

    @staticmethod
    def group_backends() -> tuple[str, ...] | None:
        return ("hetbench",)  # its gathers and reduce-scatters are MPI calls on the hetbench group's communicator

    def group_state(self) -> dict[str, torch.Tensor] | None:
        return self.engine.full_state_dict() or {}  # whole at the group's first rank, nothing elsewhere

    def details(self, optimizer: torch.optim.Optimizer, logs: list[Any], mine: list[dict[str, Any]]) -> dict[str, Any]:
        """The shards, the units left empty, the bytes of sharded state held, the prefetch and its yardstick
        (gather_seconds_blocking: one prefetched gather's blocking time, averaged over a step's prefetched gathers,
        so that the summary's comm_hidden_percent weighs each unit by its own)."""
        engine, blocking = self.engine, self.blocking
        seq = engine.prefetched_units()
        mean_blocking = (sum(blocking[i] for i in seq) / len(seq)) if blocking and seq else None
        for log, m in zip(logs, mine):
            log.gather_exposed_seconds = m.get("gather_exposed_seconds") if engine.prefetch else None
        return {"prefetch": engine.prefetch, "gather_seconds_blocking": mean_blocking,
                "gather_seconds_blocking_per_unit": blocking,
                "prefetched_gathers_per_step": len(seq) if engine.prefetch else 0,
                "units": [{"name": u.name or "root", "elements": u.size, "counts": list(u.counts)}
                          for u in engine.units],
                "shard_elements": engine.elements, "element_weights": list(engine.element_weights),
                "empty_units": engine.empty_units(), **engine.state_bytes(optimizer),
                "step_figures": [{"gathered_bytes_peak": m.get("gathered_bytes_peak", 0)} for m in mine]}

    def finish_lines(self, lines: list[dict[str, Any]]) -> None:
        """Each step line's prefetched gathers: exposed seconds (per gather the least of the ranks': the rank that
        arrived last waited for no one) and hidden seconds (blocking - exposed, at least 0, each gather against its
        own unit's blocking time), as the numpy trainer's train.summary.gathers_hidden."""
        if not self.engine.prefetch:
            return
        blocking = self.blocking
        for line in lines:
            ranks = line["ranks"]
            per_rank = [r.get("gather_exposed_seconds") or [] for r in ranks]
            if blocking is None or not per_rank or any(len(p) != len(per_rank[0]) for p in per_rank):
                continue
            units_ = ranks[0].get("gather_units") or []
            exposed = [min(times) for times in zip(*per_rank)]
            line["gather_exposed_seconds"] = sum(exposed)
            line["comm_hidden_seconds"] = sum(max(0.0, blocking[u] - e) for u, e in zip(units_, exposed))

    @staticmethod
    def summary(gathered: Sequence[RankOutcome]) -> dict[str, Any]:
        """What each rank holds of the sharded state between steps (parameters + gradients + optimizer state,
        bytes, and its percent of all ranks'), its elements and their percent against its weight's, the units a
        rank holds nothing of (a weight too small for them), and the most it held gathered at once."""
        d = [g.details for g in gathered]
        state = [x["param_bytes"] + x["grad_bytes"] + x["optimizer_bytes"] for x in d]
        elements = [x["shard_elements"] for x in d]
        weights = d[ROOT]["element_weights"]
        return {"sharded_state": {
            "units": d[ROOT]["units"],
            "state_bytes_per_rank": state,
            "state_percent_per_rank": [100.0 * b / sum(state) if sum(state) else 0.0 for b in state],
            "elements_per_rank": elements,
            "elements_percent_per_rank": [100.0 * e / sum(elements) if sum(elements) else 0.0 for e in elements],
            "weight_percent_per_rank": [100.0 * w / sum(weights) if sum(weights) else 0.0 for w in weights],
            "empty_units_per_rank": [x["empty_units"] for x in d],
            "gather_seconds_blocking_per_unit": d[ROOT].get("gather_seconds_blocking_per_unit"),
            "gathered_bytes_peak_per_rank": [max((s.get("gathered_bytes_peak", 0)
                                                  for s in x.get("step_figures", [])), default=0) for x in d],
        }}


def autocast(cfg: Any, device: torch.device) -> Any:
    """Mixed precision (--dtype fp16/bf16): torch's autocast on the rank's device (fp32 master parameters,
    gradients and optimizer state; matmuls in the dtype); fp32: nothing."""
    if cfg.dtype.name == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.float16 if cfg.dtype.name == "fp16" else torch.bfloat16)


def local_bytes(p: torch.Tensor) -> int:
    """The bytes this rank holds of a parameter (a DTensor's local shard)."""
    local = p.to_local() if hasattr(p, "to_local") else p
    return local.numel() * local.element_size()


def state_memory_bytes(state: Any) -> int | None:
    """Free memory where this rank's training state lives: torch's GPU, else the rank's hetbench device's (the
    host's for a CPU rank; a simulated GPU's modelled memory), None where unknown."""
    device = state.device.device
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return state.opened.backend.free_memory_bytes()
    except Exception:  # noqa: BLE001 - a device that cannot tell
        return None
