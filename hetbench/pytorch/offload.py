"""Torch matmuls on a hetbench device that torch itself cannot drive (an OpenCL device, a simulated GPU, a CuPy GPU
of a torch build without it): a custom autograd function whose forward and both backward products run on the
rank's hetbench backend through hetbench.harness.ops.Ops (operands uploaded, results downloaded; the GEMMs' device
time measured, or modelled on a simulated device, and the copies' time kept apart), while the rest of the model runs
in torch on the CPU.

    ops = Ops(backend)                     # the rank's open hetbench backend
    offload_linears(model, ops)            # the CLI's models: every nn.Linear's x @ W^T, and a `matmul` attribute
    y = device_matmul(a, b, ops)           # any (..., m, k) @ (..., k, n), attention's included
    offload(model, ops_or_device)          # any model (transformers' included): every product its forward asks
                                           # torch for, through OffloadMode (a TorchFunctionMode): F.linear,
                                           # torch.addmm (Conv1D), matmul and @, mm, bmm, baddbmm, and
                                           # F.scaled_dot_product_attention (device_attention: torch's math
                                           # reference, its two products on the device, softmax on the CPU)

What goes up, and when (Ops.stage; counted in ops.upload_bytes, ops.uploads, ops.cache_hits):
- A product's forward uploads its two operands once, and its backward reuses them: the backends' GEMM has no
  transposed operands, so the backward computes the transposed products grad_a^T = b @ g^T and grad_b^T = g^T @ a
  (for nn.Linear's y = x @ W^T: grad_x^T = W^T @ g^T and grad_W = g^T @ x) on the forward's device buffers, with g^T
  uploaded once for both; the results come back transposed on the host. A linear step uploads x, W^T and g^T once
  each (the forward and the two backward products used to upload six operands).
- A batched product (attention's (B, H, T, D) @ (B, H, D, T)) is one autograd node: each whole operand goes up
  once, the B x H GEMMs run one after another on the device, the result comes down once.
- A weight goes up once per step (between two Ops.reset(), which StepLogger calls at every step's start): an
  nn.Linear's (W^T), and under offload() any 2-D nn.Parameter a product reads as it is (Conv1D's W in addmm, a
  parameter in matmul or mm). The first product of the step that reads it stages it into the Ops' cache, and a later
  forward of the same step that reads it (gradient accumulation's micro-batches, a recomputation) finds it there. A
  weight is found again by its identity: the same tensor object (held weakly, so a dead tensor's address reused by
  another one is no hit) with the same storage data_ptr, storage offset, shape, stride, dtype and `_version` (an
  in-place change, an optimizer step's included, bumps it and misses). A write torch does not count (through
  `.data`, or copied in under torch.autograd._unsafe_preserve_version_counter, as FSDP2's all-gather does) is
  invisible to that test: call ops.reset() between steps (the trainer does) and the cache never outlives the step.
- `weight_key`: code that gives the same weight to a later product of the step as a FRESH tensor (sharded FSDP
  regathering a parameter) misses the identity test, and may name the weight instead: set `module.weight_key`
  on an offloaded nn.Linear (or pass device_linear(..., weight_key=...)), any hashable, the same for the same weight
  in a step and distinct between weights. A hit then needs only the key, shape and dtype; the promise that the
  values did not change within the step is the caller's (an in-place change of the same tensor still misses).
The device's memory, then, holds what a GPU running the model would: a product's operands from its forward to its
backward (released there, as torch releases saved tensors; a second backward under retain_graph uploads them again
from the saved tensors), and the step's weights until the next reset(). A sharded model's weights are therefore
all on the device at the step's peak, however the host frees its gathered copies.
"""

from __future__ import annotations

import inspect
import math
import threading
import types
import weakref
from collections import Counter
from typing import Any, Hashable, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode


