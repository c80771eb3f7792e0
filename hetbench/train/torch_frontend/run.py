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
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

import hetbench.pytorch  # noqa: F401  registers the backend
from hetbench.harness import split_plan as plan
from hetbench.comm.world import World
from hetbench.harness.devices import OpenDevice
from hetbench.train.outcome import (
    ROOT,
    SKIPPED_KEY,
    RankOutcome,
    compare_with_reference,
    follow_verdicts,
    record_skips,
    skipped_before,
)
from hetbench.pytorch import backend as hb_backend
from hetbench.pytorch.device import RankDevice, for_backend
from hetbench.pytorch.logger import StepLogger
from hetbench.pytorch.models import TaskConfig, build_model, describe, make_batch, row_losses, units
from hetbench.pytorch.offload import offload_linears, step_seconds
from hetbench.pytorch.uneven import exact_ddp, exact_fully_shard
from hetbench.train import StepLog
from hetbench.train.ops import Ops
from hetbench.train.optim import ADAMW_WEIGHT_DECAY
from hetbench.train.precision import LossScaler
from hetbench.train import strategies

TORCH_STRATEGIES = strategies.names("torch")


def _strategy(cfg: Any) -> strategies.Strategy:
    return strategies.get("torch", cfg.strategy)


@dataclass
class TorchTrainState:
    opened: OpenDevice
    device: RankDevice
    task: TaskConfig
    profile: Any = None
    resume: Any = None  # hetbench.pytorch.checkpoint.TorchCheckpoint with --resume
    ops: Any = None  # hetbench.train.ops.Ops where the model's products run on the rank's hetbench device
    world_size: int = 1
    owns_group: bool = False
    memory_bytes: Any = None  # fsdp: every rank's free memory where its state lives (None: unknown), capping shares


def task_config(cfg: Any) -> TaskConfig:
    return TaskConfig(task=cfg.model, layers=cfg.layers, hidden=cfg.hidden, batch=cfg.batch, seed=cfg.seed,
                      seq_len=cfg.seq_len, heads=cfg.heads)


def thread_counts(local_size: int, offloaded: bool) -> tuple[int | None, int | None]:
    """(torch's intra-op threads, NumPy's BLAS threads) for a torch rank, one of `local_size` on its node; None:
    left as they are (the user set a count in the environment, or the rank is alone on its node).

    torch's threads take the rank's share of the node's cores (as BLAS's do: harness.devices): two ranks on two
    cores with two torch threads each spun against each other and against the BLAS and PoCL threads doing an
    offloaded rank's products. Where torch cannot drive the rank's device (an OpenCL or simulated rank: its products
    go to hetbench, a simulated one's computed by NumPy's BLAS), NumPy's BLAS gets one thread: torch's OpenMP
    threads and BLAS's, both a share of the cores and used in turn, each spin on the cores the other needs. On a
    16-core H100 node (docs/gpu.md) a host + simulated GPT step under FSDP2 took 585 ms with 8 + 8 threads a rank,
    56 ms with BLAS at one, 39 ms for host + host."""
    from hetbench.backends.host import threads_for_rank

    threads = threads_for_rank(local_size)
    if threads is None:
        return None, None
    return threads, (1 if offloaded and threads > 1 else None)


def _blas_threads() -> int | None:
    """NumPy's BLAS threads now (threadpoolctl), None where none is found."""
    from threadpoolctl import threadpool_info

    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return min(counts) if counts else None


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[TorchTrainState, list[str]]:
    """The rank's torch device; where torch cannot drive the rank's hetbench device (OpenCL, simulated), an Ops on
    it for the model's products (hetbench/pytorch/offload.py), in the run's dtype (mixed precision: the operands
    and results rounded to it, as the numpy trainer's GEMMs)."""
    device = for_backend(opened.backend, opened.spec, world.local_rank)
    torch_threads, blas_threads = thread_counts(world.local_size, offloaded=not device.torch_has_device)
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    if blas_threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=blas_threads, user_api="blas")
    ops = None if device.torch_has_device else Ops(opened.backend, cfg.dtype.name)
    try:
        task = task_config(cfg)
    except ValueError as e:
        return TorchTrainState(opened, device, TaskConfig(), ops=ops, world_size=world.size), [str(e)]
    return TorchTrainState(opened, device, task, ops=ops, world_size=world.size), []


