"""hetbench.train's model, ops, optimizers and single-process reference: gradients against finite differences,
the data's determinism, optimizer steps on shards, and the reference's loss curve."""

from __future__ import annotations

import numpy as np
import pytest

from hetbench.backends.base import BackendSpec
from hetbench.train import StepClock
from hetbench.train.model import (
    TEACHER_LAYERS,
    ModelConfig,
    batch_slice,
    flatten,
    init_params,
    layer_backward,
    layer_forward,
    loss_and_grad,
    make_batch,
    teacher_params,
    unflatten,
)
from hetbench.harness.ops import HostOps, Ops
from hetbench.train.optim import AdamW, make_optimizer
from hetbench.train.reference import reference


class F64Ops:
    """Float64 GEMMs, for the finite-difference checks (the model's functions keep their inputs' dtype)."""

    def matmul(self, a, b):
        return np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)


def test_layer_backward_matches_finite_differences():
    rng = np.random.default_rng(1)
    n, hidden = 5, 4
    W = rng.standard_normal((hidden, hidden))
    b = rng.standard_normal(hidden) * 0.3
    h = rng.standard_normal((n, hidden))
    g = rng.standard_normal((n, hidden))  # dL/dh_next for L = sum(g * h_next)
    ops = F64Ops()

    def objective(W_, b_, h_):
        return float(np.sum(g * layer_forward(ops, W_, b_, h_)[0]))

    out, cache = layer_forward(ops, W, b, h)
    np.testing.assert_allclose(out, h + np.maximum(h @ W + b, 0.0))
    assert np.abs(h @ W + b).min() > 1e-3  # no pre-activation at the ReLU's kink, where the check means nothing
    grad_in, dW, db = layer_backward(ops, W, cache, g)
    eps = 1e-6
    for name, value, analytic in (("W", W, dW), ("b", b, db), ("h", h, grad_in)):
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            plus, minus = value.copy(), value.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args = {"W": (W, b, h), "b": (W, b, h), "h": (W, b, h)}[name]
            args_p = tuple(plus if a is value else a for a in args)
            args_m = tuple(minus if a is value else a for a in args)
            numeric[idx] = (objective(*args_p) - objective(*args_m)) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8, err_msg=name)


def test_loss_and_grad_match_finite_differences_and_sum_over_parts():
    rng = np.random.default_rng(2)
    h = rng.standard_normal((6, 3))
    y = rng.standard_normal((6, 3))
    loss, grad = loss_and_grad(h, y, 6)
    assert loss == pytest.approx(0.5 * np.sum((h - y) ** 2) / 6)
    eps = 1e-6
    for idx in np.ndindex(h.shape):
        plus, minus = h.copy(), h.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric = (loss_and_grad(plus, y, 6)[0] - loss_and_grad(minus, y, 6)[0]) / (2 * eps)
        assert grad[idx] == pytest.approx(numeric, rel=1e-6, abs=1e-9)
    # parts over any split of the rows, each scaled by the GLOBAL batch, add up to the whole
    parts = [loss_and_grad(h[a:b], y[a:b], 6) for a, b in ((0, 4), (4, 4), (4, 6))]
    assert sum(p[0] for p in parts) == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), grad)


