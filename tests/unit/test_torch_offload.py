"""hetbench.pytorch.offload: torch matmuls (nn.Linear's and attention's, forward and both backward products) on a
hetbench backend torch cannot drive give torch's numbers, and the device's clocks count them; each operand goes up
once (a weight once per step, never stale); a CuPy rank computes in torch's own GPU where torch has it, else
through the same offload."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import HAVE_OPENCL

torch = pytest.importorskip("torch")

from hetbench.backends.base import BackendSpec, open_backend  # noqa: E402
from hetbench.harness.ops import Ops  # noqa: E402

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



def _same_loss_and_gradients(cfg, plain, moved):
    """The offloaded model's loss and every parameter's gradient are the plain model's, within fp32 tolerance."""
    from hetbench.train.torch_frontend.models import make_batch, row_losses

    x, y = make_batch(cfg, 0, 0, cfg.batch)
    losses = [row_losses(m, x, y).sum() / cfg.batch for m in (plain, moved)]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for loss in losses:
        loss.backward()
    for p, q in zip(plain.parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)

@pytest.mark.parametrize("task", ["mlp", "gpt"])
def test_offloaded_models_train_as_torch_does(task):
    from hetbench.train.torch_frontend.models import TaskConfig, build_model, make_batch, row_losses
    from hetbench.pytorch.offload import offload_linears

    cfg = TaskConfig(task=task, layers=2, hidden=16, heads=2, seq_len=8, batch=6)
    plain, moved = build_model(cfg), build_model(cfg)
    ops = _ops("opencl" if HAVE_OPENCL else "host")
    linears = offload_linears(moved, ops)
    assert linears == sum(isinstance(m, torch.nn.Linear) for m in moved.modules()) > 0
    _same_loss_and_gradients(cfg, plain, moved)
    # every linear's forward and two backward products (but the mlp's first input's, which needs no gradient),
    # and the gpt's attention: 2 layers x 2 products x (batch x heads) pairs x 3 GEMMs
    attention = 2 * 2 * cfg.batch * cfg.heads * 3 if task == "gpt" else 0
    assert ops.gemms == 3 * linears - (1 if task == "mlp" else 0) + attention


def _linear(g: torch.Generator, fan_in: int = 5, fan_out: int = 3) -> torch.nn.Linear:
    with torch.random.fork_rng(devices=[]):
        lin = torch.nn.Linear(fan_in, fan_out)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(fan_out, fan_in, generator=g))
        lin.bias.copy_(torch.randn(fan_out, generator=g))
    return lin


