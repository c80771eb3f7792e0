"""What both training front ends (the NumPy trainer, hetbench/train/, and the torch one, hetbench/pytorch/) share
about a run's outcome: a rank's outcome, the check of the loss curve against one process's, its tolerances, and the
--checkpoint folder's pre-check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetbench.results.io import folder_problem
from hetbench.train.checkpoint import planned_collisions

ROOT = 0
# The check: the distributed run sums in another order than one process (and, under mixed precision, rounds each
# rank's part of a sum to the dtype where one process rounds the whole), so the losses and parameters drift apart by
# rounding, and the tolerances follow that drift (the derivation and the measurements behind the constants:
# docs/train.md, "The check against one process"). One step perturbs the gradients by delta (perturbation); AdamW
# moves the parameters by ~lr delta a step whatever the gradient's size, so the curves part linearly in the steps:
# the loss at global step t within LOSS_GROWTH[dtype] * delta * (1 + t), relative, the final parameters after T steps,
# as one vector, within PARAM_GROWTH[dtype] * delta * T (SGD parts more slowly and is held to AdamW's constants).
# The constants are the largest ratios measured times a margin of 3-5, still tight enough that a curve 1 % off fails.
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
LOSS_GROWTH = {"fp32": 8.0, "fp16": 3.0, "bf16": 0.5}
PARAM_GROWTH = {"fp32": 400.0, "fp16": 24.0, "bf16": 6.0}
OPTIMIZERS = ("adamw", "sgd")
# The parameters are judged as one vector (every layer's or tensor's elements together), not tensor by tensor:
# AdamW moves an element whose gradient is rounding noise by lr a step in that noise's sign, so a tensor whose
# gradient is all noise parts by its own size between two correct runs. The largest tensor's figure is shown.
# A step the run skipped (fp16/bf16: a non-finite gradient somewhere) and one process did not, or the other way: the
# reference follows the run's verdict (a skip skipped; an update its own gradient overflowed for taken at a smaller
# scale, which changes only its rounding), so the curves stay comparable, and each such step is counted. One process
# overflowing where the run did not is what its longer sums do; the run skipping a step one process found finite is
# allowed at most twice per VERDICT_INTERVAL steps plus once, so a run that skips good steps fails.
VERDICT_INTERVAL = 100
# auto weights (fsdp, ddp): the batch shares are measured again after each of the first steps (train.BatchShares)
AUTO_REBALANCE_STEPS = 4
# --solo-between-steps: a fresh one-rank run's steps after each timed step; the first warms its fresh state, the
# last is timed (both front ends)
SOLO_STEPS = 2
# Mixed precision: the mean of the last MIXED_FINAL_STEPS losses within MIXED_FINAL_BAND of the reference's (the run
# learns as far as one process does), beside the step-by-step check; its figures are shown for fp32 too.
MIXED_FINAL_STEPS = 10
MIXED_FINAL_BAND = 0.5


def perturbation(dtype: str, reduction: int) -> float:
    """delta: one step's relative perturbation of the gradients between the run and one process (see UNIT_ROUNDOFF):
    the compute dtype's rounding of a rank's part plus fp32 sums of `reduction` terms in another order."""
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {', '.join(UNIT_ROUNDOFF)}, not {dtype!r}")
    if not (isinstance(reduction, int) and reduction >= 1):
        raise ValueError(f"reduction must be a whole number >= 1, not {reduction!r}")
    return UNIT_ROUNDOFF[dtype] + UNIT_ROUNDOFF["fp32"] * math.sqrt(reduction)


def _growth(table: dict[str, float], dtype: str, optimizer: str) -> float:
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {optimizer!r}")
    return table[dtype]


def loss_tolerance(step: int, dtype: str, optimizer: str, reduction: int) -> float:
    """The relative difference allowed between the run's loss at global step `step` (0-based, before its update)
    and one process's: LOSS_GROWTH[dtype] * delta * (1 + step) (the same for both optimizers: AdamW's)."""
    if not (isinstance(step, int) and step >= 0):
        raise ValueError(f"step must be a whole number >= 0, not {step!r}")
    delta = perturbation(dtype, reduction)
    return _growth(LOSS_GROWTH, dtype, optimizer) * delta * (1 + step)


def param_tolerance(steps: int, dtype: str, optimizer: str, reduction: int) -> float:
    """The relative difference allowed between the final parameters after `steps` steps and one process's, as one
    vector: PARAM_GROWTH[dtype] * delta * steps."""
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be a whole number >= 1, not {steps!r}")
    delta = perturbation(dtype, reduction)
    return _growth(PARAM_GROWTH, dtype, optimizer) * delta * steps


def verdict_differences_allowed(steps: int) -> int:
    """How many steps the run may skip where one process's gradient was finite: two per VERDICT_INTERVAL steps of
    the run, plus one."""
    return 1 + 2 * (steps // VERDICT_INTERVAL)


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
    details: dict[str, Any] = field(default_factory=dict)  # the strategy's facts (TrainOutcome.details)


def checkpoint_folder_errors(folder: Any, every: int, start: int, steps: int) -> list[str]:
    """--checkpoint: a folder (or none yet, that can be made) that holds none of the step folders this run would
    save."""
    errors: list[str] = []
    if folder is not None:
        problem = folder_problem(folder, "--checkpoint")
        if problem is not None:
            errors.append(problem)
        else:
            taken = planned_collisions(folder, every, start, steps)
            if taken:
                errors.append(f"checkpoint folder {str(folder)!r} already holds {', '.join(taken)}: a checkpoint is "
                              "never overwritten; choose another --checkpoint folder")
    return errors


def compare_with_reference(dtype: str, optimizer: str, steps: int, start: int, losses: list[float],
                           ref_losses: list[float], skipped: list[bool], ref_own: list[bool], norm_diff: float,
                           tensor_diff: float, param_diff: float, have_params: bool, reduction: int
                           ) -> dict[str, Any]:
    """The check's verdict and figures from a run's losses (from global step `start`), the reference's same steps,
    the steps the run skipped and those one process would have skipped on its own (the reference follows the run's,
    see VERDICT_INTERVAL), and the final parameters' relative differences: as one vector (`norm_diff`, judged), the
    largest tensor's by norm and element-wise (`tensor_diff`, `param_diff`: shown). Every step's loss within
    loss_tolerance at its step, the parameters within param_tolerance, the verdicts differing at most
    verdict_differences_allowed times; mixed precision also the last losses' mean within MIXED_FINAL_BAND. Both
    front ends' checks (numpy, torch) end here."""
    delta = perturbation(dtype, reduction)
    tolerances = [loss_tolerance(start + i, dtype, optimizer, reduction) for i in range(len(losses))]
    rel = [abs(a - b) / max(abs(b), 1e-30) if math.isfinite(a) else math.inf for a, b in zip(losses, ref_losses)]
    same_length = len(losses) == len(ref_losses) and len(losses) > 0
    ratios = [r / t for r, t in zip(rel, tolerances)]
    worst = max(range(len(ratios)), key=ratios.__getitem__) if ratios else 0
    param_rtol = param_tolerance(steps, dtype, optimizer, reduction)
    differ = sum(bool(a) != bool(b) for a, b in zip(skipped, ref_own))
    run_only = sum(bool(a) and not b for a, b in zip(skipped, ref_own))  # skipped where one process had no overflow
    allowed = verdict_differences_allowed(len(losses))
    tail = min(MIXED_FINAL_STEPS, len(losses), len(ref_losses))
    ref_tail = sum(ref_losses[-tail:]) / tail if tail else math.nan
    final_diff = (abs(sum(losses[-tail:]) / tail - ref_tail) / max(abs(ref_tail), 1e-30)) if tail else math.inf
    mixed = dtype != "fp32"
    ok = bool(same_length and ratios and max(ratios) <= 1.0 and have_params and norm_diff <= param_rtol
              and run_only <= allowed and (final_diff <= MIXED_FINAL_BAND or not mixed))
    return {"ok": ok, "dtype": dtype, "optimizer": optimizer, "reduction": reduction, "delta": delta,
            # the step whose difference is the largest part of its tolerance: its difference and tolerance
            "max_loss_relative_difference": rel[worst] if rel else math.inf,
            "rtol": tolerances[worst] if tolerances else math.nan, "worst_step": start + worst,
            "loss_over_tolerance": max(ratios) if ratios else math.inf,
            "rtol_first": tolerances[0] if tolerances else math.nan,
            "rtol_last": tolerances[-1] if tolerances else math.nan,
            "max_loss_relative_difference_all_steps": max(rel) if rel else math.inf,
            "compared_steps": len(rel),
            "max_param_norm_relative_difference": norm_diff, "param_rtol": param_rtol, "params_checked": have_params,
            "max_tensor_norm_relative_difference": tensor_diff,  # the largest layer's or tensor's: shown only
            "max_param_relative_difference": param_diff,  # element-wise, of the layer's largest: shown only
            "final_loss_relative_difference": final_diff, "final_band": MIXED_FINAL_BAND,
            "verdicts_agree": differ == 0, "verdict_differences": differ,
            "run_only_skips": run_only, "verdict_differences_allowed": allowed,
            "reference_loss_first": ref_losses[0] if ref_losses else math.nan,
            "reference_loss_last": ref_losses[-1] if ref_losses else math.nan,
            "skipped_steps": sum(bool(s) for s in skipped), "reference_skipped_steps": sum(bool(s) for s in ref_own)}


