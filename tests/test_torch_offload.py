"""hetbench.pytorch.offload: torch matmuls (nn.Linear's and attention's, forward and both backward products) on a
hetbench backend torch cannot drive give torch's numbers, and the device's clocks count them; each operand goes up
once (a weight once per step, never stale)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import HAVE_OPENCL

torch = pytest.importorskip("torch")

from hetbench.backends.base import BackendSpec, open_backend  # noqa: E402
from hetbench.train.ops import Ops  # noqa: E402

SPECS = ["host", "sim:mi300x"] + (["opencl:0"] if HAVE_OPENCL else [])
# the backends that copy (the host backend computes on host arrays as they are)
COPYING = [s for s in SPECS if s != "host"]


def _ops(spec: str, dtype: str = "fp32") -> Ops:
    """Ops on `spec`: host, sim:MODEL or opencl:INDEX, as a rank map names them."""
    name, _, rest = spec.partition(":")
    if name == "sim":
        backend_spec = BackendSpec(name, model=rest)
    else:
        backend_spec = BackendSpec(name, int(rest) if rest else None)
    return Ops(open_backend(backend_spec, 0, 1), dtype)


@pytest.mark.parametrize("spec", SPECS)
def test_products_and_their_gradients_match_torch(spec):
    from hetbench.pytorch.offload import device_matmul

    ops = _ops(spec)
    g = torch.Generator().manual_seed(0)
    for a_shape, b_shape in [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 3, 5, 4), (2, 3, 4, 6)), ((3, 5, 4), (4, 2))]:
        a = torch.randn(*a_shape, generator=g, requires_grad=True)
        b = torch.randn(*b_shape, generator=g, requires_grad=True)
        out = device_matmul(a, b, ops)
        want = torch.matmul(a, b)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        w = torch.randn(*want.shape, generator=g)
        ga, gb = torch.autograd.grad((out * w).sum(), (a, b))
        wa, wb = torch.autograd.grad((want * w).sum(), (a, b))
        torch.testing.assert_close(ga, wa, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gb, wb, rtol=1e-5, atol=1e-5)
    assert ops.gemms > 0 and ops.compute_seconds > 0
    if spec.startswith("opencl"):
        assert ops.copy_seconds > 0  # operands up, results down
    assert ops.modelled == spec.startswith("sim")


@pytest.mark.parametrize("task", ["mlp", "gpt"])
def test_offloaded_models_train_as_torch_does(task):
    from hetbench.pytorch.models import TaskConfig, build_model, make_batch, row_losses
    from hetbench.pytorch.offload import offload_linears

    cfg = TaskConfig(task=task, layers=2, hidden=16, heads=2, seq_len=8, batch=6)
    plain, moved = build_model(cfg), build_model(cfg)
    ops = _ops("opencl" if HAVE_OPENCL else "host")
    linears = offload_linears(moved, ops)
    assert linears == sum(isinstance(m, torch.nn.Linear) for m in moved.modules()) > 0
    x, y = make_batch(cfg, 0, 0, cfg.batch)
    losses = [row_losses(m, x, y).sum() / cfg.batch for m in (plain, moved)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for loss in losses:
        loss.backward()
    for p, q in zip(plain.parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    # every linear's forward and two backward products (but the mlp's first input's, which needs no gradient),
    # and the gpt's attention: 2 layers x 2 products x (batch x heads) pairs x 3 GEMMs
    attention = 2 * 2 * cfg.batch * cfg.heads * 3 if task == "gpt" else 0
    assert ops.gemms == 3 * linears - (1 if task == "mlp" else 0) + attention


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_gemm_on_staged_operands_rounds_as_matmul_does(spec, dtype):
    """Ops.gemm (staged operands, batched or not) gives Ops.matmul's values in every compute dtype, natively or
    emulated; a staged operand serves any number of products."""
    ops = _ops(spec, dtype)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 5, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4, 6)).astype(np.float32)
    sb = ops.stage(b[0])
    for i in range(3):
        np.testing.assert_array_equal(ops.gemm(a[i], sb), ops.matmul(a[i], b[0]))
    batched = ops.gemm(ops.stage(a), b)
    for i in range(3):
        np.testing.assert_array_equal(batched[i], ops.matmul(a[i], b[i]))
    with pytest.raises(ValueError, match="do not fit"):
        ops.gemm(a, b[0])
    assert ops.gemm(np.zeros((0, 4), np.float32), b[0]).shape == (0, 6)
