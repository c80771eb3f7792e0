"""`hetbench train --frontend torch` on each rank: a real PyTorch model (the residual MLP teacher task, or a small
char-level GPT) trained by torch's own DDP or FSDP2, or by hetbench's own uneven FSDP (parameter, gradient and
optimizer shards sized by the weights: hetbench/pytorch/fsdp.py), over the "hetbench" backend, the batch shared by
the weights (exact under uneven shares: hetbench/pytorch/uneven.py; auto weights rebalanced by each rank's measured
samples/s in the first steps, as the numpy trainer does), every step logged with the backend's figures, and the
loss curve and final parameters checked at rank 0 against the same training in one process.

It returns the NumPy trainer's RankOutcome (hetbench/train/outcome.py), so that rows, summary, the --log lines and
`report` read both front ends alike.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from threadpoolctl import threadpool_info

import hetbench.pytorch  # noqa: F401  registers the backend
from hetbench.backends.base import MPI_MEMORY_HOST, MPI_MEMORY_NONE, capabilities
from hetbench.comm.world import World
from hetbench.harness.devices import OpenDevice, device_path_error
from hetbench.pytorch import backend as hb_backend
from hetbench.pytorch.device import RankDevice, for_backend
from hetbench.pytorch.fsdp import WrapError, flat_layout
from hetbench.pytorch.logger import StepLogger
from hetbench.pytorch.metrics import OpTotals, figures
from hetbench.pytorch.offload import offload_linears, step_seconds
from hetbench.pytorch.rank_backend import share_torch_threads, thread_counts  # noqa: F401 - tests read it here
from hetbench.results.profile import ProfileError, load_profile
from hetbench.train import BatchShares, StepLog, strategies
from hetbench.train.checkpoint import TORCH_FORMAT, CheckpointError
from hetbench.harness.ops import Ops
from hetbench.train.optim import ADAMW_WEIGHT_DECAY
from hetbench.train.outcome import (
    AUTO_REBALANCE_STEPS,
    ROOT,
    SKIPPED_KEY,
    SOLO_STEPS,
    RankOutcome,
    checkpoint_folder_errors,
    compare_with_reference,
    follow_verdicts,
    record_skips,
    skipped_before,
)
from hetbench.train.precision import LossScaler
from hetbench.train.run import history, log_text, resolve_weights, saver, solo_runner, warmup_errors
from hetbench.train.summary import reduction
from hetbench.train.torch_frontend.checkpoint import TorchCheckpoint, task_facts
from hetbench.train.torch_frontend.models import TaskConfig, build_model, describe, make_batch, row_losses, units
from hetbench.train.torch_frontend.parallel import ApplyContext, Parallel, autocast
from hetbench.train.torch_frontend.pipeline import Pipelined
from hetbench.train.torch_frontend.tensor import TensorParallel


@dataclass
class TorchTrainState:
    opened: OpenDevice
    device: RankDevice
    task: TaskConfig
    profile: Any = None
    resume: Any = None  # hetbench.train.torch_frontend.checkpoint.TorchCheckpoint with --resume
    ops: Any = None  # hetbench.harness.ops.Ops where the model's products run on the rank's hetbench device
    world_size: int = 1
    owns_group: bool = False
    memory_bytes: Any = None  # fsdp: every rank's free memory where its state lives (None: unknown), capping shares
    plan: Any = None  # --pp: the pipeline's plan (cut, rows, weights), made by its check alike on every rank


def task_config(cfg: Any) -> TaskConfig:
    return TaskConfig(task=cfg.model, layers=cfg.layers, hidden=cfg.hidden, batch=cfg.batch, seed=cfg.seed,
                      seq_len=cfg.seq_len, heads=cfg.heads)


def _blas_threads() -> int | None:
    """NumPy's BLAS threads now (threadpoolctl), None where none is found."""
    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return min(counts) if counts else None


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[TorchTrainState, list[str]]:
    """The rank's torch device; where torch cannot drive the rank's hetbench device (OpenCL, simulated), an Ops on
    it for the model's products (hetbench/pytorch/offload.py), in the run's dtype (mixed precision: the operands
    and results rounded to it, as the numpy trainer's GEMMs)."""
    device = for_backend(opened.backend, opened.spec, world.local_rank)
    share_torch_threads(world.local_size, offloaded=not device.torch_has_device)
    ops = None if device.torch_has_device else Ops(opened.backend, cfg.dtype.name)
    try:
        task = task_config(cfg)
    except ValueError as e:
        return TorchTrainState(opened, device, TaskConfig(), ops=ops, world_size=world.size), [str(e)]
    return TorchTrainState(opened, device, task, ops=ops, world_size=world.size), []


