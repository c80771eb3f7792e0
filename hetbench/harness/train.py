"""The training run on each rank (`hetbench train`): the weights resolved (even, given, a profile's rates, or each
rank's GEMM rate at a layer's shape measured beside the others), the strategy run (hetbench/train/), every rank's
step logs gathered to rank 0, and the loss curve checked there against the same training in one process."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from hetbench.backends.base import TIMING_MODELLED
from hetbench.benchmarks import split_plan as plan
from hetbench.comm.world import World
from hetbench.harness.devices import OpenDevice

ROOT = 0
# The check: the distributed run sums in another order than the single process, so its fp32 losses and parameters
# drift apart by rounding; over the default 300 steps the losses stay within this relative difference
CHECK_RTOL = 1e-3
# Mixed precision (--dtype fp16/bf16). Each GEMM's result is rounded to the dtype where it falls, and a rank's
# part of a weight gradient (its rows) is rounded before the ranks' parts are summed in fp32, where one process
# rounds the whole batch's: the distributed run and the reference differ by the dtype's rounding (2**-11, 2**-8),
# not fp32's, and the difference grows as the curves go on. Measured (hetbench train, adamw lr 0.01, fsdp, ddp and
# pipeline on 2 ranks host,opencl weights 3,1 and 3 ranks host,opencl,sim:mi300x weights 0.5,0.3,0.2), largest
# relative difference from the reference:
#   4 layers x 16, batch 24, 40 steps:   losses fp16 2.2e-3, bf16 8.3e-3; parameters fp16 0.042, bf16 0.053
#   same, 300 steps:                     losses fp16 0.070, bf16 0.092;  parameters fp16 0.13, bf16 0.24;
#                                        mean of the last 10 losses fp16 0.019, bf16 0.032
#   4 x 32, batch 64 (default), 300:     bf16: losses in the first 40 steps 4.9e-3, all 0.13, parameters 0.93-1.25
#                                        (other minima: the curves wander apart), last-10 mean 0.064;
#                                        fp16: the reference's step 0 overflowed (the whole batch's weight gradient
#                                        beyond 65504 at scale 2**16) where no rank's part did, so the runs skip
#                                        different steps and differ by one whole update: first 40 steps 0.14, the
#                                        last-10 mean 0.18-0.24.
# So under mixed precision the check is what holds: the losses step by step in the first MIXED_EARLY_STEPS steps,
# up to the first step that the run and the reference decide differently (skip or not), within
# CHECK_RTOL_BY_DTYPE; the final parameters within PARAM_RTOL_BY_DTYPE only when the whole run lies in that window
# with the same verdicts; and the mean of the last MIXED_FINAL_STEPS losses within MIXED_FINAL_BAND of the
# reference's (the run learns as far as one process does). Tolerances: the measured figures with a margin of 2-5x
# (the narrowest: bf16 parameters after 40 steps of the default 4 x 32 model, host + sim:mi300x, --weights auto:
# 0.094 against 0.2).
CHECK_RTOL_BY_DTYPE = {"fp32": CHECK_RTOL, "fp16": 1e-2, "bf16": 3e-2}
PARAM_RTOL_BY_DTYPE = {"fp32": CHECK_RTOL, "fp16": 0.15, "bf16": 0.2}
MIXED_EARLY_STEPS = 40
MIXED_FINAL_STEPS = 10
MIXED_FINAL_BAND = 0.5


@dataclass
class TrainState:
    opened: OpenDevice
    ops: Any  # hetbench.train.ops.Ops over the rank's device
    devices: list[tuple[str, str]] = field(default_factory=list)
    profile: Any = None
    resume: Any = None  # hetbench.train.checkpoint.Checkpoint with --resume
    scaler: Any = None  # hetbench.train.precision.LossScaler: the run's loss scale (restored with --resume)


@dataclass
class RankOutcome:
    logs: list[Any]  # this rank's StepLog per step
    facts: dict[str, Any]
    weights: list[float]
    shares: list[int]
    check: dict[str, Any] | None = None  # at rank 0
    steps: list[dict[str, Any]] | None = None  # at rank 0: one line per step, every rank's figures
    log_text: str | None = None  # at rank 0: the --log file
    start_step: int = 0  # with --resume: the steps the checkpoint had done; this run's logs start there
    resumed_from: str | None = None
    checkpoints: list[str] = field(default_factory=list)  # the step folders saved


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[TrainState, list[str]]:
    from hetbench.train.ops import Ops

    return TrainState(opened, Ops(opened.backend, cfg.dtype)), []


def check(cfg: Any, world: World, state: TrainState) -> list[str]:
    """Collective: a profile is loaded and matched to the job's devices; its rates must leave work where the
    strategy needs it."""
    state.devices = [tuple(d) for d in world.allgather((state.opened.spec, state.opened.info.name))]
    errors = checkpoint_errors(cfg, state)
    if cfg.weights.kind != "profile":
        return errors
    from hetbench.results.profile import ProfileError, load_profile

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
    from hetbench.train.checkpoint import Checkpoint, CheckpointError, planned_collisions

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
    folder = getattr(cfg, "checkpoint", None)
    if folder is not None and not errors:
        if folder.exists() and not folder.is_dir():
            errors.append(f"--checkpoint {str(folder)!r} is not a folder")
        else:
            taken = planned_collisions(folder, cfg.checkpoint_every, start, cfg.steps)
            if taken:
                errors.append(f"checkpoint folder {str(folder)!r} already holds {', '.join(taken)}: a checkpoint is "
                              "never overwritten; choose another --checkpoint folder")
            existing = next((p for p in [folder, *folder.absolute().parents] if p.exists()), None)
            if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
                errors.append(f"--checkpoint {str(folder)!r} cannot be written: no write permission in "
                              f"{str(existing)!r}")
    return errors


def _weights(cfg: Any, world: World, state: TrainState) -> list[float]:
    """Collective. The weights the shares are taken from."""
    kind = cfg.weights.kind
    if kind == "even":
        return [1.0] * world.size
    if kind == "list":
        return list(cfg.weights.values)
    if kind == "profile":
        return list(state.profile.rates)
    from hetbench.harness import probe

    # auto: each rank's GEMM rate at a layer's shape (its even share of the batch x hidden x hidden), all at once
    limit = -(-cfg.batch // world.size)
    world.barrier()
    # the dtype the rank's GEMM really runs in: the reduced one where native, fp32 where mixed precision emulates
    rate, _ = probe.gemm_rate(state.opened.backend, state.ops.gemm_dtype, "rows", cfg.batch, cfg.hidden, cfg.hidden,
                              max_part=limit, min_seconds=0.02, seed=cfg.seed)
    return world.allgather(rate)


def run_rank(cfg: Any, world: World, state: TrainState,
             on_step: Callable[[int, int, str], None] | None = None) -> RankOutcome:
    """Collective. Train with the strategy; rank 0 gathers every rank's step logs and checks the curve."""
    from hetbench.train.model import ModelConfig
    from hetbench.train.precision import LossScaler

    weights = _weights(cfg, world, state)
    total = cfg.layers if cfg.strategy == "pipeline" else cfg.batch
    shares = plan.shares(weights, total)
    model = ModelConfig(layers=cfg.layers, hidden=cfg.hidden, batch=cfg.batch, seed=cfg.seed)
    facts = {"host": world.host, "backend": state.opened.spec, "vendor": state.opened.info.vendor,
             "device": state.opened.info.name, "device_timing": state.opened.backend.timing,
             # mixed precision: the GEMMs in the dtype on the device itself, or emulated (fp32 GEMM on rounded
             # operands, timed at fp32's rate): see hetbench/train/ops.py
             "compute_dtype": cfg.dtype.name, "compute_path": state.ops.compute_path}
    resume = state.resume
    start = resume.steps_done if resume is not None else 0
    scaler = LossScaler.for_dtype(cfg.dtype, resume.loss_scaler if resume is not None else None)
    state.scaler = scaler
    saver = _saver(cfg, world, facts, weights, shares, start, resume, scaler)
    extra = {"start_step": start, "initial": resume, "checkpoint": saver.hook if saver is not None else None,
             "scaler": scaler}

    def step_done(log: Any) -> None:
        if on_step is not None:
            on_step(log.step + 1, cfg.steps, f"step {log.step + 1}/{cfg.steps} loss {log.loss:.4g}")

    if cfg.strategy == "pipeline":
        from hetbench.train.pipeline import train_pipeline as train
    else:
        from hetbench.train.data_parallel import train_ddp, train_fsdp

        train = train_fsdp if cfg.strategy == "fsdp" else train_ddp
    with scaler.quiet():  # mixed precision: overflows are expected, and the scaler handles them
        outcome = train(world, state.ops, model, cfg.optimizer, cfg.lr, cfg.steps - start, weights, path=cfg.path,
                        micro_batches=cfg.micro_batches, on_step=step_done, **extra)
    result = RankOutcome(list(outcome.logs), facts, list(weights), shares, start_step=start,
                         resumed_from=str(resume.folder) if resume is not None else None,
                         checkpoints=list(saver.saved) if saver is not None else [])
    every = world.gather(outcome.logs)
    every_facts = world.gather(facts)
    if world.rank == ROOT:
        assert every is not None and every_facts is not None
        result.steps = _step_lines(cfg, every, every_facts)
        if cfg.log is not None:
            result.log_text = "".join(json.dumps(line) + "\n" for line in result.steps)
        if cfg.check:
            result.check = _check(cfg, model, [log.loss for log in outcome.logs], outcome.params, start,
                                  [log.step_skipped for log in outcome.logs])
    return result