def _host(t: torch.Tensor, transpose: bool = False) -> np.ndarray:
    """A float32 host copy of `t` (of t^T over the last two dimensions with `transpose`), contiguous. Always a
    copy: FSDP2 frees an unsharded parameter or gradient by resizing its storage, and a storage that NumPy has seen
    cannot be resized."""
    t = t.detach()
    if transpose:
        t = t.transpose(-2, -1)
    return t.to(torch.float32).clone(memory_format=torch.contiguous_format).numpy()


def _torch(out: np.ndarray, transpose: bool = False) -> torch.Tensor:
    """A device result (host float32) as a tensor of torch's own storage (transposed back over the last two
    dimensions with `transpose`)."""
    t = torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))
    return t.transpose(-2, -1).contiguous() if transpose else t.clone()


class _Weight:
    """A weight as DeviceMatmul's b operand, staged once per step: an nn.Linear's (n, k) weight W, the product
    reading W^T (`transposed`), or a weight read as it is (k, n): transformers' Conv1D's x @ W through torch.addmm,
    a parameter in torch.matmul."""

    __slots__ = ("tensor", "key", "transposed")

    def __init__(self, tensor: torch.Tensor, key: Hashable = None, transposed: bool = True) -> None:
        self.tensor = tensor
        self.key = key
        self.transposed = transposed


class _Facts(NamedTuple):
    """What must not have changed for a staged copy of a tensor to still hold its values (module docstring)."""

    data_ptr: int
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    version: int

    @classmethod
    def of(cls, t: torch.Tensor) -> _Facts:
        return cls(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype,
                   t._version)


def _stage_weight(ops: Any, weight: _Weight) -> Any:
    """The weight on the device (W^T where `transposed`): this step's staged copy where it still holds, else
    uploaded now and cached."""
    w, transposed = weight.tensor, weight.transposed
    facts = _Facts.of(w)
    kind = "weight^T" if transposed else "weight"
    if weight.key is not None:
        key: Hashable = (kind, "key", weight.key)

        def valid(meta: Any) -> bool:
            ref, was = meta
            if ref() is w:  # the same tensor: any change torch counted misses
                return bool(was == facts)
            return (was.shape, was.dtype) == (facts.shape, facts.dtype)  # a fresh tensor under the caller's key

        found = ops.staged(key, valid)
        if found is not None:
            return found
        return ops.stage(_host(w, transpose=transposed), key, (weakref.ref(w), facts))
    key = (kind, "tensor", id(w))
    found = ops.staged(key, lambda meta: meta[0]() is w and meta[1] == facts)
    if found is not None:
        return found
    cache: dict[str, Any] = {}

    def dead(_ref: Any) -> None:  # the tensor is gone: its entry (and the device buffer) with it
        ops.forget(key, cache.get("staged"))

    cache["staged"] = staged = ops.stage(_host(w, transpose=transposed), key, (weakref.ref(w, dead), facts))
    return staged


