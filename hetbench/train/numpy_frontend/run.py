"""`hetbench train` (the numpy front end) on each rank: the weights resolved (even, given, a profile's rates, or
each rank's GEMM rate at a layer's shape measured beside the others), the strategy's training loop run on the rank's
device (hetbench/train/), every rank's step logs gathered to rank 0, and the loss curve checked there against the
same training in one process."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from hetbench.backends.base import MPI_MEMORY_NONE, TIMING_MODELLED, capabilities
from hetbench.comm.world import World
from hetbench.harness import probe
from hetbench.harness import split_plan as plan
from hetbench.harness.devices import OpenDevice, device_path_error
from hetbench.results.profile import ProfileError, load_profile
from hetbench.train import strategies
from hetbench.train.checkpoint import Checkpoint, CheckpointError
from hetbench.train.model import ModelConfig
from hetbench.harness.ops import Ops
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
from hetbench.train.reference import reference
from hetbench.train.run import history, log_text, resolve_weights, saver, solo_runner, warmup_errors
from hetbench.train.summary import gathers_hidden, reduction, warmup


@dataclass
class TrainState:
    opened: OpenDevice
    ops: Any  # hetbench.harness.ops.Ops over the rank's device
    devices: list[tuple[str, str]] = field(default_factory=list)
    profile: Any = None
    resume: Any = None  # hetbench.train.checkpoint.Checkpoint with --resume
    scaler: Any = None  # hetbench.train.precision.LossScaler: the run's loss scale (restored with --resume)


# A test hook: "1" makes a host-backend rank keep its training state as a GPU rank does (Ops(resident=True)),
# its arrays standing for device arrays and every move between host and "device" a real copy, so that the
# staging of `--path host` and the direct hand-over of `--path device` run where there is no GPU
RESIDENT_ENV = "HETBENCH_TRAIN_RESIDENT"


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[TrainState, list[str]]:
    stand_in = os.environ.get(RESIDENT_ENV) == "1" and capabilities(opened.backend.name).computes_on_host_arrays
    resident = True if stand_in else None
    return TrainState(opened, Ops(opened.backend, cfg.dtype, resident=resident)), []


def check(cfg: Any, world: World, state: TrainState) -> list[str]:
    """Collective: a profile is loaded and matched to the job's devices; its rates must leave work where the
    strategy needs it."""
    state.devices = [tuple(d) for d in world.allgather((state.opened.spec, state.opened.info.name))]
    errors = checkpoint_errors(cfg, state)
    if not errors:
        errors += warmup_errors(cfg, state.resume.steps_done if state.resume is not None else 0)
    # --path device: a rank whose state would live in GPU memory (a CuPy GPU, or a simulated one) needs an MPI that
    # takes GPU buffers, as in collectives; an OpenCL rank keeps its state in host memory, which MPI takes anyway
    if cfg.path == "device" and state.opened.backend.mpi_memory_kind() != MPI_MEMORY_NONE:
        error = device_path_error(state.opened.backend, state.opened.info, cfg.dtype, world)
        if error:
            errors.append(error)
    if cfg.weights.kind != "profile":
        return errors
    try:
        state.profile = load_profile(cfg.weights.path, world.size, cfg.dtype.name, "rows", state.devices,
                                     shape=(cfg.batch, cfg.hidden, cfg.hidden))
    except ProfileError as e:
        return [*errors, str(e)]
    return errors


def checkpoint_errors(cfg: Any, state: TrainState) -> list[str]:
    """--resume: the checkpoint is complete and of this run (model, optimizer, lr) and --steps goes beyond it;
    --checkpoint: a folder (or none yet) that holds none of the step folders this run would save. Every rank
    checks for itself (the folders must be on a file system every rank sees), so every rank finds the same."""
    errors: list[str] = []
    start = 0
    if getattr(cfg, "resume", None) is not None:
        try:
            state.resume = Checkpoint(cfg.resume)
            errors += state.resume.mismatches(cfg.layers, cfg.hidden, cfg.batch, cfg.seed, cfg.optimizer, cfg.lr,
                                              cfg.steps, dtype=cfg.dtype.name)
            start = state.resume.steps_done
        except CheckpointError as e:
            errors.append(str(e))
    if not errors:
        errors += checkpoint_folder_errors(getattr(cfg, "checkpoint", None), cfg.checkpoint_every, start, cfg.steps)
    return errors


def _weights(cfg: Any, world: World, state: TrainState) -> list[float]:
    """Collective. The weights the shares are taken from; auto: each rank's GEMM rate at a layer's shape (its even
    share of the batch x hidden x hidden) in the dtype its GEMM really runs in (the reduced one where native, fp32
    where mixed precision emulates it), all ranks at once."""
    def gemm_rate() -> float:
        rate, _ = probe.gemm_rate(state.opened.backend, state.ops.gemm_dtype, "rows", cfg.batch, cfg.hidden,
                                  cfg.hidden, max_part=-(-cfg.batch // world.size), min_seconds=0.02, seed=cfg.seed)
        return rate

    return resolve_weights(cfg, world, state.profile, gemm_rate)


def run_rank(cfg: Any, world: World, state: TrainState,
             on_step: Callable[[int, int, str], None] | None = None) -> RankOutcome:
    """Collective. Train with the strategy's loop; rank 0 gathers every rank's step logs and checks the curve."""
    weights = _weights(cfg, world, state)
    strategy = strategies.get("numpy", cfg.strategy)
    shares = plan.shares(weights, cfg.layers if strategy.shares_of == "layers" else cfg.batch)
    model = ModelConfig(layers=cfg.layers, hidden=cfg.hidden, batch=cfg.batch, seed=cfg.seed)
    facts = _facts(cfg, world, state)
    resume = state.resume
    start = resume.steps_done if resume is not None else 0
    scaler = state.scaler = LossScaler.for_dtype(cfg.dtype, resume.loss_scaler if resume is not None else None)
    # the steps skipped so far, for a checkpoint and the check (the reference follows the run's verdicts)
    before = skipped_before(resume.manifest if resume is not None else None)
    saver_ = _saver(cfg, world, facts, weights, shares, start, resume, scaler, record_skips(scaler, start, before))
    solo = (solo_runner(world, _alone(cfg, state, model, strategy)) if cfg.solo_between_steps and world.size > 1
            else None)

    def step_done(log: Any) -> None:
        if solo is not None and log.step - start >= warmup(cfg):  # the timed steps: each followed by the solo ones
            log.solo_step_seconds = solo(log.step)
        if on_step is not None:
            on_step(log.step + 1, cfg.steps, f"step {log.step + 1}/{cfg.steps} loss {log.loss:.4g}")

    with scaler.quiet():  # mixed precision: overflows are expected, and the scaler handles them
        outcome = strategy.applier()(world, state.ops, model, cfg.optimizer, cfg.lr, cfg.steps - start, weights,
                                     path=cfg.path, micro_batches=cfg.micro_batches, on_step=step_done,
                                     **_loop_options(cfg, strategy, start, resume, saver_, scaler))
    # fsdp and ddp report the batch shares they ended with (auto weights rebalance them in the first steps)
    result = RankOutcome(list(outcome.logs), facts, list(weights), list(outcome.details.get("batch_counts", shares)),
                         details=dict(outcome.details), start_step=start,
                         resumed_from=str(resume.folder) if resume is not None else None,
                         checkpoints=list(saver_.saved) if saver_ is not None else [])
    every = world.gather(outcome.logs)
    every_facts = world.gather(facts)
    if world.rank == ROOT:
        assert every is not None and every_facts is not None
        result.steps = _step_lines(cfg, every, every_facts, outcome.details.get("gather_seconds_blocking"))
        if cfg.log is not None:
            result.log_text = log_text(result.steps)
        if cfg.check:
            result.check = _check(cfg, model, [log.loss for log in outcome.logs], outcome.params, start,
                                  [log.step_skipped for log in outcome.logs], before)
    return result


def _facts(cfg: Any, world: World, state: TrainState) -> dict[str, Any]:
    """The rank's facts for its row: its device, how its time is taken, its GEMMs' dtype and path (mixed precision:
    in the dtype on the device itself, or emulated: fp32 GEMMs on rounded operands, timed at fp32's rate; see
    hetbench/harness/ops.py) and where its training state lives ("device": a GPU's array library, "host": NumPy)."""
    return {"host": world.host, "backend": state.opened.spec, "vendor": state.opened.info.vendor,
            "device": state.opened.info.name, "device_timing": state.opened.backend.timing,
            "compute_dtype": cfg.dtype.name, "compute_path": state.ops.compute_path,
            "state_memory": "device" if state.ops.resident else "host"}


def _loop_options(cfg: Any, strategy: strategies.Strategy, start: int, resume: Any, saver_: Any,
                  scaler: LossScaler) -> dict[str, Any]:
    """The strategy's training loop's keyword options: where it starts, the checkpoint hook, the loss scaler, and
    those the strategy takes (--prefetch) or needs (auto weights' rebalancing of the batch shares)."""
    options = {"start_step": start, "initial": resume, "checkpoint": saver_.hook if saver_ is not None else None,
               "scaler": scaler}
    if "prefetch" in strategy.options:
        options["prefetch"] = cfg.prefetch
    if strategy.shares_of == "samples" and cfg.weights.kind == "auto":
        options["rebalance_steps"] = AUTO_REBALANCE_STEPS
    return options


def _alone(cfg: Any, state: TrainState, model: ModelConfig, strategy: strategies.Strategy) -> Callable[[int], float]:
    """--solo-between-steps (train.run.solo_runner): this rank trains the whole batch alone, a fresh run of the same
    strategy on one rank (COMM_SELF, the same device and dtype, SOLO_STEPS steps from the step's data); its last
    step's seconds, as `hetbench train` alone would time it."""
    from mpi4py import MPI  # MPI starts on import: only a run with solo steps reaches here

    alone = World(MPI.COMM_SELF)
    train = strategy.applier()

    def alone_once(step: int) -> float:
        out = train(alone, state.ops, model, cfg.optimizer, cfg.lr, SOLO_STEPS, [1.0], path=cfg.path,
                    micro_batches=cfg.micro_batches, start_step=step, scaler=LossScaler.for_dtype(cfg.dtype))
        return float(out.logs[-1].step_seconds)

    return alone_once


def _saver(cfg: Any, world: World, facts: dict[str, Any], weights: list[float], shares: list[int], start: int,
           resume: Any, scaler: Any = None, skips: list[int] | None = None) -> Any:
    """Collective (with --checkpoint): the checkpoint saver, its manifest's run facts and every rank's device; each
    save also records the loss scaler's state then (the same on every rank), which a resume restores."""
    if cfg.checkpoint is None:
        return None
    keys = ("host", "backend", "vendor", "device")
    manifest = {
        "model": {"layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch, "seed": cfg.seed},
        "optimizer": cfg.optimizer, "lr": cfg.lr, "dtype": cfg.dtype.name, "master_dtype": "fp32",
        "strategy": cfg.strategy, "weights": list(weights), "shares": list(shares),
        "shares_of": strategies.get(cfg.frontend, cfg.strategy).shares_of,
        "first_step": start,
        "history": history(resume, lambda ranks: [{k: r.get(k) for k in ("rank", *keys)} for r in ranks]),
    }
    live = ((lambda: {"loss_scaler": scaler.state(), SKIPPED_KEY: None if skips is None else list(skips)})
            if scaler is not None else None)
    return saver(cfg, world, manifest, {k: facts[k] for k in (*keys, "device_timing")}, live)


def _check(cfg: Any, model: Any, losses: list[float], params: Any, start: int = 0,
           skipped: list[bool] | None = None, before: list[int] | None = None) -> dict[str, Any]:
    """The same training in one process (NumPy on the host), from step 0, in the run's dtype with the same loss
    scaler following the run's skip verdicts (`before`: the steps skipped before a resume, None where not known):
    the loss curve (a resumed run's steps against the reference's same steps) and the final parameters, within
    outcome.py's tolerances for the steps, dtype and optimizer."""
    skipped = list(skipped) if skipped is not None else [False] * len(losses)
    trace: list[dict[str, Any]] = []
    ref_losses, ref_params = reference(model, cfg.optimizer, cfg.lr, cfg.steps, dtype=cfg.dtype.name, trace=trace,
                                       follow=follow_verdicts(cfg.steps, start, before, skipped))
    ref_losses = ref_losses[start:]
    ref_own = [t["own_verdict"] for t in trace][start:]
    param_diff = tensor_diff = norm_diff = 0.0
    if params is not None:
        got_all, want_all = [], []
        for (w, b), (rw, rb) in zip(params, ref_params):
            got = np.concatenate([w.ravel(), b.ravel()]).astype(np.float64)
            want = np.concatenate([rw.ravel(), rb.ravel()]).astype(np.float64)
            param_diff = max(param_diff, float(abs(got - want).max()) / max(float(abs(want).max()), 1e-30))
            tensor_diff = max(tensor_diff, float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30))
            got_all.append(got)
            want_all.append(want)
        got, want = np.concatenate(got_all), np.concatenate(want_all)
        norm_diff = float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30)
    return compare_with_reference(cfg.dtype.name, cfg.optimizer, cfg.steps, start, losses, ref_losses, skipped,
                                  ref_own, norm_diff, tensor_diff, param_diff, params is not None,
                                  reduction(cfg))