def check(cfg: Any, world: World, state: TorchTrainState) -> list[str]:
    """Collective: what must hold on every rank before the process group is made. Every rank reads --resume's
    manifest itself (a folder every rank sees), so all find the same."""
    from hetbench.train.outcome import checkpoint_folder_errors
    from hetbench.pytorch.checkpoint import TorchCheckpoint
    from hetbench.train.checkpoint import CheckpointError

    errors = []
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
    run_steps = cfg.steps - start
    if not errors and cfg.warmup_steps >= run_steps:
        errors.append(f"--warmup-steps {cfg.warmup_steps} leaves none of this run's {run_steps} steps to time; "
                      f"accepted: 0 to {run_steps - 1}")
    if cfg.path == "device":
        problem = hb_backend.device_path_problem(world.comm)
        if problem:
            errors.append(f"--path device: {problem}")
    if _strategy(cfg).shards_by_weights or state.resume is not None:  # the same on every rank: the collective is called by all
        errors += _fsdp_errors(cfg, world, state)
    if cfg.weights.kind == "profile":
        from hetbench.results.profile import ProfileError, load_profile

        devices = [tuple(d) for d in world.allgather((state.opened.spec, state.opened.info.name))]
        try:
            state.profile = load_profile(cfg.weights.path, world.size, "fp32", "rows", devices)
        except ProfileError as e:
            errors.append(str(e))
    return errors


def _state_memory_bytes(state: TorchTrainState) -> int | None:
    """Free memory where this rank's training state lives: torch's GPU, else the rank's hetbench device's (the
    host's for a CPU rank; a simulated GPU's modelled memory), None where unknown."""
    device = state.device.device
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return state.opened.backend.free_memory_bytes()
    except Exception:  # noqa: BLE001 - a device that cannot tell
        return None


