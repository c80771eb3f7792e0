"""The single-process training run every strategy must reproduce (to fp32 tolerance: only sums' order differs)."""

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
from hetbench.train.ops import HostOps
from hetbench.train.optim import make_optimizer


def reference(model: ModelConfig, optimizer: str, lr: float, steps: int, ops: Any = None
              ) -> tuple[list[float], list[tuple[np.ndarray, np.ndarray]]]:
    """Train `model` from its initial parameters for `steps` steps (step indices 0...) in one
    process on `ops` (default HostOps()). Returns (the loss of every step, before its update; the final
    [(W_l, b_l)]). One optimizer per layer's flat vector, as the strategies have."""
    ops = ops if ops is not None else HostOps()
    hidden = model.hidden
    vecs = [flatten(W, b).copy() for W, b in init_params(model)]
    opts = [make_optimizer(optimizer, lr, v.size) for v in vecs]
    teacher = teacher_params(model)
    losses = []
    for step in range(steps):
        x, y = make_batch(model, step, teacher=teacher)
        params = [unflatten(v, hidden) for v in vecs]
        h, caches = forward(ops, params, x)
        loss, grad = loss_and_grad(h, y, model.batch)
        grads = backward(ops, params, caches, grad)
        for vec, opt, (dW, db) in zip(vecs, opts, grads):
            opt.step(vec, flatten(dW, db), step)
        losses.append(loss)
    return losses, [tuple(a.copy() for a in unflatten(v, hidden)) for v in vecs]  # type: ignore[misc]