def _step_lines(cfg: Any, every: list[list[Any]], facts: list[dict[str, Any]],
                blocking: float | None = None) -> list[dict[str, Any]]:
    """One line per step: the global loss, the step's time (the slowest rank's), samples/s, fsdp's prefetched
    gathers' exposed and hidden seconds, and every rank's compute, communication and idle seconds, samples and
    bytes held."""
    modelled = any(f["device_timing"] == TIMING_MODELLED for f in facts)
    lines = []
    for i, logs in enumerate(zip(*every)):
        step_seconds = max(log.step_seconds for log in logs)
        hidden = gathers_hidden(logs, blocking)
        lines.append({
            "step": logs[0].step,
            "loss": logs[0].loss,
            "step_seconds": step_seconds,
            "samples_per_second": cfg.batch / step_seconds if step_seconds > 0 else None,
            "timing": "modelled" if modelled else "measured",
            **({} if hidden is None else {"gather_exposed_seconds": hidden[0], "comm_hidden_seconds": hidden[1]}),
            "loss_scale": logs[0].loss_scale,  # the same on every rank: the scaler's verdicts are global
            "step_skipped": logs[0].step_skipped,
            "ranks": [{"rank": r, "compute_seconds": log.compute_seconds, "comm_seconds": log.comm_seconds,
                       "idle_seconds": log.idle_seconds, "samples": log.samples, "param_bytes": log.param_bytes,
                       "grad_bytes": log.grad_bytes, "optimizer_bytes": log.optimizer_bytes,
                       **({} if log.solo_step_seconds is None else {"solo_step_seconds": log.solo_step_seconds})}
                      for r, log in enumerate(logs)],
        })
    return lines


class NumpyFrontEnd:
    """The numpy front end (train/frontend.py's FrontEnd): hetbench's own trainer."""

    prepare = staticmethod(prepare)
    check = staticmethod(check)
    run_rank = staticmethod(run_rank)

    @staticmethod
    def summary_extra(cfg: Any, gathered: Any) -> dict[str, Any]:
        return {}


FRONTEND = NumpyFrontEnd()
