"""What both training front ends (the NumPy trainer, hetbench/train/, and the torch one, hetbench/pytorch/) share
about a run's outcome: a rank's outcome, the check of the loss curve against one process's, its tolerances, and the
--checkpoint folder's pre-check."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ROOT = 0
# The check: the distributed run sums in another order than the single process, so its fp32 losses and parameters
# drift apart by rounding; over the default 300 steps the losses stay within this relative difference
CHECK_RTOL = 1e-3
# ... and the final parameters within this relative difference of each layer's norm, ||p - p_ref|| / ||p_ref||.
# Not element by element: AdamW moves every element by about lr per step whatever its gradient's size, so an
# element whose gradient is near zero moves by the sign of its rounding noise. Measured at 4 layers x 512, batch
# 1024, adamw lr 0.01, 12 steps, PoCL's GEMMs against OpenBLAS's: losses within 2.0e-4, layer norms within 1.1e-2,
# single elements up to 0.18 of the largest (with sgd: 1.5e-7). A final update left out moves the norm by ~lr / |p|
# (over 0.4 at that size, 0.1 at the default 32 wide): this tolerance still catches it.
PARAM_RTOL = 5e-2
# auto weights (fsdp, ddp): the batch shares are measured again after each of the first steps (train.BatchShares)
AUTO_REBALANCE_STEPS = 4
# --solo-between-steps: a fresh one-rank run's steps after each timed step; the first warms its fresh state, the
# last is timed (both front ends)
SOLO_STEPS = 2
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
# (the parameters' figures there are element-wise, of the layer's largest; the check compares layer norms, as for
# fp32, which differ less)
PARAM_RTOL_BY_DTYPE = {"fp32": PARAM_RTOL, "fp16": 0.15, "bf16": 0.2}
MIXED_EARLY_STEPS = 40
MIXED_FINAL_STEPS = 10
MIXED_FINAL_BAND = 0.5


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
    from hetbench.train.checkpoint import planned_collisions

    from hetbench.results.io import folder_problem

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


def compare_with_reference(dtype: str, steps: int, start: int, losses: list[float], ref_losses: list[float],
                           skipped: list[bool], ref_skipped: list[bool], norm_diff: float, param_diff: float,
                           have_params: bool) -> dict[str, Any]:
    """The check's verdict and figures from a run's losses (from step `start`), the reference's same steps, the
    steps each skipped, and the final parameters' largest relative differences (by layer norm, and element-wise,
    shown only): fp32 step by step within CHECK_RTOL and the parameters within PARAM_RTOL; mixed precision as
    CHECK_RTOL_BY_DTYPE's comment says. Both front ends' checks (numpy, torch) end here."""
    rtol, param_rtol = CHECK_RTOL_BY_DTYPE[dtype], PARAM_RTOL_BY_DTYPE[dtype]
    mixed = dtype != "fp32"
    rel = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses)]
    same_length = len(losses) == len(ref_losses)
    param_figures = {"max_param_norm_relative_difference": norm_diff, "param_rtol": param_rtol,
              "max_param_relative_difference": param_diff}  # element-wise, of the layer's largest: shown only
    if not mixed:
        loss_diff = max(rel) if rel else math.inf
        ok = bool(loss_diff <= rtol and norm_diff <= param_rtol and same_length and have_params)
        return {"ok": ok, "max_loss_relative_difference": loss_diff, **param_figures,
                "rtol": rtol, "dtype": dtype, "reference_loss_first": ref_losses[0],
                "reference_loss_last": ref_losses[-1], "skipped_steps": 0, "reference_skipped_steps": 0}
    # mixed precision: see CHECK_RTOL_BY_DTYPE's comment
    differ = next((i for i, (a, b) in enumerate(zip(skipped, ref_skipped)) if a != b), len(rel))
    window = [i for i in range(min(differ, len(rel))) if start + i < MIXED_EARLY_STEPS]
    loss_diff = max((rel[i] for i in window), default=0.0)
    tail = min(MIXED_FINAL_STEPS, len(losses))
    ref_tail = sum(ref_losses[-tail:]) / tail
    final_diff = abs(sum(losses[-tail:]) / tail - ref_tail) / max(abs(ref_tail), 1e-30)
    params_checked = have_params and differ >= len(rel) and steps <= MIXED_EARLY_STEPS
    ok = bool(same_length and loss_diff <= rtol and final_diff <= MIXED_FINAL_BAND
              and (norm_diff <= param_rtol or not params_checked))
    return {"ok": ok, "max_loss_relative_difference": loss_diff, **param_figures,
            "rtol": rtol, "dtype": dtype,
            "compared_steps": len(window), "params_checked": params_checked,
            "max_loss_relative_difference_all_steps": max(rel),
            "final_loss_relative_difference": final_diff, "final_band": MIXED_FINAL_BAND,
            "verdicts_agree": differ >= len(rel),
            "reference_loss_first": ref_losses[0], "reference_loss_last": ref_losses[-1],
            "skipped_steps": sum(bool(s) for s in skipped), "reference_skipped_steps": sum(ref_skipped)}
