"""A user's rank on a hetbench device (hetbench.pytorch.rank_backend.open_device, by --backend's specs) and the
offload of every product a transformers model asks torch for (hetbench.pytorch.offload.offload): GPT-2 (its
projections transformers' Conv1D, torch.addmm) and Llama (grouped kv heads), with scaled_dot_product_attention and
with eager attention, train as on the CPU (losses and every gradient within fp32 rounding), and the device counted
every product, forward and backward, from the config: the figures the CLI's step lines give, the simulated
device's labelled modelled. scaled_dot_product_attention's own semantics (causal, masks, dropout, scale, GQA) and
the other products (addmm, baddbmm, mm, bmm, matmul, @) against torch's; a bad spec is --backend's one line."""

from __future__ import annotations

import pytest
from helpers import needs_opencl

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from hetbench.backends.base import BackendUnavailable  # noqa: E402
from hetbench.config import parse_backend_spec  # noqa: E402
from hetbench.pytorch.offload import offload  # noqa: E402
from hetbench.pytorch.rank_backend import open_device  # noqa: E402

SPECS = ["sim:mi300x", pytest.param("opencl", marks=needs_opencl)]
BATCH, SEQ, VOCAB = 3, 12, 128
_OPEN: dict[str, object] = {}


def device(spec: str):
    """One open device per spec for the module (an OpenCL context is slow to make)."""
    if spec not in _OPEN:
        _OPEN[spec] = open_device(spec, share_cores=False)
    dev = _OPEN[spec]
    dev.reset()
    return dev


def config(kind: str, attention: str, dropout: float = 0.0):
    """The small configs: 2 layers, hidden 64, 4 heads (Llama: 2 key/value heads), vocab 128."""
    if kind == "gpt2":
        return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                          eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                          attn_implementation=attention)
    return LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=SEQ,
                       attention_dropout=dropout, attn_implementation=attention)


def pair(cfg):
    """The same seeded model twice: the CPU's and the one to offload."""
    make = GPT2LMHeadModel if isinstance(cfg, GPT2Config) else LlamaForCausalLM
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(make(cfg).train())
    return models


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


def loss_of(model, x: torch.Tensor, seed: int = 7) -> torch.Tensor:
    torch.manual_seed(seed)  # dropout draws the same masks in both models
    return model(input_ids=x, labels=x).loss