def test_whole_network_gradient_matches_finite_differences():
    """The chained layers and the loss together, in float64: d loss / d W_0[0, 1] and d b_2[3]."""
    cfg = ModelConfig(layers=3, hidden=5, batch=7, seed=3)
    params = [(W.astype(np.float64), b.astype(np.float64)) for W, b in init_params(cfg)]
    x, y = (a.astype(np.float64) for a in make_batch(cfg, 0))
    ops = F64Ops()

    def loss_of(ps):
        h = x
        for W, b in ps:
            h = layer_forward(ops, W, b, h)[0]
        return loss_and_grad(h, y, cfg.batch)[0]

    h, caches = x, []
    for W, b in params:
        h, c = layer_forward(ops, W, b, h)
        caches.append(c)
    _, g = loss_and_grad(h, y, cfg.batch)
    grads = [None] * 3
    for layer in reversed(range(3)):
        g, dW, db = layer_backward(ops, params[layer][0], caches[layer], g)
        grads[layer] = (dW, db)
    eps = 1e-6
    for layer, which, idx in ((0, 0, (0, 1)), (2, 1, (3,)), (1, 0, (4, 2))):
        plus = [(W.copy(), b.copy()) for W, b in params]
        minus = [(W.copy(), b.copy()) for W, b in params]
        plus[layer][which][idx] += eps
        minus[layer][which][idx] -= eps
        numeric = (loss_of(plus) - loss_of(minus)) / (2 * eps)
        assert grads[layer][which][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_make_batch_is_deterministic_and_independent_of_the_split():
    cfg = ModelConfig(layers=2, hidden=8, batch=10, seed=5)
    x, y = make_batch(cfg, 3)
    assert x.shape == y.shape == (10, 8) and x.dtype == y.dtype == np.float32
    x2, y2 = make_batch(cfg, 3)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    assert not np.array_equal(make_batch(cfg, 4)[0], x)  # a new batch every step
    assert not np.array_equal(make_batch(ModelConfig(2, 8, 10, seed=6), 3)[0], x)  # and per seed
    teacher = teacher_params(cfg)
    assert len(teacher) == TEACHER_LAYERS
    for counts in ([10], [3, 7], [5, 0, 5], [1, 2, 3, 4]):
        xs, ys = zip(*(make_batch(cfg, 3, *batch_slice(counts, r), teacher=teacher) for r in range(len(counts))))
        np.testing.assert_array_equal(np.concatenate(xs), x)
        np.testing.assert_array_equal(np.concatenate(ys), y)
    # the teacher has the student's form, so the student can represent it; y >= x (ReLU terms only add)
    assert np.all(y >= x)
    with pytest.raises(ValueError, match="outside the batch"):
        make_batch(cfg, 0, 8, 3)


def test_init_and_flat_layout():
    cfg = ModelConfig(layers=3, hidden=6, batch=4, seed=1)
    params = init_params(cfg)
    assert len(params) == 3 and cfg.layer_size == 42 and cfg.param_count == 126
    for W, b in params:
        assert W.shape == (6, 6) and b.shape == (6,) and W.dtype == np.float32
        vec = flatten(W, b)
        assert vec.shape == (42,) and vec.dtype == np.float32
        W2, b2 = unflatten(vec, 6)
        np.testing.assert_array_equal(W2, W)
        np.testing.assert_array_equal(b2, b)
    np.testing.assert_array_equal(init_params(cfg)[2][0], params[2][0])
    big = init_params(ModelConfig(layers=1, hidden=256, batch=1, seed=0))[0][0]
    assert np.std(big) == pytest.approx(0.5 / 16, rel=0.05)
    with pytest.raises(ValueError):
        unflatten(np.zeros(41, np.float32), 6)
    for bad in ({"layers": 0}, {"hidden": -1}, {"batch": 0}):
        with pytest.raises(ValueError):
            ModelConfig(**{"layers": 1, "hidden": 1, "batch": 1, **bad})


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_optimizer_step_on_shards_equals_the_full_step(name):
    rng = np.random.default_rng(4)
    size, bounds = 23, [0, 9, 9, 16, 23]  # uneven shards, one empty
    full = rng.standard_normal(size).astype(np.float32)
    shards = [full[a:b].copy() for a, b in zip(bounds, bounds[1:])]
    full_opt = make_optimizer(name, 1e-2, size)
    shard_opts = [make_optimizer(name, 1e-2, b - a) for a, b in zip(bounds, bounds[1:])]
    for step in range(5):
        grad = rng.standard_normal(size).astype(np.float32)
        full_opt.step(full, grad, step)
        for shard, opt, a, b in zip(shards, shard_opts, bounds, bounds[1:]):
            opt.step(shard, grad[a:b].copy(), step)
        np.testing.assert_array_equal(np.concatenate(shards), full)  # bit for bit
    per_element = 8 if name == "adamw" else 0
    assert full_opt.state_bytes == per_element * size
    assert [o.state_bytes for o in shard_opts] == [per_element * (b - a) for a, b in zip(bounds, bounds[1:])]


def test_adamw_matches_the_formula():
    """Bias-corrected Adam moments and decoupled weight decay, against the textbook formula in float64."""
    p = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    opt = AdamW(lr=0.1, size=3, weight_decay=0.1)
    want = p.astype(np.float64)
    m = v = np.zeros(3)
    for step, g in enumerate(([0.5, -1.0, 0.0], [0.1, 0.2, -0.3])):
        g = np.array(g)
        opt.step(p, g.astype(np.float32), step)
        t = step + 1
        want = want * (1 - 0.1 * 0.1)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        want = want - 0.1 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(p, want, rtol=1e-6)
    # the first step of Adam moves every element with a non-zero gradient by lr (times sign), whatever its size
    q = np.zeros(2, np.float32)
    AdamW(lr=0.1, size=2, weight_decay=0.0).step(q, np.array([1e-3, -50.0], np.float32), 0)
    np.testing.assert_allclose(q, [-0.1, 0.1], rtol=1e-4)


def test_sgd_and_bad_optimizer_input():
    p = np.ones(2, np.float32)
    make_optimizer("sgd", 0.5, 2).step(p, np.array([1.0, -2.0], np.float32), 0)
    np.testing.assert_array_equal(p, [0.5, 2.0])
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lamb", 0.1, 2)
    with pytest.raises(ValueError, match="learning rate"):
        make_optimizer("sgd", 0.0, 2)
    with pytest.raises(ValueError):
        make_optimizer("sgd", 0.1, 2).step(p, np.ones(3, np.float32), 0)


# the default task: ModelConfig() (layers 4, hidden 32, batch 64, seed 0), adamw, lr 1e-2
DEFAULT_LR = 1e-2


def test_reference_loss_falls_tenfold_within_300_steps():
    cfg = ModelConfig()
    assert (cfg.layers, cfg.hidden, cfg.batch) == (4, 32, 64)
    losses, params = reference(cfg, "adamw", DEFAULT_LR, 300)
    assert len(losses) == 300 and all(np.isfinite(losses))
    assert min(losses[-10:]) * 10 <= losses[0], (losses[0], losses[-10:])
    assert max(losses[-10:]) * 10 <= losses[0], (losses[0], losses[-10:])
    assert len(params) == 4 and params[0][0].dtype == np.float32
    # the same call gives the same run
    again, _ = reference(cfg, "adamw", DEFAULT_LR, 3)
    assert again == losses[:3]


def test_reference_with_sgd_learns_too():
    losses, _ = reference(ModelConfig(layers=2, hidden=8, batch=16), "sgd", 0.1, 60)
    assert np.mean(losses[-5:]) < 0.5 * losses[0]


def test_ops_on_a_simulated_device_compute_the_same_and_model_the_time():
    from hetbench.backends import sim

    ops = Ops(sim.open_device(BackendSpec("sim", model="mi300x"), 0, 1))
    host = HostOps()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_array_equal(ops.matmul(a, b), host.matmul(a, b))
    assert ops.modelled and not host.modelled
    assert ops.gemms == 1 and ops.flops == 2 * 6 * 5 * 4
    want = sim.gemm_model_seconds(sim.get_model("mi300x"), 6, 4, 5, "fp32")
    assert ops.compute_seconds == pytest.approx(want)
    assert ops.copy_seconds > 0 and host.copy_seconds == 0.0
    assert ops.matmul(np.zeros((0, 5), np.float32), b).shape == (0, 4)  # a rank with no rows
    ops.reset()
    assert ops.compute_seconds == ops.copy_seconds == ops.wall_seconds == 0.0 and ops.gemms == 0
    # a whole reference run on the simulated device: the same losses as on the host
    cfg = ModelConfig(layers=2, hidden=8, batch=6)
    assert reference(cfg, "adamw", 1e-2, 3, ops=ops)[0] == reference(cfg, "adamw", 1e-2, 3)[0]


def test_step_clock_single_process_accounts_every_second():
    ops = HostOps()
    clock = StepClock(ops, None)
    a = np.ones((64, 64), np.float32)
    ops.matmul(a, a)
    clock.comm(lambda: sum(range(1000)))
    step, compute, comm, idle = clock.finish()
    assert step > 0 and compute >= ops.compute_seconds > 0 and comm > 0
    assert idle == 0.0  # one process: nobody to wait for
    assert step == pytest.approx(compute + comm, abs=1e-12)
