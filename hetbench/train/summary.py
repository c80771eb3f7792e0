"""The job's figures at rank 0, both front ends alike: one row per rank (its share, its step's compute,
communication and idle seconds, bytes held), the job's summary (losses, step time, samples/s, the solo baseline
and the efficiency against it, fsdp's hidden gathers, the check's verdict) and the step lines' shared pieces."""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from hetbench.backends.base import TIMING_MODELLED
from hetbench.train import strategies
from hetbench.train.outcome import ROOT, RankOutcome
from hetbench.train.precision import LossScaler


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


def step_lines(cfg: Any, gathered: list[RankOutcome]) -> list[dict[str, Any]]:
    return gathered[ROOT].steps or []


def warmup(cfg: Any) -> int:
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
        logs = outcome.logs[warmup(cfg):]
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
            **({"stage_layers": outcome.details["stage_layers"]} if "stage_layers" in outcome.details else {}),
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
    return LossScaler.for_dtype(cfg.dtype).kind


def summarize_job(cfg: Any, rows_: list[dict[str, Any]], gathered: list[RankOutcome]) -> dict[str, Any]:
    root = gathered[ROOT]
    steps = root.steps or []
    step_seconds = [s["step_seconds"] for s in steps[warmup(cfg):]]
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
        "warmup_steps": warmup(cfg),  # the run's first steps, left out of the timing figures
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
