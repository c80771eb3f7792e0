"""The model: a deep residual MLP, h_{l+1} = h_l + relu(h_l @ W_l + b_l), trained to imitate a fixed random teacher.

Everything is float32, in the arrays' own library (NumPy; CuPy on a GPU rank, which keeps its training state there:
hetbench.dtypes.array_module; the batch is made on the host); the GEMMs go through an Ops (the rank's device), which
under mixed precision
(precision.py) rounds their operands and results to the compute dtype. The forward and backward are
written out by hand, one layer at a time, so that every strategy (ddp, fsdp, pipeline) runs the same arithmetic.

The task. x ~ N(0, 1) of shape (batch, hidden), fresh every step from (seed, step). The target is
y = teacher(x), where the teacher is a network of the SAME form (TEACHER_LAYERS residual ReLU layers, weights and
biases of std 1/sqrt(hidden), from the seed): the student can represent it exactly, so the loss can fall towards
zero. (A random linear map on the teacher's output would make the task unlearnable: every residual ReLU layer
only adds non-negative terms, so the student's output is >= x elementwise, and a target below x could never be
reached.) The teacher is computed in float64 and rounded to float32, so a rank that generates only its own rows gets
the rows of the global batch.

The loss: L = sum over the global batch of 0.5 * ||h_L - y||^2 / batch. A rank computes its rows' part with the
gradient scaled by 1/batch (the GLOBAL batch), so summing the ranks' parts gives the global loss and gradient for
any split of the batch: no per-rank rescaling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hetbench.dtypes import array_module

TEACHER_LAYERS = 2
INIT_STD = 0.5  # student weights and biases: INIT_STD / sqrt(hidden)
TEACHER_STD = 1.0  # teacher weights and biases: TEACHER_STD / sqrt(hidden)

# streams of numpy.random.default_rng([seed, stream, ...])
_STUDENT, _TEACHER, _DATA = 0, 1, 2


@dataclass(frozen=True)
class ModelConfig:
    layers: int = 4
    hidden: int = 32
    batch: int = 64  # the global batch
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "batch"):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")

    @property
    def layer_size(self) -> int:
        """Elements of one layer's flat parameter vector: W (hidden x hidden) then b (hidden)."""
        return layer_size(self.hidden)

    @property
    def param_count(self) -> int:
        return self.layers * self.layer_size


def layer_size(hidden: int) -> int:
    return hidden * hidden + hidden


def _random_layers(seed: int, stream: int, layers: int, hidden: int, std: float) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    scale = std / np.sqrt(hidden)
    for layer in range(layers):
        rng = np.random.default_rng([seed, stream, layer])
        W = (rng.standard_normal((hidden, hidden)) * scale).astype(np.float32)
        b = (rng.standard_normal(hidden) * scale).astype(np.float32)
        out.append((W, b))
    return out