def assert_same_training(plain, moved, loss_plain, loss_moved) -> None:
    torch.testing.assert_close(loss_moved, loss_plain, rtol=1e-5, atol=1e-6)
    loss_plain.backward()
    loss_moved.backward()
    for (name, p), q in zip(plain.named_parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def expected_products(cfg, attention: str) -> tuple[int, int, dict[str, int]]:
    """(2-D GEMMs, uploads, calls) of one forward and backward, from the config. Each projection (GPT-2's c_attn,
    attention c_proj, c_fc, mlp c_proj: Conv1D's addmm; Llama's q, k, v, o, gate, up, down: nn.Linear) and the
    lm_head: one GEMM forward, two backward, three uploads (x, W, g^T). Each layer's two attention products (QK^T,
    PV): batch x heads GEMMs forward and twice that backward, three uploads; with sdpa, Llama's query heads that
    share a key/value head go as one GEMM (enable_gqa), eager attention has repeated k and v (repeat_kv) per head."""
    layers, heads = cfg.num_hidden_layers, cfg.num_attention_heads
    gpt2 = isinstance(cfg, GPT2Config)
    projections = 4 if gpt2 else 7
    if not gpt2 and attention == "sdpa":
        heads = cfg.num_key_value_heads
    gemms = layers * (3 * projections + 2 * 3 * BATCH * heads) + 3
    uploads = layers * (3 * projections + 2 * 3) + 3
    attention_calls = {"scaled_dot_product_attention": layers} if attention == "sdpa" else {"matmul": 2 * layers}
    calls = {("addmm" if gpt2 else "linear"): projections * layers, **attention_calls}
    calls["linear"] = calls.get("linear", 0) + 1  # the lm_head
    return gemms, uploads, calls


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_transformers_model_trains_on_the_device_as_on_the_cpu(spec, kind, attention):
    cfg = config(kind, attention)
    plain, moved = pair(cfg)
    dev = device(spec)
    offloaded = dev.offload(moved)  # offload(moved, dev)
    assert offloaded.modules == len(list(moved.modules()))
    x = tokens()
    with dev.step() as figures:
        loss = loss_of(moved, x)
        loss.backward()
    moved.zero_grad()
    assert_same_training(plain, moved, loss_of(plain, x), loss_of(moved, x))
    gemms, uploads, calls = expected_products(cfg, attention)
    assert figures["device_gemms"] == gemms
    assert figures["device_uploads"] == uploads
    assert figures["device_calls"] == calls and figures["torch_calls"] == {}
    assert figures["device_timing"] == ("modelled" if spec.startswith("sim") else "measured")
    assert figures["device_gemm_seconds"] > 0 and figures["device_copy_seconds"] > 0
    assert figures["device_upload_bytes"] > 0 and figures["device_cache_hits"] == 0
    assert 0 < figures["step_seconds"]
    offloaded.remove()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_dropout_draws_the_masks_torch_draws(attention):
    """GPT-2 with dropout 0.1 (attention's inside scaled_dot_product_attention): the same seed gives the CPU model's
    loss and gradients, so the decomposition draws torch's own masks in torch's order."""
    cfg = config("gpt2", attention, dropout=0.1)
    plain, moved = pair(cfg)
    dev = device("sim:mi300x")
    offload(moved, dev)
    x = tokens()
    assert_same_training(plain, moved, loss_of(plain, x), loss_of(moved, x))
    assert loss_of(plain, x, seed=8).item() != loss_of(plain, x, seed=7).item()  # the masks do change the loss


def test_conv1d_weights_go_up_once_per_step():
    """Two micro-batches of one step: the second forward finds every weight (GPT-2's 4 Conv1D a layer and the tied
    lm_head) staged; a new step uploads them again."""
    cfg = config("gpt2", "sdpa")
    plain, moved = pair(cfg)
    dev = device("sim:mi300x")
    offload(moved, dev)
    batches = [tokens(1), tokens(2)]
    with dev.step() as one:
        loss_of(moved, batches[0]).backward()
    moved.zero_grad()
    with dev.step() as two:
        for x in batches:
            loss_of(moved, x).backward()
    conv1d = [m for m in moved.modules() if isinstance(m, transformers.pytorch_utils.Conv1D)]
    assert len(conv1d) == 4 * cfg.num_hidden_layers
    weight_bytes = 4 * (sum(m.weight.numel() for m in conv1d) + moved.lm_head.weight.numel())
    assert one["device_cache_hits"] == 0 and two["device_cache_hits"] == len(conv1d) + 1
    assert two["device_upload_bytes"] == 2 * one["device_upload_bytes"] - weight_bytes
    for x in batches:
        loss_of(plain, x).backward()
    for p, q in zip(plain.parameters(), moved.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)


def test_layers_recomputed_under_activation_checkpointing_run_on_the_device():
    cfg = config("gpt2", "sdpa")
    plain, moved = pair(cfg)
    moved.activation_checkpointing_enable({"use_reentrant": False})
    dev = device("sim:mi300x")
    offload(moved, dev)
    x = tokens()
    with dev.step() as figures:
        loss = loss_of(moved, x)
        assert_same_training(plain, moved, loss_of(plain, x), loss)
    gemms, _, _ = expected_products(cfg, "sdpa")
    assert figures["device_gemms"] > gemms and figures["device_cache_hits"] > 0  # the recompute's, its weights found
    assert figures["torch_calls"] == {}


def _attention_cases():
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    q, k, v = r(2, 4, 5, 8), r(2, 4, 7, 8), r(2, 4, 7, 6)
    holes = torch.rand(5, 7, generator=g) > 0.4
    holes[2] = False  # a query that may attend to nothing: zeros, as torch's safe softmax gives
    yield "plain", (q, k, v), {}
    yield "causal", (q, k, v), {"is_causal": True}
    yield "causal-longer-query", (r(2, 4, 7, 8), r(2, 4, 5, 8), r(2, 4, 5, 8)), {"is_causal": True}
    yield "bool-mask", (q, k, v), {"attn_mask": holes}
    yield "float-mask", (q, k, v), {"attn_mask": r(2, 1, 5, 7)}
    yield "scale", (q, k, v), {"scale": 0.3}
    yield "negative-scale", (q, k, v), {"scale": -0.3}
    yield "dropout", (q, k, v), {"dropout_p": 0.3}
    yield "gqa", (q, r(2, 2, 7, 8), r(2, 2, 7, 6)), {"enable_gqa": True, "is_causal": True}
    yield "gqa-dropout-mask", (q, r(2, 1, 7, 8), r(2, 1, 7, 6)), {"enable_gqa": True, "dropout_p": 0.2,
                                                                  "attn_mask": holes}
    yield "three-dims", (r(3, 5, 8), r(3, 7, 8), r(3, 7, 6)), {}
    yield "broadcast-kv", (q, r(2, 1, 7, 8), r(2, 1, 7, 6)), {}


@pytest.mark.parametrize("spec", SPECS)
def test_scaled_dot_product_attention_is_torchs(spec):
    """Each case's output and the gradients of q, k, v (and a float mask) as torch's own, with the same seed for
    dropout; both products on the device, 3 x batch x heads GEMMs each (forward, two backward)."""
    dev = device(spec)
    for name, tensors, kw in _attention_cases():
        mine = [t.clone().requires_grad_(True) for t in tensors]
        theirs = [t.clone().requires_grad_(True) for t in tensors]
        mask = kw.get("attn_mask")
        if mask is not None and mask.is_floating_point():
            kw = {**kw, "attn_mask": mask.clone().requires_grad_(True)}
            kw_theirs = {**kw, "attn_mask": mask.clone().requires_grad_(True)}
        else:
            kw_theirs = kw
        torch.manual_seed(11)
        want = F.scaled_dot_product_attention(*theirs, **kw_theirs)
        dev.reset()
        with dev.offloading():
            torch.manual_seed(11)
            got = F.scaled_dot_product_attention(*mine, **kw)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(4))
        (got * weights).sum().backward()
        (want * weights).sum().backward()
        pairs = list(zip(mine, theirs))
        if mask is not None and mask.is_floating_point():
            pairs.append((kw["attn_mask"], kw_theirs["attn_mask"]))
        for a, b in pairs:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        assert dev.mode.device_calls == {"scaled_dot_product_attention": 1}, name
        assert dev.ops.gemms > 0