class DeviceMatmul(torch.autograd.Function):
    """out = a @ b for a (m, k) and b (k, n), or batched a (N, m, k) and b (N, k, n); with `weight` given, b is a
    weight staged once per step: nn.Linear's W, (n, k), out = a @ W^T (weight.transposed), or a (k, n) weight read
    as it is. All GEMMs on `ops`' device; the backward reuses the forward's staged operands and uploads only g^T
    (module docstring)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, ops: Any,  # type: ignore[override]
                weight: _Weight | None) -> torch.Tensor:
        ctx.save_for_backward(a, b)  # what torch's own product keeps (its checks and hooks run as for torch's)
        # not the weight itself: a sharded model's saved-tensor hooks free its gathered parameters until the backward
        ctx.ops, ctx.weight_key = ops, weight.key if weight is not None else None
        ctx.cached = weight is not None  # b went through the step's cache
        ctx.linear = weight is not None and weight.transposed  # b is W, (n, k), staged as W^T
        ctx.staged = _operands(ops, a, b, weight)
        return _torch(ops.gemm(*ctx.staged))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None, None]:  # type: ignore[override]
        a, b = ctx.saved_tensors  # torch's check that neither changed in place since the forward
        ops, need_a, need_b = ctx.ops, ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # the forward's device operands, released here as torch releases saved tensors (a second backward, under
        # retain_graph, stages them again from the saved tensors)
        staged, ctx.staged = ctx.staged, None
        if staged is None:
            staged = _operands(ops, a, b, _Weight(b, ctx.weight_key, ctx.linear) if ctx.cached else None)
        sa, sb = staged
        grad_a = grad_b = None
        if need_a or need_b:
            g_t = ops.stage(_host(grad, transpose=True))  # g^T, for both products
            if need_a:  # grad_a^T = b @ g^T (a linear's staged b is W^T)
                grad_a = _torch(ops.gemm(sb, g_t), transpose=True)
            if need_b:  # grad_b^T = g^T @ a; for a linear that is W's gradient itself
                grad_b = _torch(ops.gemm(g_t, sa), transpose=not ctx.linear)
        return grad_a, grad_b, None, None


def _operands(ops: Any, a: torch.Tensor, b: torch.Tensor, weight: _Weight | None) -> tuple[Any, Any]:
    """a and b (a linear's: W^T, from the step's cache where it holds) staged on the device."""
    return ops.stage(_host(a)), (_stage_weight(ops, weight) if weight is not None else ops.stage(_host(b)))


def device_matmul(a: torch.Tensor, b: torch.Tensor, ops: Any, weight: _Weight | None = None) -> torch.Tensor:
    """torch.matmul's (..., m, k) @ (..., k, n) (leading dimensions broadcast) on the device: one GEMM over all the
    rows where b is 2-D, else one batched product (each operand uploaded once, its 2-D GEMMs run on the device one
    after another). An empty product (a rank with no rows) is torch's own: nothing to compute. `weight`: a 2-D b
    that is a weight, staged once per step (module docstring)."""
    if a.numel() == 0 or b.numel() == 0:
        return torch.matmul(a, b)
    if a.dim() == 2 and b.dim() == 2:
        return DeviceMatmul.apply(a, b, ops, weight)
    if b.dim() == 2:  # (..., m, k) @ (k, n): one GEMM over all the rows
        lead = a.shape[:-1]
        return DeviceMatmul.apply(a.reshape(-1, a.shape[-1]), b, ops, weight).reshape(*lead, b.shape[-1])
    if a.dim() == 1 or b.dim() == 1:  # torch.matmul's vector cases
        return _vector_matmul(a, b, ops)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a3 = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b3 = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    return DeviceMatmul.apply(a3, b3, ops, None).reshape(*lead, a.shape[-2], b.shape[-1])


def _vector_matmul(a: torch.Tensor, b: torch.Tensor, ops: Any) -> torch.Tensor:
    """torch.matmul with a 1-D operand: the vector as a one-row (or one-column) matrix, then dropped."""
    if a.dim() == b.dim() == 1:
        return device_matmul(a.unsqueeze(0), b.unsqueeze(1), ops).reshape(())
    if a.dim() == 1:
        return device_matmul(a.unsqueeze(0), b, ops).squeeze(-2)
    return device_matmul(a, b.unsqueeze(-1), ops).squeeze(-1)


def device_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ops: Any,
                  weight_key: Hashable = None) -> torch.Tensor:
    """nn.Linear's x @ W^T + b with the product on the device, W^T uploaded once per step (`weight_key`: the
    module docstring)."""
    if x.numel() == 0 or weight.numel() == 0:
        y = torch.matmul(x, weight.t())
    else:
        rows = x.reshape(-1, x.shape[-1])
        y = DeviceMatmul.apply(rows, weight, ops, _Weight(weight, weight_key)).reshape(*x.shape[:-1],
                                                                                        weight.shape[0])
    return y + bias if bias is not None else y


def offload_linears(model: nn.Module, ops: Any) -> int:
    """Route every nn.Linear of `model` through the device (its forward replaced on the instance); returns how many.
    A module with a `matmul` attribute (the gpt's attention) gets device_matmul there. A linear's `weight_key`
    attribute, where a caller sets one, names its weight for the step's cache (module docstring)."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
                return device_linear(x, self.weight, self.bias, ops, getattr(self, "weight_key", None))

            module.offload_ops = ops  # a tensor-parallel row Linear's own forward reads it (pytorch/tensor.py)
            if not getattr(module, "row_parallel", False):
                module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]
            count += 1
        if hasattr(module, "matmul"):
            module.matmul = lambda a, b: device_matmul(a, b, ops)
    return count


