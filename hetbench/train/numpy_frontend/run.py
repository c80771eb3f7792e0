"""The training run on each rank (`hetbench train`): the weights resolved (even, given, a profile's rates, or each
rank's GEMM rate at a layer's shape measured beside the others), the strategy run (hetbench/train/), every rank's
step logs gathered to rank 0, and the loss curve checked there against the same training in one process."""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from hetbench.backends.base import MPI_MEMORY_NONE, TIMING_MODELLED, capabilities
from hetbench.harness import split_plan as plan
from hetbench.comm.world import World
from hetbench.harness.devices import OpenDevice
from hetbench.train import strategies
from hetbench.train.outcome import (  # both front ends' pieces
    ROOT,
    AUTO_REBALANCE_STEPS,
    SOLO_STEPS,
    RankOutcome,
    checkpoint_folder_errors,
    compare_with_reference,
    follow_verdicts,
    record_skips,
    skipped_before,
    SKIPPED_KEY,
)


@dataclass
class TrainState:
    opened: OpenDevice
    ops: Any  # hetbench.train.ops.Ops over the rank's device
    devices: list[tuple[str, str]] = field(default_factory=list)
    profile: Any = None
    resume: Any = None  # hetbench.train.checkpoint.Checkpoint with --resume
    scaler: Any = None  # hetbench.train.precision.LossScaler: the run's loss scale (restored with --resume)


# A test hook: "1" makes a host-backend rank keep its training state as a GPU rank does (Ops(resident=True)),
# its arrays standing for device arrays and every move between host and "device" a real copy, so that the
# staging of `--path host` and the direct hand-over of `--path device` run where there is no GPU
RESIDENT_ENV = "HETBENCH_TRAIN_RESIDENT"


def prepare(cfg: Any, world: World, opened: OpenDevice) -> tuple[TrainState, list[str]]:
    from hetbench.train.ops import Ops

    resident = (True if os.environ.get(RESIDENT_ENV) == "1" and capabilities(opened.backend.name).computes_on_host_arrays
                else None)
    return TrainState(opened, Ops(opened.backend, cfg.dtype, resident=resident)), []