def check(cfg: Any, world: World, state: TorchTrainState) -> list[str]:
    """Collective: what must hold on every rank before the process group is made. Every rank reads --resume's
    manifest itself (a folder every rank sees), so all find the same."""
    errors = _device_path_errors(cfg, world, state)
    start = 0
    if cfg.resume is not None:
        try:
            state.resume = TorchCheckpoint(cfg.resume)
            errors += state.resume.mismatches(cfg)
            start = state.resume.steps_done
        except CheckpointError as e:
            errors.append(str(e))
    if not errors:
        errors += checkpoint_folder_errors(cfg.checkpoint, cfg.checkpoint_every, start, cfg.steps)
    if not errors:
        errors += warmup_errors(cfg, start)
    if cfg.path == "device":
        problem = hb_backend.device_path_problem(world.comm)
        if problem:
            errors.append(f"--path device: {problem}")
    errors += _model_errors(cfg, world, state)
    if cfg.weights.kind == "profile":
        devices = [tuple(d) for d in world.allgather((state.opened.spec, state.opened.info.name))]
        try:
            state.profile = load_profile(cfg.weights.path, world.size, "fp32", "rows", devices)
        except ProfileError as e:
            errors.append(str(e))
    return errors


def _device_path_errors(cfg: Any, world: World, state: TorchTrainState) -> list[str]:
    """--path device: a rank whose device keeps its buffers in GPU memory that torch itself does not hold (a
    simulated GPU: its memory stands for a GPU's) needs an MPI that takes that GPU's memory, as the numpy front end
    checks it (harness.devices.device_path_error); a CuPy GPU's torch tensors are checked with the backend's
    device_path_problem, and host or OpenCL buffers go to any MPI."""
    backend = state.opened.backend
    if (cfg.path != "device" or capabilities(backend.name).torch_device == "cuda"
            or backend.mpi_memory_kind() in (MPI_MEMORY_HOST, MPI_MEMORY_NONE)):
        return []
    error = device_path_error(backend, state.opened.info, cfg.dtype, world)
    return [error] if error else []


def _model_errors(cfg: Any, world: World, state: TorchTrainState) -> list[str]:
    """Collective. --resume: its state fits this run's model (every strategy reads it); the strategy's own check
    (hetbench fsdp: the ranks' memory can hold the model's sharded state)."""
    with torch.device("meta"):
        meta = build_model(state.task)
    try:
        layouts = flat_layout(meta, units(meta))
    except WrapError as e:
        return [str(e)]
    errors = []
    if state.resume is not None:
        problem = state.resume.layout_mismatch(layouts)
        if problem:
            errors.append(problem)
    return errors + _parallel_class(cfg).check(cfg, world, state, layouts)


def _strategy(cfg: Any) -> strategies.Strategy:
    return strategies.get("torch", cfg.strategy)


def _parallel_class(cfg: Any) -> Any:
    """What makes the model parallel: a pipeline of --pp stages or tensor-parallel groups of --tp ranks (their
    data-parallel dimension by the strategy), else the strategy's own class."""
    if cfg.pp > 1:
        return Pipelined
    if cfg.tp > 1:
        return TensorParallel
    return _strategy(cfg).applier()


def _weights(cfg: Any, world: World, state: TorchTrainState) -> list[float]:
    """Each rank's weight: even, given, a profile's rates, or (auto) each rank's training throughput measured
    beside the others (probe_samples_per_second)."""
    return resolve_weights(cfg, world, state.profile, lambda: probe_samples_per_second(cfg, state))