def _saver(cfg: Any, world: World, facts: dict[str, Any], weights: list[float], shares: list[int], start: int,
           resume: Any, scaler: Any = None) -> Any:
    """Collective (with --checkpoint): the checkpoint saver, its manifest's run facts and every rank's device; each
    save also records the loss scaler's state then (the same on every rank), which a resume restores."""
    if cfg.checkpoint is None:
        return None
    import click

    from hetbench.train.checkpoint import Saver

    every_facts = world.allgather({k: facts[k] for k in ("host", "backend", "vendor", "device", "device_timing")})
    history = []
    if resume is not None:
        m = resume.manifest
        history = [*m.get("history", []),
                   {"strategy": m.get("strategy"), "first_step": m.get("first_step"), "steps_done": m["steps_done"],
                    "weights": m.get("weights"), "checkpoint": str(resume.folder),
                    "ranks": [{k: r.get(k) for k in ("rank", "host", "backend", "vendor", "device")}
                              for r in m["ranks"]]}]
    manifest = {
        "model": {"layers": cfg.layers, "hidden": cfg.hidden, "batch": cfg.batch, "seed": cfg.seed},
        "optimizer": cfg.optimizer, "lr": cfg.lr, "dtype": cfg.dtype.name, "master_dtype": "fp32",
        "strategy": cfg.strategy, "weights": list(weights), "shares": list(shares),
        "shares_of": "layers" if cfg.strategy == "pipeline" else "samples",
        "first_step": start, "history": history,
    }
    return Saver(world, cfg.checkpoint, cfg.checkpoint_every, cfg.steps, manifest, every_facts,
                 error=click.ClickException,
                 live=(lambda: {"loss_scaler": scaler.state()}) if scaler is not None else None)