def init_params(cfg: ModelConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """The student's initial [(W_l, b_l)], float32, std INIT_STD/sqrt(hidden), from cfg.seed (layer by layer: the
    same whatever the rank count)."""
    return _random_layers(cfg.seed, _STUDENT, cfg.layers, cfg.hidden, INIT_STD)


def teacher_params(cfg: ModelConfig) -> list[tuple[np.ndarray, np.ndarray]]:
    """The teacher's [(W, b)] (TEACHER_LAYERS of them), float64, std TEACHER_STD/sqrt(hidden)."""
    layers = _random_layers(cfg.seed, _TEACHER, TEACHER_LAYERS, cfg.hidden, TEACHER_STD)
    return [(W.astype(np.float64), b.astype(np.float64)) for W, b in layers]


def teacher_forward(teacher: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """y = teacher(x), computed in float64 and rounded to float32. Each row depends only on its own x row; any
    difference in the float64 BLAS's summation order between a rank's rows and the whole batch (~1e-16) vanishes
    in the rounding to float32 (but for a value within 1e-16 of a float32 rounding boundary)."""
    h = x.astype(np.float64)
    for W, b in teacher:
        h = h + np.maximum(h @ W + b, 0.0)
    return h.astype(np.float32)


def make_batch(cfg: ModelConfig, step: int, start: int = 0, count: int | None = None,
               teacher: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows [start, start+count) (default: all) of step `step`'s global batch: x (float32, ~N(0,1)) and
    y = teacher(x). Deterministic from (cfg.seed, step), independent of the rank count. Pass `teacher`
    (teacher_params(cfg)) to avoid rebuilding it every step."""
    if count is None:
        count = cfg.batch - start
    if not (0 <= start and 0 <= count and start + count <= cfg.batch):
        raise ValueError(f"rows [{start}, {start + count}) are outside the batch of {cfg.batch}")
    rng = np.random.default_rng([cfg.seed, _DATA, step])
    x = rng.standard_normal((cfg.batch, cfg.hidden), dtype=np.float32)[start:start + count]
    x = np.ascontiguousarray(x)
    y = teacher_forward(teacher if teacher is not None else teacher_params(cfg), x)
    return x, y


def batch_slice(counts: Sequence[int], rank: int) -> tuple[int, int]:
    """(start, count) of rank `rank`'s rows when the batch is split into `counts` (rank order)."""
    return int(sum(counts[:rank])), int(counts[rank])


def layer_forward(ops: Any, W: np.ndarray, b: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, Any]:
    """h_next = h + relu(h @ W + b); the cache (h, where the pre-activation was positive) is what the backward
    needs besides W. The cache does not hold W, so a gathered layer can be freed after its forward. Under mixed
    precision the cache keeps h in the compute dtype (ops.keep) and the residual stream h_next stays float32."""
    z = ops.matmul(h, W)
    z += b
    active = z > 0
    h_next = h + array_module(z).where(active, z, np.float32(0.0))
    keep = getattr(ops, "keep", None)
    return h_next, (keep(h) if keep is not None else h, active)


def layer_backward(ops: Any, W: np.ndarray, cache: Any, grad_out: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dL/dh, dL/dW, dL/db) of one layer, given dL/dh_next."""
    h, active = cache
    gz = array_module(grad_out).where(active, grad_out, np.float32(0.0))
    dW = ops.matmul(h.T, gz)
    db = gz.sum(axis=0, dtype=np.float32)
    grad_in = grad_out + ops.matmul(gz, W.T)
    return grad_in, dW, db


def loss_and_grad(h_out: np.ndarray, y: np.ndarray, global_batch: int) -> tuple[float, np.ndarray]:
    """This part's share of the global loss, sum(0.5 * ||h_out - y||^2) / global_batch, and its gradient
    (h_out - y) / global_batch."""
    diff = h_out - y
    xp = array_module(diff)
    loss = 0.5 * float(xp.sum(xp.square(diff, dtype=xp.float64))) / global_batch
    return loss, diff / np.float32(global_batch)


def flatten(W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One layer's parameters (or gradients) as one flat float32 vector: W row-major, then b."""
    xp = array_module(W)
    return xp.concatenate([xp.ravel(W), xp.ravel(b)]).astype(xp.float32, copy=False)


def unflatten(vec: np.ndarray, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """(W, b) views of a layer's flat vector."""
    if vec.size != layer_size(hidden):
        raise ValueError(f"a layer of hidden size {hidden} has {layer_size(hidden)} elements, not {vec.size}")
    return vec[: hidden * hidden].reshape(hidden, hidden), vec[hidden * hidden:]


def forward(ops: Any, params: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> tuple[np.ndarray, list]:
    """The whole network: (h_L, caches)."""
    h, caches = x, []
    for W, b in params:
        h, cache = layer_forward(ops, W, b, h)
        caches.append(cache)
    return h, caches


def backward(ops: Any, params: Sequence[tuple[np.ndarray, np.ndarray]], caches: list, grad: np.ndarray
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(dW_l, db_l)] for the whole network, given dL/dh_L."""
    grads: list[tuple[np.ndarray, np.ndarray]] = [None] * len(params)  # type: ignore[list-item]
    for layer in reversed(range(len(params))):
        grad, dW, db = layer_backward(ops, params[layer][0], caches[layer], grad)
        grads[layer] = (dW, db)
    return grads