def check(cfg: Any, world: World, state: TrainState) -> list[str]:
    """Collective: a profile is loaded and matched to the job's devices; its rates must leave work where the
    strategy needs it."""
    state.devices = [tuple(d) for d in world.allgather((state.opened.spec, state.opened.info.name))]
    errors = checkpoint_errors(cfg, state)
    run_steps = cfg.steps - (state.resume.steps_done if state.resume is not None else 0)
    if not errors and _warmup(cfg) >= run_steps:
        errors.append(f"--warmup-steps {_warmup(cfg)} leaves none of this run's {run_steps} steps to time; "
                      f"accepted: 0 to {run_steps - 1}")
    # --path device: a rank whose state would live in GPU memory (a CuPy GPU, or a simulated one) needs an MPI that
    # takes GPU buffers, as in collectives; an OpenCL rank keeps its state in host memory, which MPI takes anyway
    if cfg.path == "device" and state.opened.backend.mpi_memory_kind() != MPI_MEMORY_NONE:
        from hetbench.harness.devices import device_path_error

        error = device_path_error(state.opened.backend, state.opened.info, cfg.dtype, world)
        if error:
            errors.append(error)
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
    from hetbench.train.checkpoint import Checkpoint, CheckpointError

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
    strategy = strategies.get("numpy", cfg.strategy)
    total = cfg.layers if strategy.shares_of == "layers" else cfg.batch
    shares = plan.shares(weights, total)
    model = ModelConfig(layers=cfg.layers, hidden=cfg.hidden, batch=cfg.batch, seed=cfg.seed)
    facts = {"host": world.host, "backend": state.opened.spec, "vendor": state.opened.info.vendor,
             "device": state.opened.info.name, "device_timing": state.opened.backend.timing,
             # mixed precision: the GEMMs in the dtype on the device itself, or emulated (fp32 GEMM on rounded
             # operands, timed at fp32's rate): see hetbench/train/ops.py
             "compute_dtype": cfg.dtype.name, "compute_path": state.ops.compute_path,
             # where the rank's training state lives: "device" (a GPU's array library), "host" (NumPy)
             "state_memory": "device" if state.ops.resident else "host"}
    resume = state.resume
    start = resume.steps_done if resume is not None else 0
    scaler = LossScaler.for_dtype(cfg.dtype, resume.loss_scaler if resume is not None else None)
    state.scaler = scaler
    # the steps skipped so far, for a checkpoint and the check (the reference follows the run's verdicts)
    before = skipped_before(resume.manifest if resume is not None else None)
    skips = record_skips(scaler, start, before)
    saver = _saver(cfg, world, facts, weights, shares, start, resume, scaler, skips)
    extra = {"start_step": start, "initial": resume, "checkpoint": saver.hook if saver is not None else None,
             "scaler": scaler}

    solo = _solo_runner(cfg, world, state, model, strategy) if cfg.solo_between_steps and world.size > 1 else None

    def step_done(log: Any) -> None:
        if solo is not None and log.step - start >= _warmup(cfg):  # the timed steps: each followed by the solo ones
            log.solo_step_seconds = solo(log.step)
        if on_step is not None:
            on_step(log.step + 1, cfg.steps, f"step {log.step + 1}/{cfg.steps} loss {log.loss:.4g}")

    train = strategy.train_function()
    if strategy.prefetch:
        extra["prefetch"] = cfg.prefetch
    if strategy.rebalances and cfg.weights.kind == "auto":
        extra["rebalance_steps"] = AUTO_REBALANCE_STEPS
    with scaler.quiet():  # mixed precision: overflows are expected, and the scaler handles them
        outcome = train(world, state.ops, model, cfg.optimizer, cfg.lr, cfg.steps - start, weights, path=cfg.path,
                        micro_batches=cfg.micro_batches, on_step=step_done, **extra)
    # fsdp and ddp report the batch shares they ended with (auto weights rebalance them in the first steps)
    shares = list(outcome.details.get("batch_counts", shares))
    result = RankOutcome(list(outcome.logs), facts, list(weights), shares, details=dict(outcome.details),
                         start_step=start,
                         resumed_from=str(resume.folder) if resume is not None else None,
                         checkpoints=list(saver.saved) if saver is not None else [])
    every = world.gather(outcome.logs)
    every_facts = world.gather(facts)
    if world.rank == ROOT:
        assert every is not None and every_facts is not None
        result.steps = _step_lines(cfg, every, every_facts, outcome.details.get("gather_seconds_blocking"))
        if cfg.log is not None:
            result.log_text = "".join(json.dumps(line) + "\n" for line in result.steps)
        if cfg.check:
            result.check = _check(cfg, model, [log.loss for log in outcome.logs], outcome.params, start,
                                  [log.step_skipped for log in outcome.logs], before)
    return result


def _solo_runner(cfg: Any, world: World, state: TrainState, model: Any, strategy: Any) -> Callable[[int], float]:
    """--solo-between-steps: `solo(step)`, collective, made after a timed step of the job: every rank in turn,
    the others waiting at a barrier, trains the whole batch alone (a fresh run of the same strategy on one rank,
    COMM_SELF, the same device and dtype, SOLO_STEPS steps from `step`'s data) and returns its last step's seconds
    (as `hetbench train` alone would time it). What a rank shows alone is then measured seconds from the job's step
    it is set against, not minutes apart in another process: the baseline of efficiency_vs_summed_solo."""
    from mpi4py import MPI

    from hetbench.train.precision import LossScaler

    alone = World(MPI.COMM_SELF)
    train = strategy.train_function()

    def alone_once(step: int) -> float:
        out = train(alone, state.ops, model, cfg.optimizer, cfg.lr, SOLO_STEPS, [1.0], path=cfg.path,
                    micro_batches=cfg.micro_batches, start_step=step, scaler=LossScaler.for_dtype(cfg.dtype))
        return float(out.logs[-1].step_seconds)

    def solo(step: int) -> float:
        return world.in_turn(lambda: alone_once(step))

    return solo