def test_attention_the_device_does_not_take_is_torchs():
    """float64, an explicit mask with is_causal (which torch's CPU kernels read in different ways), heads that do
    not divide (torch's own error): left to torch, counted as torch's."""
    dev = device("sim:mi300x")
    q = torch.randn(1, 4, 3, 8, dtype=torch.float64)
    q32 = q.float()
    both = {"attn_mask": torch.ones(3, 3, dtype=torch.bool), "is_causal": True}
    with dev.offloading():
        torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q), F.scaled_dot_product_attention(q, q, q))
        got = F.scaled_dot_product_attention(q32, q32, q32, **both)
        with pytest.raises(RuntimeError, match="must divide"):
            F.scaled_dot_product_attention(q32, q32[:, :3], q32[:, :3], enable_gqa=True)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q32, q32, q32, **both), rtol=0, atol=0)
    assert dev.mode.torch_calls == {"scaled_dot_product_attention": 4} and dev.ops.gemms == 0


def _product_cases(g: torch.Generator):
    def r(*shape, param=False):
        t = torch.randn(*shape, generator=g)
        return torch.nn.Parameter(t) if param else t

    yield "addmm", torch.addmm, (r(4), r(3, 5), r(5, 4, param=True)), {}
    yield "addmm-beta-alpha", torch.addmm, (r(3, 4), r(3, 5), r(5, 4)), {"beta": 0.5, "alpha": -2.0}
    yield "tensor-addmm", torch.Tensor.addmm, (r(1, 4), r(3, 5), r(5, 4)), {"alpha": 3}
    yield "baddbmm", torch.baddbmm, (r(2, 3, 4), r(2, 3, 5), r(2, 5, 4)), {"beta": 2.0}
    yield "mm", torch.mm, (r(3, 5), r(5, 4, param=True)), {}
    yield "bmm", torch.bmm, (r(2, 3, 5), r(2, 5, 4)), {}
    yield "matmul-broadcast", torch.matmul, (r(2, 1, 3, 5), r(4, 5, 2)), {}
    yield "matmul-vector", torch.matmul, (r(5), r(2, 5, 3)), {}
    yield "matmul-parameter", torch.matmul, (r(2, 3, 5), r(5, 4, param=True)), {}
    yield "operator", lambda a, b: a @ b, (r(3, 5), r(5, 4)), {}
    yield "rmatmul", torch.Tensor.__rmatmul__, (r(5, 4), r(3, 5)), {}
    yield "linear", F.linear, (r(2, 3, 5), r(4, 5, param=True), r(4)), {}
    yield "linear-vector", F.linear, (r(5), r(4, 5)), {}