def probe_samples_per_second(cfg: Any, state: TorchTrainState, repeats: int = 2) -> float:
    """This rank's samples/s through the task's forward and backward on a slice of an even share of the batch, on
    a throwaway copy of the model placed as the run places it (torch's device, or the products on the hetbench
    device): the work itself, many small attention products included, not one GEMM's rate. On a simulated device
    the modelled GEMM and copy time replaces the host's emulating them, as in the step figures."""
    rows = max(1, min(-(-cfg.batch // state.world_size), 256))
    model = build_model(state.task).to(state.device.device)
    ops = state.ops
    if ops is not None:
        offload_linears(model, ops)
    x, y = make_batch(state.task, 0, 0, rows)
    x, y = x.to(state.device.device), y.to(state.device.device)
    best = math.inf
    for i in range(repeats + 1):  # the first is warm-up (kernel builds, first allocations)
        if ops is not None:
            ops.reset()
        start = time.perf_counter()
        with _autocast(cfg, state.device.device):
            loss = row_losses(model, x, y).float().sum()
        loss.backward()
        if state.device.device.type == "cuda":
            torch.cuda.synchronize(state.device.device)
        seconds = step_seconds(ops, time.perf_counter() - start)
        if i > 0:
            best = min(best, seconds)
    if ops is not None:
        ops.reset()
    return rows / best if best > 0 else math.inf


def _optimizer(cfg: Any, params: Any) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=ADAMW_WEIGHT_DECAY)


def _init_group(cfg: Any) -> bool:
    """The default process group over the hetbench backend on the run's path; True when this call made it."""
    if dist.is_initialized():
        return False
    hb_backend.set_path(cfg.path)
    dist.init_process_group(hb_backend.BACKEND_NAME)
    return True


def run_rank(cfg: Any, world: World, state: TorchTrainState,
             on_step: Callable[[int, int, str], None] | None = None) -> RankOutcome:
    """Collective. Train; rank 0 gathers the step lines and checks the run against one process."""
    state.owns_group = _init_group(cfg)
    try:
        return _train(cfg, world, state, on_step)
    finally:
        if state.owns_group:
            dist.destroy_process_group()


@dataclass
class _Run:
    """One run's pieces on a rank, made before the first step."""

    parallel: Parallel
    opt: torch.optim.Optimizer
    balance: BatchShares
    scaler: LossScaler
    logger: StepLogger
    weights: list[float]
    start: int
    before: list[int] | None  # the steps skipped before a resume (None: not known)
    steps_taken: list[int] = field(default_factory=lambda: [0])  # the optimizer's steps (a resume's included)
    saver: Any = None
    solo: Callable[[int], float] | None = None
    solo_seconds: dict[int, float] = field(default_factory=dict)  # this rank alone after each timed step


def _train(cfg: Any, world: World, state: TorchTrainState, on_step: Any) -> RankOutcome:
    run = _start(cfg, world, state)
    for step in range(run.start, cfg.steps):
        _step(cfg, world, state, run, step)
        if on_step is not None and run.logger.lines:
            on_step(step + 1, cfg.steps, f"step {step + 1}/{cfg.steps} loss {run.logger.lines[-1]['loss']:.4g}")
        if run.saver is not None and run.saver.due(step + 1):
            run.parallel.save(run.saver, step + 1, run.opt)
            if run.logger.pg is not None:
                run.logger.pg.metrics.take()  # the save's gathers are not the next step's communication
    run.parallel.close()
    return _outcome(cfg, world, state, run, run.parallel.full_state())


def _start(cfg: Any, world: World, state: TorchTrainState) -> _Run:
    """Collective: the weights, the batch shares (auto weights: they follow each rank's measured samples/s over the
    first steps, the numpy trainer's BatchShares; fsdp's parameter shards stay as the first weights set them), the
    model made parallel by the strategy, the optimizer, the resume, the loss scaler, the saver and the logger."""
    weights = state.plan.weights if state.plan is not None else _weights(cfg, world, state)
    rebalance = AUTO_REBALANCE_STEPS if cfg.weights.kind == "auto" and state.plan is None else 0
    balance = BatchShares(world.comm, weights, cfg.batch, rebalance)
    torch.manual_seed(cfg.seed)
    model = build_model(state.task).to(state.device.device)
    if state.ops is not None:  # torch cannot drive this rank's device: its products run there through hetbench
        offload_linears(model, state.ops)
    parallel = _parallel_class(cfg)(model, ApplyContext(cfg, world, state, weights))
    opt = _optimizer(cfg, parallel.module.parameters())
    start = optimizer_steps = 0
    if state.resume is not None:
        parallel.resume(state.resume, opt)
        start = state.resume.steps_done
        optimizer_steps = _optimizer_steps(opt)
    scaler = LossScaler.for_dtype(cfg.dtype.name, state.resume.loss_scaler if state.resume is not None else None)
    # the steps skipped so far, for a checkpoint and the check (the reference follows the run's verdicts)
    before = skipped_before(state.resume.manifest if state.resume is not None else None)
    logger = StepLogger(None, cfg.batch, model=parallel.module, optimizer=opt, first_step=start)
    run = _Run(parallel, opt, balance, scaler, logger, weights, start, before, steps_taken=[optimizer_steps])
    run.saver = _saver(cfg, world, state, run, record_skips(scaler, start, before))
    logger.device_ops = state.ops
    parallel.attach(logger)
    if cfg.solo_between_steps and world.size > 1:
        run.solo = solo_runner(world, lambda step: _alone_once(cfg, state, step))
    return run


def _step(cfg: Any, world: World, state: TorchTrainState, run: _Run, step: int) -> None:
    """Collective: one training step on this rank's rows of the batch, logged; then the shares' rebalancing and,
    after a timed step, the solo runs."""
    device = state.device.device
    start_row, stop_row = run.parallel.rows(run.balance.counts, world.rank)
    x, y = make_batch(state.task, step, start_row, stop_row)
    x, y = x.to(device), y.to(device)

    def stepper(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, **kw: Any) -> Any:
        return one_step(cfg, module, run.opt, run.scaler, x, y, distributed=True, **kw)

    with run.logger.step(samples=stop_row - start_row) as rec:
        rec.loss, rec.loss_scale, rec.step_skipped = run.parallel.step(stepper, x, y)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    run.steps_taken[0] += 0 if rec.step_skipped else 1
    run.balance.after_step(stop_row - start_row, run.logger.mine[-1]["compute_seconds"])
    optimizer = run.parallel.after_step(step, run.opt)
    if optimizer is not None:  # the strategy made its module again: the step loop takes its new pieces
        run.opt = optimizer
        run.logger.model, run.logger.optimizer = run.parallel.module, optimizer
    if run.solo is not None and step - run.start >= cfg.warmup_steps:
        run.solo_seconds[step] = run.solo(step)


def _facts(cfg: Any, world: World, state: TorchTrainState) -> dict[str, Any]:
    """The rank's facts for its row: where it computed, torch's and BLAS's threads, the dtype and its path."""
    offloaded = state.ops is not None
    return {"host": world.host, "backend": state.opened.spec,
            "vendor": state.opened.info.vendor if offloaded else state.device.vendor,
            "device": state.opened.info.name if offloaded else state.device.name,
            "device_timing": "modelled" if offloaded and state.ops.modelled else "measured",
            "torch_device": state.device.torch_device,
            "torch_has_device": state.device.torch_has_device, "hetbench_device": state.opened.info.name,
            "torch_threads": torch.get_num_threads(), "blas_threads": _blas_threads(),
            "compute_dtype": cfg.dtype.name,
            # where the model's matmuls run: torch on its device (autocast under mixed precision), or the rank's
            # hetbench device through the offload (native or emulated in the dtype, as the numpy trainer's GEMMs)
            "compute_path": (f"hetbench device, {state.ops.compute_path}" if offloaded else
                             "torch autocast" if cfg.dtype.name != "fp32" else "torch"),
            "state_memory": "device" if state.device.torch_device != "cpu" else "host"}


def _note(state: TorchTrainState) -> str:
    """Where the rank's model computed, said in a line."""
    if state.ops is None:
        return state.device.note
    return (f"torch cannot drive {state.opened.spec} ({state.opened.info.name}): the model's matmuls (nn.Linear's "
            "and attention's, forward and backward) run there through hetbench"
            f"{' (GEMM and copy time modelled)' if state.ops.modelled else ''}, the rest in torch on the CPU")


def _outcome(cfg: Any, world: World, state: TorchTrainState, run: _Run, full: Any) -> RankOutcome:
    """Collective: the rank's outcome; rank 0's with every step line, the --log text and the check."""
    mine = run.logger.mine
    logs = [StepLog(step=m["step"], loss=float("nan"), step_seconds=m["step_seconds"],
                    compute_seconds=m["compute_seconds"], comm_seconds=m["comm_seconds"] or 0.0,
                    idle_seconds=m["idle_seconds"] or 0.0, samples=m["samples"], param_bytes=m["param_bytes"],
                    grad_bytes=m["grad_bytes"], optimizer_bytes=m["optimizer_bytes"],
                    solo_step_seconds=run.solo_seconds.get(m["step"])) for m in mine]
    every_solo = world.gather(run.solo_seconds) if run.solo is not None else None
    details = {"strategy": cfg.strategy, "frontend": "torch", "collectives": _steps_collectives(mine, world.size),
               "torch_version": str(torch.__version__), "note": _note(state), **run.balance.details(),
               **run.parallel.details(run.opt, logs, mine)}
    result = RankOutcome(logs, _facts(cfg, world, state), list(run.weights), run.parallel.shares(run.balance.counts),
                         details=details, start_step=run.start,
                         resumed_from=str(state.resume.folder) if state.resume is not None else None,
                         checkpoints=list(run.saver.saved) if run.saver is not None else [])
    if world.rank == ROOT:
        result.steps = [dict(line) for line in run.logger.lines]
        for log, line in zip(logs, result.steps):
            log.loss = line["loss"]
        run.parallel.finish_lines(result.steps)
        if every_solo is not None:
            for line in result.steps:
                for entry in line["ranks"]:
                    seconds = every_solo[entry["rank"]].get(line["step"])
                    if seconds is not None:
                        entry["solo_step_seconds"] = seconds
        if cfg.log is not None:
            result.log_text = log_text(result.steps)
        if cfg.check:
            result.check = check_against_one_process(cfg, state.task, [s["loss"] for s in result.steps], full,
                                                     run.start, [s["step_skipped"] for s in result.steps], run.before)
    return result


def _alone_once(cfg: Any, state: TorchTrainState, step: int) -> float:
    """--solo-between-steps (train.run.solo_runner): this rank trains the whole batch alone, a fresh plain model of
    the task on its device, its matmuls offloaded as in the run, the same optimizer and dtype, SOLO_STEPS steps
    from `step`'s data, no process group; its last step's seconds (wall time; on a simulated device the modelled
    GEMM and copy time in place of their emulation). The plain model does without fsdp's gathers and
    reduce-scatters, which one rank would still make as copies: a solo step a little faster than
    `hetbench train -n 1` times, a baseline that errs high."""
    device = state.device.device
    torch.manual_seed(cfg.seed)
    model = build_model(state.task).to(device)
    if state.ops is not None:
        offload_linears(model, state.ops)
    opt = _optimizer(cfg, model.parameters())
    scaler = LossScaler.for_dtype(cfg.dtype.name)
    seconds = 0.0
    for s in range(step, step + SOLO_STEPS):
        x, y = make_batch(state.task, s, 0, cfg.batch)
        x, y = x.to(device), y.to(device)
        if state.ops is not None:
            state.ops.reset()
        t0 = time.perf_counter()
        one_step(cfg, model, opt, scaler, x, y, distributed=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        # a simulated device's modelled GEMM and copy time in place of the host's emulating them
        seconds = step_seconds(state.ops, time.perf_counter() - t0)
    if state.ops is not None:
        state.ops.reset()
    return seconds


def _optimizer_steps(opt: torch.optim.Optimizer) -> int:
    """The steps the optimizer has taken (AdamW's step count; 0 for SGD, which keeps none)."""
    for s in opt.state.values():
        if "step" in s:
            return int(float(s["step"]))
    return 0


def _steps_collectives(mine: list[dict[str, Any]], ranks: int) -> dict[str, dict[str, Any]]:
    """This rank's collective figures summed over the training steps (not the checkpoint saves' and final state's
    gathers, which happen between steps)."""
    totals: dict[str, OpTotals] = {}
    for m in mine:
        for op, o in (m.get("collectives") or {}).items():
            t = totals.setdefault(op, OpTotals())
            t.count += o["count"]
            t.bytes += o["bytes"]
            t.seconds += o["seconds"]
            t.copy_seconds += o["copy_seconds"]
            t.idle_seconds += o["idle_seconds"]
    return figures(totals, ranks)


_autocast = autocast  # the name this module's callers and tests use


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def one_step(cfg: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: LossScaler, x: torch.Tensor,
             y: torch.Tensor, distributed: bool,
             backward: Callable[[float], torch.Tensor] | None = None) -> tuple[torch.Tensor, float, bool]:
    """One training step, the same in the distributed run and the one-process reference: this part of the global
    mean loss, backward (fp16: at the loss scale), and, under mixed precision, the verdict on non-finite gradients
    agreed over the ranks (each FSDP2 rank sees only its shards) before the update is taken or skipped, as the
    numpy trainer's LossScaler does (hetbench/train/precision.py). `backward(scale)` replaces the forward and
    backward where a pipeline's schedule runs them (it returns the rank's part of the loss). Returns (loss, the
    scale used, skipped)."""
    scale = scaler.scale
    if backward is not None:
        loss = backward(scale)
    else:
        with _autocast(cfg, x.device):
            loss = row_losses(model, x, y).float().sum() / cfg.batch
        (loss * scale if scale != 1.0 else loss).backward()
    skipped = False
    if scaler.checks:
        bad = any(not bool(torch.isfinite(_local(p.grad)).all()) for p in model.parameters() if p.grad is not None)
        flag = torch.tensor([1.0 if bad else 0.0])
        if distributed:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        skipped = scaler.update(bool(flag.item() > 0))
    if not skipped:
        _unscaled_step(model, opt, scale)
    opt.zero_grad(set_to_none=False)  # gradients stay held: the bytes a step holds at its peak
    return loss.detach(), scale, skipped


def _unscaled_step(model: torch.nn.Module, opt: torch.optim.Optimizer, scale: float) -> None:
    """The optimizer's step on the gradients divided by the scale their backward ran at."""
    if scale != 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(1.0 / scale)
    opt.step()


def reference(cfg: Any, task: TaskConfig, follow: list[bool | None] | None = None
              ) -> tuple[list[float], dict[str, torch.Tensor], list[bool]]:
    """The same training in one process on the CPU: the whole batch each step, the plain module, the same dtype
    and loss scaler, following the run's skip verdicts `follow` (per global step; None or beyond the list: its own)
    as the numpy reference does (hetbench/train/reference.py): an update whose gradient overflowed here is taken with
    the step's backward at half the scale, again, until finite. Returns (losses, final parameters, the steps one
    process would have skipped on its own)."""
    torch.manual_seed(cfg.seed)
    model = build_model(task)
    opt = _optimizer(cfg, model.parameters())
    scaler = LossScaler.for_dtype(cfg.dtype.name)
    losses, own = [], []
    for step in range(cfg.steps):
        x, y = make_batch(task, step, 0, cfg.batch)
        verdict = follow[step] if follow is not None and step < len(follow) else None
        loss, own_skip = _reference_step(cfg, model, opt, scaler, x, y, verdict)
        losses.append(loss)
        own.append(own_skip)
    return losses, {k: v.detach().clone() for k, v in model.named_parameters()}, own


def _reference_step(cfg: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: LossScaler,
                    x: torch.Tensor, y: torch.Tensor, verdict: bool | None) -> tuple[float, bool]:
    """One step of the reference (one_step's arithmetic) under the verdict given (None: its own). Returns (the loss,
    whether its own gradient was non-finite)."""
    scale = used = scaler.scale
    own = False
    while True:
        opt.zero_grad(set_to_none=False)
        with _autocast(cfg, x.device):
            loss = row_losses(model, x, y).float().sum() / cfg.batch
        (loss * used if used != 1.0 else loss).backward()
        bad = scaler.checks and any(not bool(torch.isfinite(p.grad).all())
                                    for p in model.parameters() if p.grad is not None)
        own = own or (bad and used == scale)
        take = verdict if verdict is not None else bad
        if not bad or take or used <= 2.0**-64:  # the run updated where this overflowed: a smaller scale
            break
        used /= 2
    skipped = scaler.update(bool(take)) if scaler.checks else False
    if not skipped:
        _unscaled_step(model, opt, used)
    opt.zero_grad(set_to_none=False)
    return float(loss.detach().item()), bool(own)


def check_against_one_process(cfg: Any, task: TaskConfig, losses: list[float],
                              params: dict[str, torch.Tensor] | None, start: int = 0,
                              skipped: list[bool] | None = None, before: list[int] | None = None) -> dict[str, Any]:
    """The run against the same training in one process (the reference from step 0, following the run's skip
    verdicts, `before` those before a resume, None where not known; a resumed run's steps against its same steps):
    the numpy trainer's rule and tolerances (hetbench.train.outcome.compare_with_reference: every step's loss within
    a tolerance growing with the step, the dtype and the optimizer; the parameters as one vector,
    ||p - p_ref|| / ||p_ref||, within theirs). Only the order of the sums (and under mixed precision where the
    rounding falls) differs."""
    skipped = list(skipped) if skipped is not None else [False] * len(losses)
    ref_losses, ref_params, ref_own = reference(cfg, task, follow_verdicts(cfg.steps, start, before, skipped))
    norm_diff = tensor_diff = param_diff = 0.0
    missing: list[str] = []
    diff_sq = want_sq = 0.0
    if params is not None:
        for name, want in ref_params.items():
            got = params.get(name)
            if got is None or got.shape != want.shape:
                missing.append(name)
                continue
            d = (got.double() - want.double())
            diff_sq += float((d * d).sum())
            want_sq += float((want.double() ** 2).sum())
            tensor_diff = max(tensor_diff, float(d.norm()) / max(float(want.double().norm()), 1e-30))
            param_diff = max(param_diff, float(d.abs().max()) / max(float(want.abs().max()), 1e-30))
        norm_diff = diff_sq ** 0.5 / max(want_sq ** 0.5, 1e-30)
    out = compare_with_reference(cfg.dtype.name, cfg.optimizer, cfg.steps, start, losses, ref_losses[start:],
                                 skipped, ref_own[start:], norm_diff, tensor_diff, param_diff,
                                 params is not None and not missing, reduction(cfg))
    return {**out, "params_missing": missing, "reference": "torch, one process, CPU"}


def _saver(cfg: Any, world: World, state: TorchTrainState, run: _Run, skips: list[int] | None) -> Any:
    """Collective (with --checkpoint): the numpy trainer's Saver (layout, atomic saves, manifest last) writing the
    torch state; the manifest records the task, the run and every rank's device, and the strategy's own entries
    (hetbench fsdp: its units' layout and the optimizer's step count)."""
    if cfg.checkpoint is None:
        return None
    every = _facts(cfg, world, state)
    facts = {k: every[k] for k in ("host", "backend", "vendor", "device", "torch_device")}
    manifest = {"frontend": "torch", "model": task_facts(cfg), "optimizer": cfg.optimizer, "lr": cfg.lr,
                "dtype": cfg.dtype.name, "master_dtype": "fp32", "strategy": cfg.strategy,
                "weights": list(run.weights), "shares": list(run.balance.counts), "shares_of": _strategy(cfg).shares_of,
                "first_step": run.start, "history": history(state.resume, lambda ranks: ranks),
                "torch_version": str(torch.__version__), **run.parallel.manifest()}

    def live() -> dict[str, Any]:
        return {"loss_scaler": run.scaler.state(), SKIPPED_KEY: None if skips is None else list(skips),
                **run.parallel.live_manifest(run.steps_taken[0])}

    return saver(cfg, world, manifest, facts, live, fmt=TORCH_FORMAT)


def summary_extra(cfg: Any, gathered: list[RankOutcome]) -> dict[str, Any]:
    """The torch front end's own summary figures: the task, torch's version, where each rank computed, and the
    backend's collective figures per rank, summed over the training steps (nccl-tests algbw/busbw), and the
    strategy's own."""
    root = gathered[ROOT]
    return {
        "frontend": "torch",
        "task": describe(task_config(cfg)),
        "torch_version": root.details.get("torch_version"),
        "torch_devices": [g.facts.get("torch_device") for g in gathered],
        "torch_notes": [g.details.get("note", "") for g in gathered],
        "collectives_per_rank": [g.details.get("collectives", {}) for g in gathered],
        **_parallel_class(cfg).summary(gathered),
    }


class TorchFrontEnd:
    """The torch front end (train/frontend.py's FrontEnd)."""

    prepare = staticmethod(prepare)
    check = staticmethod(check)
    run_rank = staticmethod(run_rank)
    summary_extra = staticmethod(summary_extra)


FRONTEND = TorchFrontEnd()