@pytest.mark.parametrize("spec", COPYING)
def test_a_linear_uploads_its_input_weight_and_output_gradient_once_each(spec):
    """Forward y = x @ W^T and both backward products: x, W^T and g^T go up once each (the backward reuses the
    forward's buffers), the three results come down."""
    from hetbench.pytorch.offload import offload_linears

    g = torch.Generator().manual_seed(1)
    plain = _linear(g)
    moved = _linear(torch.Generator().manual_seed(1))
    ops = _ops(spec)
    offload_linears(moved, ops)
    x = torch.randn(4, 5, generator=g)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    w = torch.randn(4, 3, generator=g)
    outs = [m(xi) for m, xi in zip((plain, moved), xs)]
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for out in outs:
        (out * w).sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(moved.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(moved.bias.grad, plain.bias.grad, rtol=1e-5, atol=1e-5)
    assert ops.gemms == 3
    assert ops.uploads == 3 and ops.upload_bytes == 4 * (4 * 5 + 5 * 3 + 3 * 4)
    assert ops.download_bytes == 4 * (4 * 3 + 4 * 5 + 3 * 5)
    assert ops.cache_hits == 0 and ops.copy_seconds > 0


def _accumulate(model, batches, global_batch):
    from hetbench.train.torch_frontend.models import row_losses

    for x, y in batches:
        (row_losses(model, x, y).sum() / global_batch).backward()


@pytest.mark.parametrize("spec", COPYING)
def test_a_weight_goes_up_once_per_step_and_again_after_reset(spec):
    """Two micro-batches of one step (gradient accumulation) read every weight twice: it goes up once, the second
    forward finds it in the step's cache; reset() (a new step) empties the cache."""
    from hetbench.train.torch_frontend.models import TaskConfig, build_model, make_batch
    from hetbench.pytorch.offload import offload_linears

    cfg = TaskConfig(task="mlp", layers=3, hidden=8, batch=12)
    plain, moved = build_model(cfg), build_model(cfg)
    ops = _ops(spec)
    linears = offload_linears(moved, ops)
    weight_bytes = sum(4 * m.weight.numel() for m in moved.modules() if isinstance(m, torch.nn.Linear))
    batches = [make_batch(cfg, 0, 0, 6), make_batch(cfg, 0, 6, 12)]
    ops.reset()
    _accumulate(moved, batches[:1], cfg.batch)
    one = ops.upload_bytes
    assert ops.cache_hits == 0 and one > weight_bytes
    moved.zero_grad()
    ops.reset()
    _accumulate(moved, batches, cfg.batch)
    assert ops.cache_hits == linears
    assert ops.upload_bytes == 2 * one - weight_bytes  # the second micro-batch uploads no weight
    _accumulate(plain, batches, cfg.batch)
    for p, q in zip(plain.parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    ops.reset()
    assert (ops.upload_bytes, ops.download_bytes, ops.uploads, ops.cache_hits) == (0, 0, 0, 0)
    _accumulate(moved, batches[:1], cfg.batch)
    assert ops.upload_bytes == one and ops.cache_hits == 0  # the weights went up again: a new step


@pytest.mark.parametrize("spec", SPECS)
def test_an_in_place_change_of_a_weight_within_a_step_is_never_served_stale(spec):
    """The same weight tensor changed in place (an optimizer step) before another forward of the same step (no
    reset between): the cached W^T no longer holds and the new values go up, with or without a weight_key."""
    from hetbench.pytorch.offload import offload_linears

    g = torch.Generator().manual_seed(2)
    ops = _ops(spec)
    for key in (None, "fc"):
        lin = _linear(g)
        offload_linears(lin, ops)
        if key is not None:
            lin.weight_key = key
        x = torch.randn(4, 5, generator=g)
        ops.reset()
        torch.testing.assert_close(lin(x), x @ lin.weight.detach().t() + lin.bias.detach(), rtol=1e-5, atol=1e-5)
        assert lin(x) is not None and ops.cache_hits == 1  # unchanged: found again
        with torch.no_grad():
            lin.weight.mul_(-2.0).add_(1.0)  # bumps the weight's _version
        uploads = ops.uploads
        torch.testing.assert_close(lin(x), x @ lin.weight.detach().t() + lin.bias.detach(), rtol=1e-5, atol=1e-5)
        assert ops.cache_hits == 1  # no hit: the new weight was staged again
        if spec != "host":
            assert ops.uploads == uploads + 2  # x and the new W^T


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("keep", [True, False])
def test_fresh_weights_at_one_address_are_never_taken_for_one_another(spec, keep):
    """Fresh weight tensors at the same address, with the same shape, stride and version, alive together (views of
    one buffer) or made and dropped one after another (a sharded model's gathered views into a reused buffer): each
    product reads its own weight (an address is no identity), and a dead tensor's entry leaves the cache."""
    from hetbench.pytorch.offload import device_linear

    rng = np.random.default_rng(3)
    ops = _ops(spec)
    x = torch.from_numpy(rng.standard_normal((4, 5)).astype(np.float32))
    buffer = np.empty((3, 5), np.float32)
    kept, facts = [], set()
    for _ in range(4):
        buffer[...] = rng.standard_normal((3, 5))  # written where torch counts no version
        w = torch.from_numpy(buffer)
        facts.add((w.data_ptr(), w.storage_offset(), w.stride(), w._version))
        torch.testing.assert_close(device_linear(x, w, None, ops), x @ torch.from_numpy(buffer.copy()).t(),
                                   rtol=1e-5, atol=1e-5)
        if keep:
            kept.append(w)
        del w
    assert len(facts) == 1 and ops.cache_hits == 0
    assert len(ops._cache) == (4 if keep else 0)


@pytest.mark.parametrize("spec", COPYING)
def test_a_weight_key_finds_a_regathered_fresh_tensor(spec):
    """Sharded FSDP gives the backward (or a later micro-batch) a fresh tensor of the same weight: under the same
    weight_key it is found in the step's cache, and the results are the fresh tensor's (equal) values."""
    from hetbench.pytorch.offload import device_linear

    g = torch.Generator().manual_seed(4)
    ops = _ops(spec)
    w = torch.randn(3, 5, generator=g)
    x = torch.randn(4, 5, generator=g)
    first = device_linear(x, w.clone(), None, ops, weight_key=("block0", "fc"))
    uploads = ops.uploads
    again = device_linear(x, w.clone(), None, ops, weight_key=("block0", "fc"))
    assert ops.cache_hits == 1 and ops.uploads == uploads + 1  # only x
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(again, x @ w.t(), rtol=1e-5, atol=1e-5)
    other = torch.randn(3, 5, generator=g)  # another weight under another key
    torch.testing.assert_close(device_linear(x, other, None, ops, weight_key=("block1", "fc")), x @ other.t(),
                               rtol=1e-5, atol=1e-5)
    assert ops.cache_hits == 1
    ops.reset()
    device_linear(x, w.clone(), None, ops, weight_key=("block0", "fc"))
    assert ops.cache_hits == 0  # a new step: uploaded again


@pytest.mark.parametrize("spec", SPECS)
def test_a_batched_product_is_one_node_with_each_operand_uploaded_once(spec):
    """Attention's (B, H, T, D) @ (B, H, D, T): one autograd node (not B x H), each whole operand up once, B x H
    GEMMs; forward and both gradients as torch's, broadcast leading dimensions included."""
    from hetbench.pytorch.offload import device_matmul

    g = torch.Generator().manual_seed(5)
    ops = _ops(spec)
    for a_shape, b_shape in [((2, 3, 5, 4), (2, 3, 4, 6)), ((2, 1, 5, 4), (3, 4, 6)), ((4,), (2, 4, 3)),
                             ((2, 3, 4), (4,)), ((4,), (4,))]:
        a = torch.randn(*a_shape, generator=g, requires_grad=True)
        b = torch.randn(*b_shape, generator=g, requires_grad=True)
        ops.reset()
        out = device_matmul(a, b, ops)
        want = torch.matmul(a, b)
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        w = torch.randn(want.shape, generator=g)
        ga, gb = torch.autograd.grad((out * w).sum(), (a, b))
        wa, wb = torch.autograd.grad((want * w).sum(), (a, b))
        torch.testing.assert_close(ga, wa, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gb, wb, rtol=1e-5, atol=1e-5)
    a = torch.randn(2, 3, 5, 4, generator=g, requires_grad=True)
    b = torch.randn(2, 3, 4, 6, generator=g, requires_grad=True)
    ops.reset()
    out = device_matmul(a, b, ops)
    nodes = {type(out.grad_fn).__name__}
    nodes |= {type(f).__name__ for f, _ in out.grad_fn.next_functions if f is not None}
    assert "DeviceMatmulBackward" in nodes and "StackBackward0" not in nodes
    assert ops.gemms == 6
    if spec != "host":
        assert ops.uploads == 2 and ops.upload_bytes == 4 * (6 * 5 * 4 + 6 * 4 * 6)
        assert ops.download_bytes == 4 * 6 * 5 * 6
    out.sum().backward()
    assert ops.gemms == 18
    if spec != "host":
        assert ops.uploads == 3  # g^T, for both gradients


@pytest.mark.parametrize("spec", SPECS)
def test_a_second_backward_under_retain_graph_stages_the_operands_again(spec):
    from hetbench.pytorch.offload import device_matmul, offload_linears

    g = torch.Generator().manual_seed(6)
    ops = _ops(spec)
    lin = _linear(g)
    offload_linears(lin, ops)
    x = torch.randn(4, 5, generator=g, requires_grad=True)
    k = torch.randn(2, 4, 3, generator=g, requires_grad=True)
    loss = device_matmul(lin(x).unsqueeze(0).expand(2, 4, 3).transpose(-2, -1), k, ops).square().sum()
    want = torch.matmul((x @ lin.weight.t() + lin.bias).unsqueeze(0).expand(2, 4, 3).transpose(-2, -1), k)
    want = want.square().sum()
    loss.backward(retain_graph=True)
    loss.backward()
    grads = torch.autograd.grad(want, (x, lin.weight, k))
    for got, wanted in zip((x.grad, lin.weight.grad, k.grad), grads):
        torch.testing.assert_close(got, 2 * wanted, rtol=1e-5, atol=1e-5)


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


# ---- CuPy ranks: torch's own GPU where this torch build drives it, else the offload through the CuPy backend ----

class _Backend:
    """What for_backend asks of an open backend: its memory kind for MPI, its timing, its device index."""

    def __init__(self, kind: str, timing: str = "measured", device_index: int | None = None) -> None:
        self.kind, self.timing = kind, timing
        if device_index is not None:
            self.device_index = device_index

    def mpi_memory_kind(self) -> str:
        return self.kind


def _torch_gpus(monkeypatch, hip: str | None, count: int = 2) -> None:
    """torch as a CUDA (hip None) or ROCm build seeing `count` GPUs (0: none, as a CPU build)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: f"gpu {i}")
    monkeypatch.setattr(torch.version, "hip", hip)


@pytest.mark.parametrize("kind, hip, count, want", [
    ("cuda", None, 2, "cuda:1"),  # a CUDA build, an NVIDIA GPU: the backend's own device
    ("hip", "6.2.41134", 2, "cuda:1"),  # a ROCm build, an AMD GPU (torch calls it "cuda" too)
    ("hip", None, 2, "cpu"),  # a CUDA build cannot drive the ROCm GPU
    ("cuda", "6.2.41134", 2, "cpu"),  # nor a ROCm build the NVIDIA one
    ("cuda", None, 0, "cpu"),  # a CPU build of torch (or no GPU visible)
    ("hip", "6.2.41134", 0, "cpu"),
])
def test_a_cupy_rank_computes_on_torchs_gpu_only_where_torch_drives_it(monkeypatch, kind, hip, count, want):
    from hetbench.pytorch.device import for_backend

    _torch_gpus(monkeypatch, hip, count)
    device = for_backend(_Backend(kind, device_index=1), "cupy:1", local_rank=0)
    assert device.torch_device == want
    assert device.torch_has_device == (want != "cpu")
    if want == "cpu":
        assert "through hetbench" in device.note  # the trainer offloads its matmuls to the backend
    else:
        assert device.vendor == ("amd" if hip else "nvidia") and device.name == "gpu 1"


def test_the_other_backends_torch_device(monkeypatch):
    from hetbench.pytorch.device import for_backend

    _torch_gpus(monkeypatch, None, 2)
    simulated = for_backend(_Backend("cuda", timing="modelled"), "sim:h100", 0)  # a simulated GPU is no GPU
    assert (simulated.torch_device, simulated.torch_has_device) == ("cpu", False)
    opencl = for_backend(_Backend("none"), "opencl:0", 0)
    assert (opencl.torch_device, opencl.torch_has_device) == ("cpu", False)
    host = for_backend(_Backend("host"), "host", 0)
    assert (host.torch_device, host.torch_has_device) == ("cpu", True)
    # without a device index (a backend that has none), the local rank's GPU, round robin
    assert for_backend(_Backend("cuda"), "cupy", 3).torch_device == "cuda:1"


@pytest.fixture
def fake_cupy_backend(monkeypatch):
    """The real CuPy backend over the tests' fake CuPy (doubles.py), whose device arrays, like CuPy's, refuse to
    become NumPy arrays implicitly and slice as CuPy's do."""
    from doubles import FakeDeviceArray, FakeRuntime, make_fake_cupy

    from hetbench.backends import cupy as cupy_backend
    from hetbench.backends import sim

    def no_implicit_copy(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")

    monkeypatch.setattr(FakeDeviceArray, "__array__", no_implicit_copy, raising=False)
    monkeypatch.setattr(FakeDeviceArray, "__getitem__",
                        lambda self, i: FakeDeviceArray(self._fake, self.array[i], self.device_id), raising=False)
    fake = make_fake_cupy(FakeRuntime.from_models([sim.get_model("h100")]), matmul_ms=1.0)
    return cupy_backend.CupyBackend(0, cupy_module=fake), fake


@pytest.mark.parametrize("task", ["mlp", "gpt"])
def test_a_cupy_rank_without_torch_gpu_runs_its_products_on_the_cupy_backend(fake_cupy_backend, monkeypatch, task):
    """torch without the GPU (a CPU build here): the products go through the same offload on the CuPy backend, its
    Ops resident as the numpy trainer's, every operand uploaded and result downloaded through the backend."""
    from hetbench.pytorch.device import for_backend
    from hetbench.train.torch_frontend.models import TaskConfig, build_model, make_batch, row_losses
    from hetbench.pytorch.offload import offload_linears

    backend, fake = fake_cupy_backend
    _torch_gpus(monkeypatch, None, 0)
    assert not for_backend(backend, "cupy", 0).torch_has_device
    ops = Ops(backend)
    assert ops.resident and ops.xp is fake  # the numpy trainer would keep its state on the GPU
    cfg = TaskConfig(task=task, layers=2, hidden=8, heads=2, seq_len=4, batch=3)
    plain, moved = build_model(cfg), build_model(cfg)
    offload_linears(moved, ops)
    _same_loss_and_gradients(cfg, plain, moved)
    calls = [c for c, _ in fake.log]
    assert calls.count("matmul") == ops.gemms > 0 and calls.count("asarray") == ops.uploads > 0
    assert 0 < calls.count("get") <= ops.gemms  # one download per product (a batched one's B x H GEMMs: one)
    assert ops.upload_bytes > 0 and ops.compute_seconds == pytest.approx(ops.gemms * 1e-3)


@pytest.mark.parametrize("cores,local_size,offloaded,want", [
    (16, 2, True, (8, 1)),    # a simulated or OpenCL rank beside torch's threads: NumPy's BLAS at one thread
    (16, 2, False, (8, None)),  # torch computes the products itself: BLAS keeps the share harness.devices gave it
    (2, 2, True, (1, None)),  # one thread each already
    (16, 1, True, (None, None)),  # alone on its node: nothing set
    (3, 4, True, (1, None)),
])
def test_thread_counts_share_the_cores_and_keep_one_pool_spinning(monkeypatch, cores, local_size, offloaded, want):
    from hetbench.backends import host
    from hetbench.train.torch_frontend import run as trainer

    for variable in host._THREAD_ENV:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(host, "_cores", lambda: cores)
    assert trainer.thread_counts(local_size, offloaded) == want
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's count wins: nothing is set
    assert trainer.thread_counts(local_size, offloaded) == (None, None)


def test_step_seconds_replaces_the_emulation_with_the_modelled_time_on_a_simulated_device():
    from types import SimpleNamespace

    from hetbench.pytorch.offload import step_seconds

    # 5 s of wall time, 1 s of it the host emulating the device's products, modelled as 0.25 s of GEMMs and 0.5 s
    # of copies: the span took 5 - 1 + 0.25 + 0.5
    modelled = SimpleNamespace(modelled=True, wall_seconds=1.0, compute_seconds=0.25, copy_seconds=0.5)
    assert step_seconds(modelled, 5.0) == 4.75
    measured = SimpleNamespace(modelled=False, wall_seconds=1.0, compute_seconds=0.25, copy_seconds=0.5)
    assert step_seconds(measured, 5.0) == 5.0  # a real device's wall time is the step's
    assert step_seconds(None, 5.0) == 5.0