def device_addmm(input: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, ops: Any, beta: Any = 1,
                 alpha: Any = 1) -> torch.Tensor:
    """torch.addmm's beta * input + alpha * (mat1 @ mat2) with the product on the device (transformers' Conv1D:
    x @ W + b). A parameter mat2 is a weight, staged once per step."""
    product = DeviceMatmul.apply(mat1, mat2, ops, _weight_of(mat2))
    return _scaled_sum(input, product, beta, alpha)


def _scaled_sum(input: torch.Tensor, product: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    """beta * input + alpha * product, as addmm and baddbmm read it (beta 0: input ignored, NaN in it too)."""
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return (input if beta == 1 else input * beta) + product


def _weight_of(t: torch.Tensor) -> _Weight | None:
    """A 2-D parameter read as it is (a weight): staged once per step; other operands go up with each product."""
    return _Weight(t, None, transposed=False) if isinstance(t, nn.Parameter) and t.dim() == 2 else None


def device_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, ops: Any,
                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """torch's scaled_dot_product_attention, computed as torch's own math reference computes it
    (aten::_scaled_dot_product_attention_math: its values, and with dropout its random mask, the same to fp32
    rounding), its two products on the device: q and k each scaled by sqrt(scale) (a negative scale on q), the
    scores q @ k^T, a causal (upper-left) or boolean mask as -inf where a position takes no part, a float mask
    added, softmax in which a row with no position left gives zeros (torch's _safe_softmax), dropout (torch's
    own, drawn from torch's generator), then @ v. Under enable_gqa the query heads that share a key/value head go
    as one product over their rows (what torch's repeat of k and v computes). The caller checks the arguments
    (_attention_fits); their gradients are autograd's through these steps."""
    length, source, width = query.size(-2), key.size(-2), query.size(-1)
    negative = scale is not None and scale < 0
    factor = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(width))
    q = query * (-factor if negative else factor)
    mask = attn_mask
    if is_causal:
        mask = torch.ones(length, source, dtype=torch.bool).tril()
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype).masked_fill_(mask.logical_not(), float("-inf"))
    heads = query.size(-3) if query.dim() >= 3 else 1
    groups = 1
    if enable_gqa and heads != key.size(-3):
        if key.size(-3) == value.size(-3):  # one product per key/value head, over its queries' rows
            groups = heads // key.size(-3)
        else:
            key = key.repeat_interleave(heads // key.size(-3), -3)
            value = value.repeat_interleave(heads // value.size(-3), -3)
    lead = query.shape[:-3]
    if groups > 1:
        q = q.reshape(*lead, heads // groups, groups * length, width)
    scores = device_matmul(q, key.transpose(-2, -1) * factor, ops)
    if groups > 1:
        scores = scores.view(*lead, heads, length, source)
    if mask is not None:
        scores = scores + mask
    attn = torch._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        attn = torch.dropout(attn, dropout_p, True)
    if groups > 1:
        attn = attn.reshape(*lead, heads // groups, groups * length, source)
    out = device_matmul(attn, value, ops)
    return out.view(*lead, heads, length, value.size(-1)) if groups > 1 else out


# ---- the offload of every product a module's forward asks torch for: a TorchFunctionMode ----

_TORCH = object()  # a handler's answer: this call is torch's own (an operand the device does not take)
_PLAIN = (torch.Tensor, nn.Parameter)


def _plain(*tensors: Any) -> bool:
    """Operands the device takes: plain tensors or parameters (not a DTensor or another subclass), strided,
    float32, on the CPU, not empty."""
    return all(type(t) in _PLAIN and t.dtype == torch.float32 and t.layout == torch.strided
               and t.device.type == "cpu" and t.numel() > 0 for t in tensors)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fits(shape: tuple[int, ...], into: tuple[int, ...]) -> bool:
    """`shape` broadcasts to `into` (and no further)."""
    try:
        return tuple(torch.broadcast_shapes(shape, into)) == tuple(into)
    except RuntimeError:
        return False


def _linear(ops: Any, input: Any, weight: Any, bias: Any = None) -> Any:
    if not (_plain(input, weight) and weight.dim() == 2 and input.dim() >= 1 and input.shape[-1] == weight.shape[1]):
        return _TORCH
    if bias is not None and not (_plain(bias) and _fits(bias.shape, (*input.shape[:-1], weight.shape[0]))):
        return _TORCH
    return device_linear(input, weight, bias, ops)


def _addmm(ops: Any, input: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1, out: Any = None) -> Any:
    if out is not None or not (_plain(input, mat1, mat2) and _number(beta) and _number(alpha)):
        return _TORCH
    if not (mat1.dim() == mat2.dim() == 2 and mat1.shape[1] == mat2.shape[0]
            and _fits(input.shape, (mat1.shape[0], mat2.shape[1]))):
        return _TORCH
    if beta == 0 and input.requires_grad:  # torch gives input a zero gradient; the sum above none
        return _TORCH
    return device_addmm(input, mat1, mat2, ops, beta, alpha)


def _baddbmm(ops: Any, input: Any, batch1: Any, batch2: Any, *, beta: Any = 1, alpha: Any = 1,
             out: Any = None) -> Any:
    if out is not None or not (_plain(input, batch1, batch2) and _number(beta) and _number(alpha)):
        return _TORCH
    if not (batch1.dim() == batch2.dim() == 3 and batch1.shape[0] == batch2.shape[0]
            and batch1.shape[2] == batch2.shape[1]
            and _fits(input.shape, (batch1.shape[0], batch1.shape[1], batch2.shape[2]))):
        return _TORCH
    if beta == 0 and input.requires_grad:
        return _TORCH
    return _scaled_sum(input, DeviceMatmul.apply(batch1, batch2, ops, None), beta, alpha)


def _mm(ops: Any, input: Any, mat2: Any, *, out: Any = None) -> Any:
    if out is not None or not (_plain(input, mat2) and input.dim() == mat2.dim() == 2
                               and input.shape[1] == mat2.shape[0]):
        return _TORCH
    return DeviceMatmul.apply(input, mat2, ops, _weight_of(mat2))


def _bmm(ops: Any, input: Any, mat2: Any, *, out: Any = None) -> Any:
    if out is not None or not (_plain(input, mat2) and input.dim() == mat2.dim() == 3
                               and input.shape[0] == mat2.shape[0] and input.shape[2] == mat2.shape[1]):
        return _TORCH
    return DeviceMatmul.apply(input, mat2, ops, None)


def _matmul(ops: Any, input: Any, other: Any, *, out: Any = None) -> Any:
    if out is not None or not _plain(input, other) or input.shape[-1] != other.shape[-2 if other.dim() > 1 else 0]:
        return _TORCH
    if input.dim() > 2 or other.dim() > 2:
        try:
            torch.broadcast_shapes(input.shape[:-2], other.shape[:-2])
        except RuntimeError:
            return _TORCH
    return device_matmul(input, other, ops, _weight_of(other))


def _rmatmul(ops: Any, self: Any, other: Any) -> Any:
    return _matmul(ops, other, self)


def _attention_fits(query: Any, key: Any, value: Any, attn_mask: Any, dropout_p: Any, is_causal: Any,
                    scale: Any, enable_gqa: Any) -> bool:
    """The arguments device_attention computes as torch does; anything else (other dtypes, shapes torch refuses,
    a mask torch would not add in place) is left to torch, which computes it or says what is wrong."""
    if not (_plain(query, key, value) and query.dim() == key.dim() == value.dim() >= 2):
        return False
    if not (isinstance(is_causal, bool) and isinstance(enable_gqa, bool) and _number(dropout_p)
            and 0.0 <= dropout_p < 1.0 and (scale is None or _number(scale))):
        return False
    if query.size(-1) != key.size(-1) or key.size(-2) != value.size(-2):
        return False
    if attn_mask is not None and (is_causal or not (type(attn_mask) in _PLAIN and attn_mask.device.type == "cpu"
                                                    and attn_mask.dtype in (torch.bool, query.dtype))):
        return False
    if enable_gqa and query.dim() >= 3 and query.size(-3) != key.size(-3):
        if query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]:
            return False
        if query.size(-3) % key.size(-3) or query.size(-3) % value.size(-3):
            return False
        lead: tuple[int, ...] = tuple(query.shape[:-2])
    else:
        try:
            lead = tuple(torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]))
            torch.broadcast_shapes(lead, value.shape[:-2])
        except RuntimeError:
            return False
    return attn_mask is None or _fits(attn_mask.shape, (*lead, query.size(-2), key.size(-2)))


def _sdpa(ops: Any, query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: Any = 0.0,
          is_causal: Any = False, *, scale: Any = None, enable_gqa: Any = False) -> Any:
    if not _attention_fits(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return _TORCH
    return device_attention(query, key, value, ops, attn_mask, float(dropout_p), is_causal, scale, enable_gqa)


# torch's callables (as __torch_function__ sees them) -> (the name the figures count them by, the handler)
_HANDLERS: dict[Any, tuple[str, Any]] = {
    torch.nn.functional.linear: ("linear", _linear),
    torch.addmm: ("addmm", _addmm),
    torch.Tensor.addmm: ("addmm", _addmm),
    torch.baddbmm: ("baddbmm", _baddbmm),
    torch.Tensor.baddbmm: ("baddbmm", _baddbmm),
    torch.mm: ("mm", _mm),
    torch.Tensor.mm: ("mm", _mm),
    torch.bmm: ("bmm", _bmm),
    torch.Tensor.bmm: ("bmm", _bmm),
    torch.matmul: ("matmul", _matmul),
    torch.Tensor.matmul: ("matmul", _matmul),
    torch.Tensor.__matmul__: ("matmul", _matmul),
    torch.Tensor.__rmatmul__: ("matmul", _rmatmul),
    torch.nn.functional.scaled_dot_product_attention: ("scaled_dot_product_attention", _sdpa),
}
_SIGNATURES = {handler: inspect.signature(handler) for _, handler in _HANDLERS.values()}


class OffloadMode(TorchFunctionMode):
    """While it is active (`with mode:`, or an offloaded module's forward: offload), the products torch is asked
    for run on `ops`' device: F.linear (nn.Linear), torch.addmm (transformers' Conv1D), torch.matmul and the @
    operator, mm, bmm, baddbmm, and F.scaled_dot_product_attention (device_attention); their backward too, since
    each is a DeviceMatmul node. A call with an operand the device does not take (not float32, not on the CPU, a
    DTensor, empty, `out=`) is torch's own. `device_calls` and `torch_calls` count the calls by kind since the
    last reset()."""

    def __init__(self, ops: Any) -> None:
        super().__init__()
        self.ops = ops
        self.device_calls: Counter[str] = Counter()
        self.torch_calls: Counter[str] = Counter()
        self._local = threading.local()

    def reset(self) -> None:
        self.device_calls.clear()
        self.torch_calls.clear()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        entry = _HANDLERS.get(func)
        if entry is None:
            return func(*args, **kwargs)
        name, handler = entry
        try:
            bound = _SIGNATURES[handler].bind(self.ops, *args, **kwargs)
        except TypeError:  # arguments torch's own signature refuses: torch says so
            out = _TORCH
        else:
            out = handler(*bound.args, **bound.kwargs)
        if out is _TORCH:
            self.torch_calls[name] += 1
            return func(*args, **kwargs)
        self.device_calls[name] += 1
        return out

    # which thread has it active (the module hooks enter it once, at the outermost offloaded module)

    def _entered(self) -> list[bool]:
        """This thread's offloaded module calls in progress: whether each entered the mode."""
        stack = getattr(self._local, "entered", None)
        if stack is None:
            stack = self._local.entered = []
        return stack

    @property
    def active(self) -> bool:
        return getattr(self._local, "active", 0) > 0

    def __enter__(self) -> OffloadMode:
        super().__enter__()
        self._local.active = getattr(self._local, "active", 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._local.active -= 1
        super().__exit__(*exc)

    def _pre_hook(self, module: nn.Module, args: Any) -> None:
        entered = not self.active
        if entered:
            self.__enter__()
        self._entered().append(entered)

    def _post_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._entered().pop():
            self.__exit__(None, None, None)


class Offloaded:
    """What offload() did to a model: `mode` (None where nothing was offloaded), `modules` (how many carry its
    hooks); remove() undoes it."""

    def __init__(self, model: nn.Module, mode: OffloadMode | None, handles: list[Any]) -> None:
        self.model, self.mode, self._handles = model, mode, handles

    @property
    def modules(self) -> int:
        return len(self._handles) // 2

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if _MARK in vars(self.model):
            delattr(self.model, _MARK)

    def __repr__(self) -> str:
        return f"Offloaded({type(self.model).__name__}, {self.modules} modules)"


_MARK = "_hetbench_offloaded"


def offload(model: nn.Module, device: Any) -> Offloaded:
    """Every product `model`'s forward asks torch for (OffloadMode: nn.Linear's, transformers' Conv1D's, the
    attention's, scaled_dot_product_attention's included), and its backward, on `device` (an open hetbench device
    from rank_backend.open_device, or an Ops); the rest stays torch's on the CPU. Each module of the model gets a
    forward pre-hook and an always-called forward hook: the outermost module called enters the mode and leaves it
    as its forward ends (so a submodule called alone, or recomputed under activation checkpointing, offloads
    too). A device torch computes on itself (the host, a GPU this torch build drives): nothing done, mode None."""
    mode = device if isinstance(device, OffloadMode) else getattr(device, "mode", None)
    if mode is None and hasattr(device, "gemm"):  # an Ops
        mode = OffloadMode(device)
    if mode is None:
        return Offloaded(model, None, [])
    done = getattr(model, _MARK, None)
    if done is not None:
        raise ValueError(f"{type(model).__name__} is offloaded already ({done}); call .remove() on what offload "
                         "returned first")
    # plain functions, not the mode's bound methods: a deep copy of the model (an EMA copy, a pipeline stage) then
    # shares the mode and its device rather than copying them
    def pre(module: nn.Module, args: Any) -> None:
        mode._pre_hook(module, args)

    def post(module: nn.Module, args: Any, output: Any) -> None:
        mode._post_hook(module, args, output)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    offloaded = Offloaded(model, mode, handles)
    setattr(model, _MARK, f"its products on {getattr(device, 'spec', None) or 'a hetbench device'}")
    return offloaded


def step_seconds(ops: Any, wall_seconds: float) -> float:
    """A span's seconds on a rank whose products ran through `ops`: the wall time, except that on a simulated device
    the modelled GEMM and copy time replaces the host's wall time emulating them (as the numpy trainer's steps)."""
    if ops is None or not ops.modelled:
        return wall_seconds
    return wall_seconds - ops.wall_seconds + ops.compute_seconds + ops.copy_seconds
