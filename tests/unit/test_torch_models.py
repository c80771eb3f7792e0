"""hetbench.train.torch_frontend.models: the torch front end's tasks. The mlp is hetbench.train's NumPy task exactly (loss and
gradients); both tasks' batches slice the same global batch for any row range; the models are deterministic; the
gpt is causal, starts near ln(vocab) and learns."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from hetbench.train import model as np_model  # noqa: E402
from hetbench.harness.ops import HostOps  # noqa: E402
from hetbench.train.torch_frontend import models  # noqa: E402
from hetbench.train.torch_frontend.models import (  # noqa: E402
    GPT_DEFAULTS,
    TASKS,
    TaskConfig,
    build_model,
    describe,
    make_batch,
    row_losses,
    units,
)

SMALL_GPT = TaskConfig("gpt", layers=1, hidden=32, heads=2, seq_len=32, batch=32, seed=0)


def test_mlp_matches_numpy_loss_and_grads():
    cfg = TaskConfig("mlp", layers=4, hidden=32, batch=64, seed=3)
    ncfg = np_model.ModelConfig(cfg.layers, cfg.hidden, cfg.batch, cfg.seed)
    params = np_model.init_params(ncfg)
    ops = HostOps("fp32")
    model = build_model(cfg)
    for step in (0, 5):
        x_np, y_np = np_model.make_batch(ncfg, step)
        h, caches = np_model.forward(ops, params, x_np)
        loss_np, grad = np_model.loss_and_grad(h, y_np, cfg.batch)
        grads_np = np_model.backward(ops, params, caches, grad)

        x, y = make_batch(cfg, step, 0, cfg.batch)
        np.testing.assert_array_equal(x.numpy(), x_np)
        np.testing.assert_array_equal(y.numpy(), y_np)
        model.zero_grad(set_to_none=True)
        loss = row_losses(model, x, y).sum() / cfg.batch
        loss.backward()
        assert loss.item() == pytest.approx(loss_np, rel=2e-6)
        for layer, (dW, db) in zip(model.layers, grads_np):
            np.testing.assert_allclose(layer.linear.weight.grad.numpy().T, dW, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(layer.linear.bias.grad.numpy(), db, rtol=1e-4, atol=1e-6)


def test_mlp_initial_parameters_are_numpys():
    cfg = TaskConfig("mlp", layers=3, hidden=8, batch=4, seed=7)
    model = build_model(cfg)
    for layer, (W, b) in zip(model.layers, np_model.init_params(cfg.numpy_config())):
        np.testing.assert_array_equal(layer.linear.weight.detach().numpy(), W.T)
        np.testing.assert_array_equal(layer.linear.bias.detach().numpy(), b)
        assert layer.linear.weight.dtype == torch.float32


@pytest.mark.parametrize("cfg", [TaskConfig("mlp", layers=2, hidden=8, batch=10, seed=1),
                                 TaskConfig("gpt", layers=1, hidden=16, heads=2, seq_len=12, batch=10, seed=1)],
                         ids=TASKS)
def test_batch_slices_equal_the_whole_batch(cfg):
    for step in (0, 3):
        x, y = make_batch(cfg, step, 0, cfg.batch)
        assert x.shape[0] == y.shape[0] == cfg.batch
        for start, stop in [(0, 3), (3, 7), (7, 10), (4, 4), (0, 0), (10, 10), (2, 9)]:
            xs, ys = make_batch(cfg, step, start, stop)
            assert torch.equal(xs, x[start:stop]) and torch.equal(ys, y[start:stop])
            assert xs.shape[0] == stop - start
        other, _ = make_batch(cfg, step + 1, 0, cfg.batch)
        assert not torch.equal(other, x)
    with pytest.raises(ValueError):
        make_batch(cfg, 0, 5, 11)
    with pytest.raises(ValueError):
        make_batch(cfg, 0, 6, 5)


def test_gpt_batch_is_the_text_shifted_by_one():
    cfg = TaskConfig("gpt", layers=1, hidden=16, heads=2, seq_len=20, batch=6, seed=4)
    x, y = make_batch(cfg, 2, 0, cfg.batch)
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape == (6, 20)
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in range(6):
        assert models.decode(torch.cat([x[row], y[row, -1:]])) in models.text()


@pytest.mark.parametrize("task", TASKS)
def test_zero_rows_give_zero_losses_and_gradients(task):
    cfg = TaskConfig(task, layers=1, hidden=16, heads=2, seq_len=8, batch=4)
    model = build_model(cfg)
    x, y = make_batch(cfg, 0, 2, 2)
    losses = row_losses(model, x, y)
    assert losses.shape == (0,)
    (losses.sum() / cfg.batch).backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


@pytest.mark.parametrize("task", TASKS)
def test_build_model_is_deterministic_and_leaves_the_global_rng_alone(task):
    cfg = TaskConfig(task, layers=2, hidden=16, heads=2, seq_len=8, batch=4, seed=5)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build_model(cfg).state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(999)
    b = build_model(cfg).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in a.values())
    c = build_model(TaskConfig(task, layers=2, hidden=16, heads=2, seq_len=8, batch=4, seed=6)).state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a if k.endswith("weight"))


def test_units_in_forward_order():
    mlp = build_model(TaskConfig("mlp", layers=3, hidden=8))
    assert units(mlp) == list(mlp.layers) and len(units(mlp)) == 3
    gpt = build_model(TaskConfig("gpt", layers=2, hidden=16, heads=2, seq_len=8))
    assert units(gpt) == list(gpt.blocks) and len(units(gpt)) == 2
    with pytest.raises(TypeError):
        units(torch.nn.Linear(2, 2))


def test_gpt_attention_is_causal():
    cfg = TaskConfig("gpt", layers=2, hidden=32, heads=4, seq_len=16, batch=3, seed=2)
    model = build_model(cfg)
    x, _ = make_batch(cfg, 0, 0, cfg.batch)
    with torch.no_grad():
        before = model(x)
        for t in (5, 15):
            changed = x.clone()
            changed[:, t] = (changed[:, t] + 1) % len(models.vocab())
            after = model(changed)
            torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
            assert not torch.allclose(after[:, t], before[:, t])


def test_gpt_loss_at_init_is_near_ln_vocab():
    for cfg in (SMALL_GPT, TaskConfig("gpt", **GPT_DEFAULTS)):
        model = build_model(cfg)
        x, y = make_batch(cfg, 0, 0, cfg.batch)
        with torch.no_grad():
            losses = row_losses(model, x, y)
        assert losses.shape == (cfg.batch,)
        loss = losses.sum().item() / cfg.batch
        assert abs(loss - math.log(len(models.vocab()))) < 0.2 * math.log(len(models.vocab()))


def test_gpt_loss_falls():
    losses = models.train_curve(SMALL_GPT, 60, lr=1e-2)
    last = sum(losses[-5:]) / 5
    assert last < 0.7 * losses[0], (losses[0], last)


def test_gpt_hidden_must_divide_by_heads():
    with pytest.raises(ValueError, match=r"hidden \(30\).*heads \(4\)"):
        TaskConfig("gpt", hidden=30, heads=4)
    TaskConfig("mlp", hidden=30, heads=4)  # heads is the gpt's alone
    with pytest.raises(ValueError, match="task"):
        TaskConfig("cnn")
    with pytest.raises(ValueError, match="layers"):
        TaskConfig("gpt", layers=0)


def test_describe():
    d = describe(TaskConfig("mlp", layers=3, hidden=8))
    assert d["task"] == "mlp" and d["parameters"] == 3 * (8 * 8 + 8)
    cfg = TaskConfig("gpt", layers=2, hidden=16, heads=2, seq_len=8)
    d = describe(cfg)
    assert d["parameters"] == sum(p.numel() for p in build_model(cfg).parameters())
    assert d["vocab"] == len(models.vocab()) == len(set(models.text()))
    assert d["text"] == "text.txt" and len(d["text_sha256"]) == 64
    assert 30_000 <= len(models.text().encode()) <= 60_000
