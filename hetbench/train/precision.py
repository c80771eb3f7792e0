"""Mixed precision for `hetbench train`: which dtypes a run may compute in, and the loss scaler.

`--dtype fp16|bf16` keeps what a step remembers in float32 (the master parameters, the gradients as they are
summed and reduced, the optimizer state) and computes in the reduced dtype: every GEMM reads operands rounded to
it and its result is rounded to it (fp32 accumulation inside, as tensor cores and matrix cores do; see ops.py), and
the activations a layer keeps for its backward are held in it. The elementwise work (bias, ReLU, residual adds,
the loss, the optimizer) is float32 arithmetic on those values.

The loss scaler, as torch.cuda.amp.GradScaler:
- fp16 ("dynamic"): the backward runs on loss * scale (initial INITIAL_SCALE = 2**16) so that small gradients
  survive fp16's range (the smallest subnormal is 2**-24); the summed gradients are divided by the scale their
  backward ran at, in float32, before the optimizer. A step whose gradients hold an inf or NaN anywhere (every
  rank decides alike: a global verdict) is skipped, no parameter or optimizer state touched, and the scale halves; after
  GROWTH_INTERVAL consecutive good steps it doubles. GROWTH_INTERVAL is 100, not GradScaler's 2000: a run here
  is a few hundred steps, and with 2000 the scale could only ever fall.
- bf16 ("none"): bf16 has float32's exponent range, so no scaling (scale fixed at 1), but a step with non-finite
  gradients is still skipped.
- fp32 ("none"): no scaling, no check, nothing skipped.

A skipped step leaves AdamW's bias-correction step count at the global step index (t = step + 1, see optim.py),
so a run resumes from its step count alone; torch counts only the updates taken, which after a skip early in a
run gives a slightly smaller next update here.

HETBENCH_TRAIN_INITIAL_SCALE (a power of two, fp16 only) replaces the initial scale: a test hook to force
overflows. It is read on every rank and by the single-process reference alike.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from hetbench.dtypes import MIXED_DTYPES, TRAIN_DTYPES, DType, array_module, get_dtype, is_mixed, train_dtype

MASTER_DTYPE = "fp32"
INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 100
BACKOFF_FACTOR = 0.5
GROWTH_FACTOR = 2.0
SCALE_ENV = "HETBENCH_TRAIN_INITIAL_SCALE"


def initial_scale(dtype: DType | str) -> float:
    """fp16: INITIAL_SCALE, or $HETBENCH_TRAIN_INITIAL_SCALE where set; 1 otherwise."""
    if not (dtype if isinstance(dtype, str) else dtype.name) == "fp16":
        return 1.0
    text = os.environ.get(SCALE_ENV, "").strip()
    if not text:
        return INITIAL_SCALE
    value = float(text)
    if not (math.isfinite(value) and value > 0 and math.frexp(value)[0] == 0.5):
        raise ValueError(f"{SCALE_ENV}={text!r} must be a power of two > 0")
    return value


@dataclass
class LossScaler:
    """One run's loss scale and its history. Every rank holds one, and they stay equal: each step's verdict is
    global. `kind` is "dynamic" (fp16) or "none" (bf16, fp32); `checks` says whether steps with non-finite
    gradients are looked for and skipped (fp16, bf16)."""

    kind: str
    checks: bool
    scale: float = 1.0
    good_steps: int = 0  # consecutive good steps since the scale last changed
    skipped_steps: int = 0  # steps skipped by this scaler (this run's)
    growth_interval: int = GROWTH_INTERVAL
    step_scale: float | None = None  # the scale the last verdict's backward ran at (update() may move `scale`)

    @classmethod
    def for_dtype(cls, dtype: DType | str, state: dict[str, Any] | None = None) -> "LossScaler":
        """The scaler of a run in `dtype`; `state` (a checkpoint's, from state()) continues a saved one."""
        name = dtype if isinstance(dtype, str) else dtype.name
        scaler = cls(kind="dynamic" if name == "fp16" else "none", checks=is_mixed(name),
                     scale=initial_scale(name))
        if state:
            scaler.scale = float(state["scale"])
            scaler.good_steps = int(state["good_steps"])
        return scaler

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps so that a resumed run continues the same curve."""
        return {"kind": self.kind, "scale": self.scale, "good_steps": self.good_steps,
                "growth_interval": self.growth_interval}

    def scale_loss_grad(self, grad: np.ndarray) -> np.ndarray:
        """dL/dh_L of the scaled loss: grad * scale (a power of two: exact in float32, short of overflow)."""
        return grad if self.scale == 1.0 else grad * np.float32(self.scale)

    def unscale(self, grad: np.ndarray) -> None:
        """Divide summed gradients by the scale their backward ran at, in place, in float32: after update() that is
        the scale before it moved (a step that doubles the scale is applied at full size, as GradScaler does)."""
        scale = self.scale if self.step_scale is None else self.step_scale
        if scale != 1.0:
            grad /= np.float32(scale)

    def nonfinite(self, arrays: Iterable[np.ndarray]) -> bool:
        """Whether any of `arrays` (this rank's summed gradients) holds an inf or NaN; False when not checking."""
        return self.checks and not all(bool(array_module(a).isfinite(a).all()) for a in arrays)

    def update(self, nonfinite: bool) -> bool:
        """After a step's global verdict: returns whether the step is skipped, and moves the scale."""
        self.step_scale = self.scale
        if not self.checks:
            return False
        if nonfinite:
            self.skipped_steps += 1
            self.good_steps = 0
            if self.kind == "dynamic":
                self.scale *= BACKOFF_FACTOR
            return True
        self.good_steps += 1
        if self.kind == "dynamic" and self.good_steps >= self.growth_interval:
            self.scale *= GROWTH_FACTOR
            self.good_steps = 0
        return False

    def quiet(self) -> Any:
        """A context that silences NumPy's overflow/invalid warnings where non-finite values are expected and
        handled (mixed precision); under fp32 nothing changes."""
        return np.errstate(over="ignore", invalid="ignore") if self.checks else contextlib.nullcontext()