@pytest.mark.parametrize("spec", SPECS)
def test_the_other_products_are_torchs(spec):
    dev = device(spec)
    g = torch.Generator().manual_seed(5)
    for name, fn, tensors, kw in _product_cases(g):
        mine = [torch.nn.Parameter(t.detach().clone()) for t in tensors]
        theirs = [torch.nn.Parameter(t.detach().clone()) for t in tensors]
        want = fn(*theirs, **kw)
        dev.reset()
        with dev.offloading():
            got = fn(*mine, **kw)
        assert sum(dev.mode.device_calls.values()) == 1 and not dev.mode.torch_calls, name
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        w = torch.randn(want.shape, generator=g)
        (got * w).sum().backward()
        (want * w).sum().backward()
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_products_the_device_does_not_take_are_torchs():
    dev = device("sim:mi300x")
    a, b = torch.randn(3, 5), torch.randn(5, 4)
    with dev.offloading():
        torch.testing.assert_close(torch.mm(a.double(), b.double()), a.double() @ b.double())  # float64
        out = torch.empty(3, 4)
        torch.mm(a, b, out=out)  # out=
        with pytest.raises(RuntimeError, match="cannot be multiplied"):  # torch's own error
            torch.mm(a, a)
        torch.matmul(torch.empty(0, 5), b)  # nothing to compute
    assert dev.mode.device_calls == {} and dev.mode.torch_calls == {"mm": 3, "matmul": 2}
    assert dev.ops.gemms == 0


@pytest.mark.parametrize("spec, line", [
    ("bogus", "unknown backend 'bogus'; accepted: auto, host, opencl[:INDEX], cupy[:INDEX], sim:MODEL[:INDEX]"),
    ("sim:foo", "unknown simulated GPU 'foo' in 'sim:foo'; accepted: "),
    ("sim", "backend 'sim' names no simulated GPU; write sim:MODEL"),
    ("opencl:x", "bad device index 'x' in backend 'opencl:x'"),
])
def test_a_bad_spec_is_backends_one_line(spec, line):
    with pytest.raises(ValueError) as raised:
        open_device(spec)
    message = str(raised.value)
    assert message.startswith(line) and "\n" not in message
    with pytest.raises(ValueError) as cli:
        parse_backend_spec(spec)
    assert str(cli.value) == message  # --backend's own line


def test_a_device_the_rank_cannot_open_is_one_line_naming_the_rank():
    with pytest.raises(BackendUnavailable) as raised:
        open_device("opencl:99", share_cores=False)  # out of range, or no OpenCL at all
    message = str(raised.value)
    assert message.startswith("rank 0 on ") and "opencl" in message and "\n" not in message


def test_a_device_torch_computes_on_offloads_nothing():
    dev = open_device("host", share_cores=False)
    model = torch.nn.Linear(3, 2)
    done = offload(model, dev)
    assert not dev.offloads and dev.ops is None and done.mode is None and done.modules == 0
    assert dev.device == torch.device("cpu") and dev.timing == "measured" and dev.figures() == {}
    with dev.step() as figures:
        model(torch.randn(4, 3))
    assert set(figures) == {"step_seconds"}


def test_offload_is_refused_twice_and_removed_cleanly():
    dev = device("sim:mi300x")
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    done = offload(model, dev)
    with pytest.raises(ValueError, match="offloaded already"):
        offload(model, dev)
    with pytest.raises(RuntimeError):
        model(torch.randn(4, 5))  # a forward that raises leaves no mode behind
    assert torch.overrides._get_current_function_mode_stack() == [] and not dev.mode.active
    model(torch.randn(4, 3))
    assert dev.mode.device_calls == {"linear": 2}
    model[0](torch.randn(4, 3))  # a submodule called alone offloads too
    assert dev.mode.device_calls == {"linear": 3}
    done.remove()
    model(torch.randn(4, 3))
    assert dev.mode.device_calls == {"linear": 3}
    offload(model, dev).remove()  # allowed again


def test_a_deep_copy_of_an_offloaded_model_shares_its_device():
    import copy

    dev = device("sim:mi300x")
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    offload(model, dev)
    twin = copy.deepcopy(model)  # an EMA copy, say: its products go to the same device, which is not copied
    twin(torch.randn(4, 3))
    assert dev.mode.device_calls == {"linear": 2}