def _check(cfg: Any, model: Any, losses: list[float], params: Any, start: int = 0,
           skipped: list[bool] | None = None) -> dict[str, Any]:
    """The same training in one process (NumPy on the host), from step 0, in the run's dtype with the same loss
    scaler: the loss curve (a resumed run's steps against the reference's same steps) and the final parameters,
    within CHECK_RTOL_BY_DTYPE. The steps each skipped (mixed precision) are reported beside."""
    from hetbench.train.reference import reference

    trace: list[dict[str, Any]] = []
    ref_losses, ref_params = reference(model, cfg.optimizer, cfg.lr, cfg.steps, dtype=cfg.dtype.name, trace=trace)
    ref_losses = ref_losses[start:]
    ref_skipped = [t["step_skipped"] for t in trace][start:]
    skipped = list(skipped) if skipped is not None else [False] * len(losses)
    rtol, param_rtol = CHECK_RTOL_BY_DTYPE[cfg.dtype.name], PARAM_RTOL_BY_DTYPE[cfg.dtype.name]
    mixed = cfg.dtype.name != "fp32"
    rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses)]
    param_diff = 0.0
    if params is not None:
        for (w, b), (rw, rb) in zip(params, ref_params):
            for got, want in ((w, rw), (b, rb)):
                scale = max(float(abs(want).max()), 1e-30)
                param_diff = max(param_diff, float(abs(got - want).max()) / scale)
    same_length = len(losses) == len(ref_losses)
    if not mixed:
        loss_diff = max(rel)
        ok = bool(loss_diff <= rtol and param_diff <= rtol and same_length)
        return {"ok": ok, "max_loss_relative_difference": loss_diff, "max_param_relative_difference": param_diff,
                "rtol": rtol, "dtype": cfg.dtype.name, "reference_loss_first": ref_losses[0],
                "reference_loss_last": ref_losses[-1], "skipped_steps": 0, "reference_skipped_steps": 0}
    # mixed precision: see CHECK_RTOL_BY_DTYPE's comment
    differ = next((i for i, (a, b) in enumerate(zip(skipped, ref_skipped)) if a != b), len(rel))
    window = [i for i in range(min(differ, len(rel))) if start + i < MIXED_EARLY_STEPS]
    loss_diff = max((rel[i] for i in window), default=0.0)
    tail = min(MIXED_FINAL_STEPS, len(losses))
    ref_tail = sum(ref_losses[-tail:]) / tail
    final_diff = abs(sum(losses[-tail:]) / tail - ref_tail) / max(abs(ref_tail), 1e-30)
    params_checked = params is not None and differ >= len(rel) and cfg.steps <= MIXED_EARLY_STEPS
    ok = bool(same_length and loss_diff <= rtol and final_diff <= MIXED_FINAL_BAND
              and (param_diff <= param_rtol or not params_checked))
    return {"ok": ok, "max_loss_relative_difference": loss_diff, "max_param_relative_difference": param_diff,
            "rtol": rtol, "param_rtol": param_rtol, "dtype": cfg.dtype.name,
            "compared_steps": len(window), "params_checked": params_checked,
            "max_loss_relative_difference_all_steps": max(rel),
            "final_loss_relative_difference": final_diff, "final_band": MIXED_FINAL_BAND,
            "verdicts_agree": differ >= len(rel),
            "reference_loss_first": ref_losses[0], "reference_loss_last": ref_losses[-1],
            "skipped_steps": sum(bool(s) for s in skipped), "reference_skipped_steps": sum(ref_skipped)}