def _saver(cfg: Any, world: World, facts: dict[str, Any], weights: list[float], shares: list[int], start: int,
           resume: Any, scaler: Any = None, skips: list[int] | None = None) -> Any:
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
        "shares_of": strategies.get(cfg.frontend, cfg.strategy).shares_of,
        "first_step": start, "history": history,
    }
    return Saver(world, cfg.checkpoint, cfg.checkpoint_every, cfg.steps, manifest, every_facts,
                 error=click.ClickException,
                 live=(lambda: {"loss_scaler": scaler.state(), SKIPPED_KEY: None if skips is None else list(skips)})
                 if scaler is not None else None)


def _check(cfg: Any, model: Any, losses: list[float], params: Any, start: int = 0,
           skipped: list[bool] | None = None, before: list[int] | None = None) -> dict[str, Any]:
    """The same training in one process (NumPy on the host), from step 0, in the run's dtype with the same loss
    scaler following the run's skip verdicts (`before`: the steps skipped before a resume, None where not known):
    the loss curve (a resumed run's steps against the reference's same steps) and the final parameters, within
    outcome.py's tolerances for the steps, dtype and optimizer."""
    import numpy as np

    from hetbench.train.reference import reference

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


def reduction(cfg: Any) -> int:
    """The longest sum of a step (outcome.perturbation's K): a weight gradient's rows (the batch) or a layer's
    width; --model gpt (torch): the batch's characters (batch x seq-len)."""
    rows = cfg.batch * (cfg.seq_len if getattr(cfg, "model", "mlp") == "gpt" else 1)
    return int(max(rows, cfg.hidden))


def gathers_hidden(logs: Sequence[Any], blocking: float | None) -> tuple[float, float] | None:
    """fsdp with prefetch, one step's StepLogs (one per rank): (exposed, hidden) seconds of its prefetched gathers.
    A gather's exposed time is the least of the ranks' (starting, testing and waiting for it): the rank that
    arrived last waited for no one, so its time is the data movement left on the critical path, not imbalance.
    Hidden = sum over the gathers of max(0, blocking - exposed), `blocking` being one gather's time when nothing
    else runs (as OSU's nonblocking-collective benchmarks measure overlap). None without prefetch."""
    if blocking is None or any(log.gather_exposed_seconds is None for log in logs):
        return None
    exposed = [min(times) for times in zip(*(log.gather_exposed_seconds for log in logs))]
    return sum(exposed), sum(max(0.0, blocking - e) for e in exposed)


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


def step_lines(cfg: Any, gathered: list[RankOutcome]) -> list[dict[str, Any]]:
    return gathered[ROOT].steps or []


def _warmup(cfg: Any) -> int:
    """The steps at the start of this run left out of its timing figures (--warmup-steps)."""
    return int(getattr(cfg, "warmup_steps", 0) or 0)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def rows(cfg: Any, gathered: list[RankOutcome]) -> list[dict[str, Any]]:
    """One row per rank: its share, its step's compute, communication and idle seconds (medians over the steps
    after the --warmup-steps; every step's in the --log file and the document's "steps") and the bytes it held at
    most."""
    total = sum(gathered[ROOT].shares)
    out = []
    for r, outcome in enumerate(gathered):
        logs = outcome.logs[_warmup(cfg):]
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
            **_solo_row(cfg, logs),
        })
    return out


def _solo_row(cfg: Any, logs: list[Any]) -> dict[str, Any]:
    """--solo-between-steps: the rank's solo step (the whole batch alone) over the timed steps, its median, and its
    samples/s alone: the global batch over that median."""
    solo = [log.solo_step_seconds for log in logs if log.solo_step_seconds is not None]
    if not solo:
        return {}
    median = statistics.median(solo)
    return {"solo_step_seconds_median": median, "solo_samples_per_second": cfg.batch / median if median > 0 else None}


def state_scaling(cfg: Any) -> str:
    """The loss scaling kind of a run: "dynamic" (fp16), "none" (bf16: non-finite steps still skipped; fp32)."""
    from hetbench.train.precision import LossScaler

    return LossScaler.for_dtype(cfg.dtype).kind