def _fsdp_errors(cfg: Any, world: World, state: TorchTrainState) -> list[str]:
    """Collective. fsdp: the ranks' memory can hold the model's sharded state; --resume: its sharded pieces fit
    this run's model (every strategy reads them)."""
    from hetbench.pytorch.fsdp import WrapError, flat_layout
    from hetbench.pytorch.models import build_model, units as model_units

    errors = []
    with torch.device("meta"):
        meta = build_model(state.task)
    try:
        layouts = flat_layout(meta, model_units(meta))
    except WrapError as e:
        return [str(e)]
    if state.resume is not None:
        problem = state.resume.layout_mismatch(layouts)
        if problem:
            errors.append(problem)
    if _strategy(cfg).shards_by_weights:
        from hetbench.pytorch.fsdp import STATE_BYTES_PER_ELEMENT

        state.memory_bytes = world.allgather(_state_memory_bytes(state))
        per = STATE_BYTES_PER_ELEMENT[cfg.optimizer]
        caps = [None if m is None else int(m) // per for m in state.memory_bytes]
        total = sum(lay.size for lay in layouts)
        if all(c is not None for c in caps) and sum(caps) < total:  # type: ignore[arg-type]
            each = ", ".join(f"rank {r}: {m} bytes" for r, m in enumerate(state.memory_bytes))
            errors.append(f"--strategy fsdp: the model's {total} parameters need {per} bytes each of sharded state "
                          f"({cfg.optimizer}), {total * per} bytes, more than the ranks' free memory ({each})")
    return errors


def _weights(cfg: Any, world: World, state: TorchTrainState) -> list[float]:
    """Each rank's weight: even, given, a profile's rates, or (auto) each rank's training throughput measured
    beside the others (probe_samples_per_second)."""
    if cfg.weights.kind == "even":
        return [1.0] * world.size
    if cfg.weights.kind == "list":
        return list(cfg.weights.values)
    if cfg.weights.kind == "profile":
        return list(state.profile.rates)
    world.barrier()
    return [float(r) for r in world.allgather(probe_samples_per_second(cfg, state))]


def probe_samples_per_second(cfg: Any, state: TorchTrainState, repeats: int = 2) -> float:
    """This rank's samples/s through the task's forward and backward on a slice of an even share of the batch, on
    a throwaway copy of the model placed as the run places it (torch's device, or the products on the hetbench
    device): the work itself, many small attention products included, not one GEMM's rate. On a simulated device
    the modelled GEMM and copy time replaces the host's emulating them, as in the step figures."""
    import time

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


def _full_state(cfg: Any, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """Collective: the model's full parameters (CPU) at rank 0, None elsewhere."""
    if _strategy(cfg).replicated:
        module = model.module if hasattr(model, "module") else model
        return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if dist.get_rank() == ROOT \
            else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu().clone() for k, v in full.items()} if dist.get_rank() == ROOT else None


def run_rank(cfg: Any, world: World, state: TorchTrainState,
             on_step: Callable[[int, int, str], None] | None = None) -> RankOutcome:
    """Collective. Train; rank 0 gathers the step lines and checks the run against one process."""
    state.owns_group = _init_group(cfg)
    try:
        return _train(cfg, world, state, on_step)
    finally:
        if state.owns_group:
            dist.destroy_process_group()


def _train(cfg: Any, world: World, state: TorchTrainState, on_step: Any) -> RankOutcome:
    from hetbench.train.outcome import AUTO_REBALANCE_STEPS
    from hetbench.train import BatchShares

    weights = _weights(cfg, world, state)
    # auto weights: the batch shares follow each rank's measured samples/s over the first steps (the numpy
    # trainer's BatchShares); fsdp's parameter shards stay as the first weights set them
    balance = BatchShares(world.comm, weights, cfg.batch, AUTO_REBALANCE_STEPS if cfg.weights.kind == "auto" else 0)
    shares = list(balance.counts)
    device = state.device.device
    torch.manual_seed(cfg.seed)
    model = build_model(state.task).to(device)
    if state.ops is not None:  # torch cannot drive this rank's device: its products run there through hetbench
        offload_linears(model, state.ops)
    engine = None
    if _strategy(cfg).replicated:
        model = exact_ddp(model)
    elif _strategy(cfg).shards_by_weights:
        from hetbench.pytorch.fsdp import ShardedModule
        from hetbench.pytorch.logger import hetbench_group

        pg = hetbench_group()
        engine = ShardedModule(model, units(model), weights, pg.comm, pg.metrics, prefetch=cfg.prefetch,
                               memory_bytes=state.memory_bytes, optimizer=cfg.optimizer, pg=pg)
        if state.ops is not None:
            state.ops.poll = engine.poll  # the started gathers are tested after every device GEMM too
    else:
        exact_fully_shard(model, units(model))
    opt = _optimizer(cfg, model.parameters())
    start = 0
    optimizer_steps = 0
    if state.resume is not None:
        state.resume.load_into(model, opt, engine)
        start = state.resume.steps_done
        optimizer_steps = _optimizer_steps(opt)
    blocking = engine.blocking_gather_seconds() if engine is not None and engine.prefetch else None
    scaler = LossScaler.for_dtype(cfg.dtype.name, state.resume.loss_scaler if state.resume is not None else None)
    steps_taken = [optimizer_steps]
    # the steps skipped so far, for a checkpoint and the check (the reference follows the run's verdicts)
    before = skipped_before(state.resume.manifest if state.resume is not None else None)
    skips = record_skips(scaler, start, before)
    saver = _saver(cfg, world, state, weights, shares, start, scaler, engine, steps_taken, skips)
    logger = StepLogger(None, cfg.batch, model=model, optimizer=opt, first_step=start)
    logger.device_ops = state.ops
    if engine is not None:
        engine.take_figures()
        logger.rank_figures = lambda: _fsdp_step_figures(engine)
    solo = _solo_runner(cfg, world, state) if getattr(cfg, "solo_between_steps", False) and world.size > 1 else None
    solo_seconds: dict[int, float] = {}  # --solo-between-steps: this rank alone after each timed step
    for step in range(start, cfg.steps):
        start_row = sum(balance.counts[:world.rank])
        stop_row = start_row + balance.counts[world.rank]
        x, y = make_batch(state.task, step, start_row, stop_row)
        x, y = x.to(device), y.to(device)
        with logger.step(samples=stop_row - start_row) as rec:
            rec.loss, rec.loss_scale, rec.step_skipped = one_step(cfg, model, opt, scaler, x, y, distributed=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        steps_taken[0] += 0 if rec.step_skipped else 1
        balance.after_step(stop_row - start_row, logger.mine[-1]["compute_seconds"])
        if solo is not None and step - start >= cfg.warmup_steps:
            solo_seconds[step] = solo(step)
        if on_step is not None and logger.lines:
            on_step(step + 1, cfg.steps, f"step {step + 1}/{cfg.steps} loss {logger.lines[-1]['loss']:.4g}")
        if saver is not None and saver.due(step + 1):
            from hetbench.pytorch.checkpoint import full_state, shard_pieces, writer

            if engine is not None:  # every rank writes its own slices
                saver.save(step + 1, shard_pieces(engine, opt, cfg.optimizer))
            else:
                full_now = full_state(model, opt)  # collective: every rank takes part in the gather
                saver.save(step + 1, [], root_files=writer(full_now) if world.rank == ROOT else None)
            if logger.pg is not None:
                logger.pg.metrics.take()  # the save's gathers are not the next step's communication
    if engine is not None:
        engine.close()  # its progress engine's thread: no gather is started after the last step
    full = engine.full_state_dict() if engine is not None else _full_state(cfg, model)
    collectives = _steps_collectives(logger.mine, world.size)
    offloaded = state.ops is not None
    facts = {"host": world.host, "backend": state.opened.spec,
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
    logs = [StepLog(step=m["step"], loss=float("nan"), step_seconds=m["step_seconds"],
                    compute_seconds=m["compute_seconds"], comm_seconds=m["comm_seconds"] or 0.0,
                    idle_seconds=m["idle_seconds"] or 0.0, samples=m["samples"], param_bytes=m["param_bytes"],
                    grad_bytes=m["grad_bytes"], optimizer_bytes=m["optimizer_bytes"],
                    solo_step_seconds=solo_seconds.get(m["step"])) for m in logger.mine]
    every_solo = world.gather(solo_seconds) if solo is not None else None
    note = state.device.note
    if offloaded:
        note = (f"torch cannot drive {state.opened.spec} ({state.opened.info.name}): the model's matmuls (nn.Linear's "
                "and attention's, forward and backward) run there through hetbench"
                f"{' (GEMM and copy time modelled)' if state.ops.modelled else ''}, the rest in torch on the CPU")
    details = {"strategy": cfg.strategy, "frontend": "torch", "collectives": collectives,
               "torch_version": str(torch.__version__), "note": note, **balance.details()}
    if engine is not None:
        details.update(_fsdp_details(engine, blocking, opt))
        for log, m in zip(logs, logger.mine):
            log.gather_exposed_seconds = m.get("gather_exposed_seconds") if engine.prefetch else None
        details["step_figures"] = [{"gathered_bytes_peak": m.get("gathered_bytes_peak", 0)} for m in logger.mine]
    shares = list(balance.counts)
    result = RankOutcome(logs, facts, list(weights), list(shares), details=details, start_step=start,
                         resumed_from=str(state.resume.folder) if state.resume is not None else None,
                         checkpoints=list(saver.saved) if saver is not None else [])
    if world.rank == ROOT:
        result.steps = [dict(line) for line in logger.lines]
        for log, line in zip(logs, result.steps):
            log.loss = line["loss"]
        if engine is not None and engine.prefetch:
            _add_hidden(result.steps, blocking, [u.index for u in engine.units])
        if every_solo is not None:
            for line in result.steps:
                for entry in line["ranks"]:
                    seconds = every_solo[entry["rank"]].get(line["step"])
                    if seconds is not None:
                        entry["solo_step_seconds"] = seconds
        if cfg.log is not None:
            import json

            result.log_text = "".join(json.dumps(line) + "\n" for line in result.steps)
        if cfg.check:
            result.check = check_against_one_process(cfg, state.task, [s["loss"] for s in result.steps], full, start,
                                                     [s["step_skipped"] for s in result.steps], before)
    return result


def _solo_runner(cfg: Any, world: World, state: TorchTrainState) -> Any:
    """--solo-between-steps (the numpy trainer's, hetbench.benchmarks.train.run._solo_runner): `solo(step)`,
    collective, after a timed step: every rank in turn, the others waiting at a barrier, trains the whole batch
    alone (a fresh plain model of the task on the rank's device, its matmuls offloaded as in the run, the same
    optimizer and dtype, SOLO_STEPS steps from `step`'s data, no process group) and returns its last step's
    seconds (wall time; on a simulated device the modelled GEMM and copy time in place of their emulation). The
    plain model does without fsdp's gathers and reduce-scatters, which one rank would still make as copies: a solo
    step a little faster than `hetbench train -n 1` times, a baseline that errs high."""
    from hetbench.train.outcome import SOLO_STEPS

    device = state.device.device

    def alone_once(step: int) -> float:
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

    def solo(step: int) -> float:
        return world.in_turn(lambda: alone_once(step))

    return solo


def _optimizer_steps(opt: torch.optim.Optimizer) -> int:
    """The steps the optimizer has taken (AdamW's step count; 0 for SGD, which keeps none)."""
    for s in opt.state.values():
        if "step" in s:
            return int(float(s["step"]))
    return 0


def _fsdp_step_figures(engine: Any) -> dict[str, Any]:
    """A step's own figures of hetbench fsdp for the step line: every prefetched gather's exposed seconds (and its
    unit), the gathered bytes at the step's peak."""
    f = engine.take_figures()
    return {"gather_exposed_seconds": f.exposed_seconds, "gather_units": f.exposed_units,
            "gathered_bytes_peak": f.gathered_bytes_peak}


def _fsdp_details(engine: Any, blocking: list[float] | None, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """hetbench fsdp's run figures: the shards, the units left empty, the bytes of sharded state held, the
    prefetch and its yardstick (gather_seconds_blocking: one prefetched gather's blocking time, averaged over a
    step's prefetched gathers, so that the summary's comm_hidden_percent weighs each unit by its own)."""
    units_ = engine.units
    seq = engine.prefetched_units()
    mean_blocking = (sum(blocking[i] for i in seq) / len(seq)) if blocking and seq else None
    return {"prefetch": engine.prefetch, "gather_seconds_blocking": mean_blocking,
            "gather_seconds_blocking_per_unit": blocking,
            "prefetched_gathers_per_step": len(seq) if engine.prefetch else 0,
            "units": [{"name": u.name or "root", "elements": u.size, "counts": list(u.counts)} for u in units_],
            "shard_elements": engine.elements, "element_weights": list(engine.element_weights),
            "empty_units": engine.empty_units(), **engine.state_bytes(opt)}


def _add_hidden(lines: list[dict[str, Any]], blocking: list[float] | None, unit_ids: list[int]) -> None:
    """Each step line's prefetched gathers: exposed seconds (per gather the least of the ranks': the rank that
    arrived last waited for no one) and hidden seconds (blocking - exposed, at least 0, each gather against its
    own unit's blocking time), as the numpy trainer's benchmarks.train.run.gathers_hidden."""
    for line in lines:
        ranks = line["ranks"]
        per_rank = [r.get("gather_exposed_seconds") or [] for r in ranks]
        if blocking is None or not per_rank or any(len(p) != len(per_rank[0]) for p in per_rank):
            continue
        units_ = ranks[0].get("gather_units") or []
        exposed = [min(times) for times in zip(*per_rank)]
        line["gather_exposed_seconds"] = sum(exposed)
        line["comm_hidden_seconds"] = sum(max(0.0, blocking[u] - e) for u, e in zip(units_, exposed))


def _steps_collectives(mine: list[dict[str, Any]], ranks: int) -> dict[str, dict[str, Any]]:
    """This rank's collective figures summed over the training steps (not the checkpoint saves' and final state's
    gathers, which happen between steps)."""
    from hetbench.pytorch.metrics import OpTotals, figures

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


def _autocast(cfg: Any, device: torch.device) -> Any:
    """Mixed precision (--dtype fp16/bf16): torch's autocast on the rank's device (fp32 master parameters,
    gradients and optimizer state; matmuls in the dtype); fp32: nothing."""
    import contextlib

    if cfg.dtype.name == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.float16 if cfg.dtype.name == "fp16" else torch.bfloat16)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def one_step(cfg: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: LossScaler, x: torch.Tensor,
             y: torch.Tensor, distributed: bool) -> tuple[torch.Tensor, float, bool]:
    """One training step, the same in the distributed run and the one-process reference: this part of the global
    mean loss, backward (fp16: at the loss scale), and, under mixed precision, the verdict on non-finite gradients
    agreed over the ranks (each FSDP2 rank sees only its shards) before the update is taken or skipped, as the
    numpy trainer's LossScaler does (hetbench/train/precision.py). Returns (loss, the scale used, skipped)."""
    scale = scaler.scale
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
    rows = task.batch * (task.seq_len if task.task == "gpt" else 1)
    out = compare_with_reference(cfg.dtype.name, cfg.optimizer, cfg.steps, start, losses, ref_losses[start:],
                                 skipped, ref_own[start:], norm_diff, tensor_diff, param_diff,
                                 params is not None and not missing, int(max(rows, task.hidden)))
    return {**out, "params_missing": missing, "reference": "torch, one process, CPU"}


def _saver(cfg: Any, world: World, state: TorchTrainState, weights: list[float], shares: list[int],
           start: int, scaler: LossScaler, engine: Any = None, steps_taken: list[int] | None = None,
           skips: list[int] | None = None) -> Any:
    """Collective (with --checkpoint): the numpy trainer's Saver (layout, atomic saves, manifest last) writing the
    torch state; the manifest records the task, the run and every rank's device (and, for fsdp's sharded pieces,
    the units' layout and the optimizer's step count)."""
    if cfg.checkpoint is None:
        return None
    import click

    from hetbench.pytorch.checkpoint import task_facts
    from hetbench.train.checkpoint import TORCH_FORMAT, Saver

    offloaded = state.ops is not None
    facts = {"host": world.host, "backend": state.opened.spec,
             "vendor": state.opened.info.vendor if offloaded else state.device.vendor,
             "device": state.opened.info.name if offloaded else state.device.name,
             "torch_device": state.device.torch_device}
    every_facts = world.allgather(facts)
    history = []
    if state.resume is not None:
        m = state.resume.manifest
        history = [*m.get("history", []), {"strategy": m.get("strategy"), "first_step": m.get("first_step"),
                                           "steps_done": m["steps_done"], "weights": m.get("weights"),
                                           "checkpoint": str(state.resume.folder), "ranks": m.get("ranks")}]
    manifest = {"frontend": "torch", "model": task_facts(cfg), "optimizer": cfg.optimizer, "lr": cfg.lr,
                "dtype": cfg.dtype.name, "master_dtype": "fp32", "strategy": cfg.strategy, "weights": list(weights), "shares": list(shares),
                "shares_of": "samples", "first_step": start, "history": history,
                "torch_version": str(torch.__version__)}
    if engine is not None:
        manifest["layout"] = [u.layout.to_dict() for u in engine.units]
        manifest["param_counts"] = [list(u.counts) for u in engine.units]

    def live() -> dict[str, Any]:
        return {"loss_scaler": scaler.state(), SKIPPED_KEY: None if skips is None else list(skips),
                **({"optimizer_steps": steps_taken[0]} if engine is not None and steps_taken else {})}

    return Saver(world, cfg.checkpoint, cfg.checkpoint_every, cfg.steps, manifest, every_facts,
                 error=click.ClickException, fmt=TORCH_FORMAT, live=live)


def summary_extra(cfg: Any, gathered: list[RankOutcome]) -> dict[str, Any]:
    """The torch front end's own summary figures: the task, torch's version, where each rank computed, and the
    backend's collective figures per rank, summed over the training steps (nccl-tests algbw/busbw)."""
    root = gathered[ROOT]
    return {
        "frontend": "torch",
        "task": describe(task_config(cfg)),
        "torch_version": root.details.get("torch_version"),
        "torch_devices": [g.facts.get("torch_device") for g in gathered],
        "torch_notes": [g.details.get("note", "") for g in gathered],
        "collectives_per_rank": [g.details.get("collectives", {}) for g in gathered],
        **(_sharded_summary(gathered) if _strategy(cfg).shards_by_weights else {}),
    }


def _sharded_summary(gathered: list[RankOutcome]) -> dict[str, Any]:
    """hetbench fsdp: what each rank holds of the sharded state between steps (parameters + gradients + optimizer
    state, bytes, and its percent of all ranks'), its elements and their percent against its weight's, the units
    a rank holds nothing of (a weight too small for them), and the most it held gathered at once."""
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
        "gathered_bytes_peak_per_rank": [max((s.get("gathered_bytes_peak", 0) for s in x.get("step_figures", [])),
                                             default=0) for x in d],
    }}