def _step_lines(cfg: Any, every: list[list[Any]], facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per step: the global loss, the step's time (the slowest rank's), samples/s, and every rank's
    compute, communication and idle seconds, samples and bytes held."""
    modelled = any(f["device_timing"] == TIMING_MODELLED for f in facts)
    lines = []
    for i, logs in enumerate(zip(*every)):
        step_seconds = max(log.step_seconds for log in logs)
        lines.append({
            "step": logs[0].step,
            "loss": logs[0].loss,
            "step_seconds": step_seconds,
            "samples_per_second": cfg.batch / step_seconds if step_seconds > 0 else None,
            "timing": "modelled" if modelled else "measured",
            "loss_scale": logs[0].loss_scale,  # the same on every rank: the scaler's verdicts are global
            "step_skipped": logs[0].step_skipped,
            "ranks": [{"rank": r, "compute_seconds": log.compute_seconds, "comm_seconds": log.comm_seconds,
                       "idle_seconds": log.idle_seconds, "samples": log.samples, "param_bytes": log.param_bytes,
                       "grad_bytes": log.grad_bytes, "optimizer_bytes": log.optimizer_bytes}
                      for r, log in enumerate(logs)],
        })
    return lines


def step_lines(cfg: Any, gathered: list[RankOutcome]) -> list[dict[str, Any]]:
    return gathered[ROOT].steps or []


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def rows(cfg: Any, gathered: list[RankOutcome]) -> list[dict[str, Any]]:
    """One row per rank: its share, its step's compute, communication and idle seconds (medians over the steps;
    every step's in the --log file and the document's "steps") and the bytes it held at most."""
    total = sum(gathered[ROOT].shares)
    out = []
    for r, outcome in enumerate(gathered):
        logs = outcome.logs
        out.append({
            "rank": r, **outcome.facts, "strategy": cfg.strategy,
            "weight_percent": 100.0 * gathered[ROOT].shares[r] / total if total else 0.0,
            "samples_per_step": logs[-1].samples if logs else 0,
            "step_seconds_median": _median([log.step_seconds for log in logs]),
            "compute_seconds_median": _median([log.compute_seconds for log in logs]),
            "comm_seconds_median": _median([log.comm_seconds for log in logs]),
            "idle_seconds_median": _median([log.idle_seconds for log in logs]),
            "param_bytes": max((log.param_bytes for log in logs), default=0),
            "grad_bytes": max((log.grad_bytes for log in logs), default=0),
            "optimizer_bytes": max((log.optimizer_bytes for log in logs), default=0),
        })
    return out


def state_scaling(cfg: Any) -> str:
    """The loss scaling kind of a run: "dynamic" (fp16), "none" (bf16: non-finite steps still skipped; fp32)."""
    from hetbench.train.precision import LossScaler

    return LossScaler.for_dtype(cfg.dtype).kind


def summarize_job(cfg: Any, rows_: list[dict[str, Any]], gathered: list[RankOutcome]) -> dict[str, Any]:
    root = gathered[ROOT]
    steps = root.steps or []
    step_seconds = [s["step_seconds"] for s in steps]
    median = _median(step_seconds)
    check = root.check
    modelled = any(r["device_timing"] == TIMING_MODELLED for r in rows_)
    return {
        "strategy": cfg.strategy,
        "steps": cfg.steps,
        "weights_kind": cfg.weights.kind,
        "weights": root.weights,
        "shares": root.shares,
        "shares_of": "layers" if cfg.strategy == "pipeline" else "samples",
        "first_step": root.start_step,
        "resumed_from": root.resumed_from,
        "checkpoints": root.checkpoints,
        "loss_first": steps[0]["loss"] if steps else None,
        "loss_last": steps[-1]["loss"] if steps else None,
        "loss_fell_by": steps[0]["loss"] / steps[-1]["loss"] if steps and steps[-1]["loss"] > 0 else None,
        "step_seconds_median": median,
        "samples_per_second": cfg.batch / median if median > 0 else None,
        "timing": "modelled" if modelled else "measured",
        # a simulated rank's compute is modelled; the step's wall time is measured, and in it such a rank computes
        # on the host with NumPy: the figure of this machine, not of the GPU simulated
        "step_timing": "wall time; simulated ranks compute on the host" if modelled else "wall time",
        "dtype": cfg.dtype.name,
        "master_dtype": "fp32",
        # per rank: its GEMMs native in the dtype, or emulated (fp32 GEMMs on rounded operands, fp32 speed)
        "compute_paths": [r.get("compute_path") for r in rows_],
        "loss_scaling": state_scaling(cfg),
        "skipped_steps": sum(1 for s in steps if s.get("step_skipped")),
        "loss_scale_last": steps[-1]["loss_scale"] if steps else None,
        "check": check,
        "verified": None if check is None else check["ok"],
    }