# A checkpoint's manifest: the global steps the run had skipped up to it (its own and those of the runs it resumed),
# so that a resumed run's check has the reference follow the same verdicts from step 0
SKIPPED_KEY = "skipped_steps_at"


def record_skips(scaler: Any, start: int, before: list[int] | None) -> list[int] | None:
    """Wraps `scaler.update` (called once a step on every rank, the verdict global) to note the global index of
    every step it skips, after `before` (the resumed checkpoint's, or [] for a fresh run). Returns the list it
    fills: what a checkpoint records under SKIPPED_KEY; None where the steps before `start` are not known."""
    skipped_at = None if before is None else list(before)
    count = [start]
    update = scaler.update

    def recording(nonfinite: bool) -> bool:
        skipped = update(nonfinite)
        if skipped and skipped_at is not None:
            skipped_at.append(count[0])
        count[0] += 1
        return skipped

    scaler.update = recording
    return skipped_at


def skipped_before(manifest: dict[str, Any] | None) -> list[int] | None:
    """A resumed checkpoint's skipped steps (SKIPPED_KEY): [] for a fresh run; None where the manifest does not say
    (a checkpoint of an earlier hetbench) or says something else than whole steps below its steps_done."""
    if manifest is None:
        return []
    value, done = manifest.get(SKIPPED_KEY), manifest.get("steps_done")
    if (isinstance(value, list) and isinstance(done, int)
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < done for v in value)):
        return sorted(set(value))
    return None


def follow_verdicts(steps: int, start: int, before: list[int] | None, skipped: list[bool]) -> list[bool | None]:
    """The verdict per global step [0, steps) the reference follows: the recorded skips before `start` (None each
    where not known: the reference's own), the run's own from `start`."""
    early: list[bool | None] = [None] * start if before is None else [i in set(before) for i in range(start)]
    return [*early, *(bool(s) for s in skipped)][:steps]