def summarize_job(cfg: Any, rows_: list[dict[str, Any]], gathered: list[RankOutcome]) -> dict[str, Any]:
    root = gathered[ROOT]
    steps = root.steps or []
    step_seconds = [s["step_seconds"] for s in steps[_warmup(cfg):]]
    median = _median(step_seconds)
    check = root.check
    modelled = any(r["device_timing"] == TIMING_MODELLED for r in rows_)
    return {
        "strategy": cfg.strategy,
        "steps": cfg.steps,
        "weights_kind": cfg.weights.kind,
        "weights": root.weights,
        "shares": root.shares,
        "shares_of": strategies.get(cfg.frontend, cfg.strategy).shares_of,
        **({"shares_first": root.details["batch_counts_first"],
            "shares_rebalanced": root.details["batch_counts_rebalanced"]}
           if root.details.get("batch_counts_rebalanced") else {}),
        "first_step": root.start_step,
        "resumed_from": root.resumed_from,
        "checkpoints": root.checkpoints,
        "loss_first": steps[0]["loss"] if steps else None,
        "loss_last": steps[-1]["loss"] if steps else None,
        "loss_fell_by": steps[0]["loss"] / steps[-1]["loss"] if steps and steps[-1]["loss"] > 0 else None,
        "warmup_steps": _warmup(cfg),  # the run's first steps, left out of the timing figures
        "step_seconds_median": median,
        "samples_per_second": cfg.batch / median if median > 0 else None,
        "timing": "modelled" if modelled else "measured",
        # a simulated rank's compute is modelled; the step's wall time is measured, and in it such a rank computes
        # on the host with NumPy: the figure of this machine, not of the GPU simulated
        "step_timing": "wall time; simulated ranks compute on the host" if modelled else "wall time",
        **_prefetch_summary(root),
        **_solo_summary(cfg, rows_, cfg.batch / median if median > 0 else None),
        "path": cfg.path,
        "state_memory": [r.get("state_memory") for r in rows_],
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


def _solo_summary(cfg: Any, rows_: list[dict[str, Any]], samples_per_second: float | None) -> dict[str, Any]:
    """--solo-between-steps: the ranks' solo samples/s summed, and the job's samples/s over that sum
    (efficiency_vs_summed_solo: each rank alone computes the whole batch, its GEMMs at least as tall as in the job,
    so the sum bounds the job from above; a figure above 1 is flagged, a measurement fault)."""
    if not getattr(cfg, "solo_between_steps", False) or len(rows_) < 2:
        return {}
    rates = [r.get("solo_samples_per_second") for r in rows_]
    if any(rate is None for rate in rates) or samples_per_second is None:
        return {"solo_between_steps": True, "solo_samples_per_second_sum": None, "efficiency_vs_summed_solo": None}
    total = sum(rates)
    efficiency = samples_per_second / total
    return {"solo_between_steps": True, "solo_samples_per_second_sum": total,
            "efficiency_vs_summed_solo": efficiency, "efficiency_above_1": efficiency > 1}


def _prefetch_summary(root: RankOutcome) -> dict[str, Any]:
    """fsdp: whether the gathers were prefetched; with prefetch, what one layer's gather takes blocking (the
    slowest rank's median, measured before training) and the share of the prefetched gathers' blocking time that
    was hidden behind compute over every step: 100 * sum(hidden) / (gathers * blocking) (gathers_hidden)."""
    d = root.details
    if d.get("strategy") != "fsdp":
        return {}
    out: dict[str, Any] = {"prefetch": d.get("prefetch", False)}
    blocking, per_step = d.get("gather_seconds_blocking"), d.get("prefetched_gathers_per_step", 0)
    steps = [s for s in root.steps or [] if "comm_hidden_seconds" in s]
    if d.get("prefetch") and blocking and per_step and steps:
        out["gather_seconds_blocking"] = blocking
        out["comm_hidden_percent"] = 100.0 * sum(s["comm_hidden_seconds"] for s in steps) / (
            len(steps) * per_step * blocking)
    return out
