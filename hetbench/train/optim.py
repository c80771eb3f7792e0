"""Optimizers on flat float32 vectors, elementwise only: a shard has its own state, and a step on a shard gives
exactly (bit for bit) the same elements as the step on the full vector. That is what lets fsdp shard the
optimizer state unevenly and still compute the single-process run.

`step` is the 0-based global step index: AdamW's bias correction uses t = step + 1, so a run resumed at step s
(with its state) continues the same curve.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

OPTIMIZERS = ("adamw", "sgd")
ADAMW_WEIGHT_DECAY = 0.01


class SGD:
    """p -= lr * (g + weight_decay * p). No state."""

    state_names: tuple[str, ...] = ()

    def __init__(self, lr: float, size: int, weight_decay: float = 0.0) -> None:
        self.lr = np.float32(lr)
        self.size = int(size)
        self.weight_decay = np.float32(weight_decay)

    @property
    def state_bytes(self) -> int:
        return 0

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        _load(self, state)

    def step(self, param: np.ndarray, grad: np.ndarray, step: int) -> None:
        _check(param, grad, self.size)
        if self.weight_decay:
            param -= self.lr * (grad + self.weight_decay * param)
        else:
            param -= self.lr * grad


class AdamW:
    """Adam with bias correction and decoupled weight decay (Loshchilov & Hutter; as torch.optim.AdamW):
    p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),  t = step + 1.
    State: m and v, float32, one each per element (8 bytes an element)."""

    state_names: tuple[str, ...] = ("m", "v")

    def __init__(self, lr: float, size: int, weight_decay: float = ADAMW_WEIGHT_DECAY,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, xp: Any = None) -> None:
        self.lr = float(lr)
        self.size = int(size)
        self.weight_decay = float(weight_decay)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps = np.float32(eps)
        self.xp = xp if xp is not None else np
        self.m = self.xp.zeros(self.size, dtype=np.float32)
        self.v = self.xp.zeros(self.size, dtype=np.float32)

    @property
    def state_bytes(self) -> int:
        return int(self.m.nbytes + self.v.nbytes)

    def state(self) -> dict[str, np.ndarray]:
        """The state vectors by name (the live arrays, not copies): what a checkpoint saves."""
        return {"m": self.m, "v": self.v}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Take the state vectors (copied in), e.g. a checkpoint's slice for this shard."""
        _load(self, state)

    def step(self, param: np.ndarray, grad: np.ndarray, step: int) -> None:
        _check(param, grad, self.size)
        t = step + 1
        b1, b2 = self.beta1, self.beta2
        if self.weight_decay:
            param *= np.float32(1.0 - self.lr * self.weight_decay)
        self.m *= np.float32(b1)
        self.m += np.float32(1.0 - b1) * grad
        self.v *= np.float32(b2)
        self.v += np.float32(1.0 - b2) * self.xp.square(grad)
        # the scalars folded in float64 once, then applied in float32 elementwise
        step_size = np.float32(self.lr / (1.0 - b1**t))
        root_correction = np.float32(math.sqrt(1.0 - b2**t))
        denom = self.xp.sqrt(self.v) / root_correction + self.eps
        param -= step_size * (self.m / denom)


def _load(opt: SGD | AdamW, state: dict[str, np.ndarray]) -> None:
    if set(state) != set(opt.state_names):
        raise ValueError(f"optimizer state {sorted(state)} given where {sorted(opt.state_names)} is kept")
    for name in opt.state_names:
        value = np.asarray(state[name], dtype=np.float32)  # a checkpoint's slice: host memory
        if value.shape != (opt.size,):
            raise ValueError(f"optimizer state {name!r} of shape {value.shape} for size {opt.size}")
        getattr(opt, name)[...] = opt.xp.asarray(value)  # AdamW (SGD keeps no state)


def _check(param: np.ndarray, grad: np.ndarray, size: int) -> None:
    if param.dtype != np.float32 or grad.dtype != np.float32:
        raise TypeError(f"optimizers work on float32 vectors, got {param.dtype} and {grad.dtype}")
    if param.shape != (size,) or grad.shape != (size,):
        raise ValueError(f"optimizer of size {size} given shapes {param.shape} and {grad.shape}")


def make_optimizer(name: str, lr: float, size: int, weight_decay: float | None = None,
                   betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, xp: Any = None) -> SGD | AdamW:
    """An optimizer for a flat vector of `size` elements. weight_decay None: 0 for sgd, 0.01 for adamw. `xp` is
    the array library of the vectors it will update (NumPy by default; CuPy on a GPU rank): its state lives there."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"the learning rate must be a number > 0, not {lr!r}")
    if name == "sgd":
        return SGD(lr, size, 0.0 if weight_decay is None else weight_decay)
    if name == "adamw":
        return AdamW(lr, size, ADAMW_WEIGHT_DECAY if weight_decay is None else weight_decay, betas, eps, xp)
    raise ValueError(f"unknown optimizer {name!r}; accepted: {', '.join(OPTIMIZERS)}")
