"""The single-process training run every strategy must reproduce (within rounding: only sums' order differs, and
under mixed precision where a GEMM's fp16/bf16 rounding falls; see outcome.py's tolerances)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetbench.train.model import (
    ModelConfig,
    backward,
    flatten,
    forward,
    init_params,
    loss_and_grad,
    make_batch,
    teacher_params,
    unflatten,
)
from hetbench.harness.ops import HostOps
from hetbench.train.optim import make_optimizer
from hetbench.train.precision import LossScaler


def reference(model: ModelConfig, optimizer: str, lr: float, steps: int, ops: Any = None, dtype: str = "fp32",
              trace: list[dict[str, Any]] | None = None, follow: list[bool | None] | None = None
              ) -> tuple[list[float], list[tuple[np.ndarray, np.ndarray]]]:
    """Train `model` from its initial parameters for `steps` steps (step indices 0...) in one
    process on `ops` (default HostOps(dtype)). Returns (the loss of every step, before its update; the final
    [(W_l, b_l)]). One optimizer per layer's flat vector, as the strategies have. `dtype` fp16/bf16: mixed
    precision with the strategies' loss scaler (precision.py); `trace`, if given, receives per step
    {"loss_scale", "step_skipped"} as the strategies log them, and "own_verdict": whether one process's own gradient
    was non-finite. `follow[step]` (True/False; None or beyond the list: its own) is the run's verdict, which the
    reference then takes (outcome.VERDICT_INTERVAL): a skip skipped; an update whose gradient overflowed here taken
    with the step's backward at half the scale, again, until finite (only the rounding changes)."""
    ops = ops if ops is not None else HostOps(dtype)
    scaler = LossScaler.for_dtype(ops.dtype.name if hasattr(ops, "dtype") else dtype)
    hidden = model.hidden
    vecs = [flatten(W, b).copy() for W, b in init_params(model)]
    opts = [make_optimizer(optimizer, lr, v.size) for v in vecs]
    teacher = teacher_params(model)
    losses = []
    for step in range(steps):
        x, y = make_batch(model, step, teacher=teacher)
        params = [unflatten(v, hidden) for v in vecs]
        scale = scaler.scale
        with scaler.quiet():
            h, caches = forward(ops, params, x)
            loss, grad = loss_and_grad(h, y, model.batch)
            grads = backward(ops, params, caches, scaler.scale_loss_grad(grad))
            flat = [flatten(dW, db) for dW, db in grads]
        own = scaler.nonfinite(flat)
        verdict = follow[step] if follow is not None and step < len(follow) and follow[step] is not None else own
        used = scale
        while not verdict and scaler.nonfinite(flat) and used > 2.0**-64:  # the run updated where this overflowed
            used /= 2
            with scaler.quiet():
                flat = [flatten(dW, db) for dW, db in backward(ops, params, caches, grad * np.float32(used))]
        skipped = scaler.update(bool(verdict))
        if not skipped:
            for vec, opt, g in zip(vecs, opts, flat):
                # by the scale its backward ran at, as the strategies do (a retried step's smaller one)
                if used != scale:
                    g /= np.float32(used)
                else:
                    scaler.unscale(g)
                opt.step(vec, g, step)
        if trace is not None:
            trace.append({"loss_scale": scale, "step_skipped": skipped, "own_verdict": bool(own)})
        losses.append(loss)
    return losses, [tuple(a.copy() for a in unflatten(v, hidden)) for v in vecs]  # type: ignore[misc]
