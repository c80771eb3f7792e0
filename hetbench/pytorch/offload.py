"""Torch matmuls on a hetbench device that torch itself cannot drive (an OpenCL device, a simulated GPU, a CuPy GPU
of a torch build without it): a custom autograd function whose forward and both backward products run on the
rank's hetbench backend through hetbench.train.ops.Ops (operands uploaded, results downloaded; the GEMMs' device
time measured, or modelled on a simulated device, and the copies' time kept apart), while the rest of the model runs
in torch on the CPU.

    ops = Ops(backend)                     # the rank's open hetbench backend
    offload_linears(model, ops)            # every nn.Linear's x @ W^T on the device
    y = device_matmul(a, b, ops)           # any (..., m, k) @ (..., k, n), attention's included

What goes up, and when (Ops.stage; counted in ops.upload_bytes, ops.uploads, ops.cache_hits):
- A product's forward uploads its two operands once, and its backward reuses them: the backends' GEMM has no
  transposed operands, so the backward computes the transposed products grad_a^T = b @ g^T and grad_b^T = g^T @ a
  (for nn.Linear's y = x @ W^T: grad_x^T = W^T @ g^T and grad_W = g^T @ x) on the forward's device buffers, with g^T
  uploaded once for both; the results come back transposed on the host. A linear step uploads x, W^T and g^T once
  each (the forward and the two backward products used to upload six operands).
- A batched product (attention's (B, H, T, D) @ (B, H, D, T)) is one autograd node: each whole operand goes up
  once, the B x H GEMMs run one after another on the device, the result comes down once.
- An nn.Linear's weight goes up once per step (between two Ops.reset(), which StepLogger calls at every step's
  start): the first product of the step that reads it stages W^T into the Ops' cache, and a later forward of the
  same step that reads it (gradient accumulation's micro-batches, a recomputation) finds it there. A weight is
  found again by its identity: the same tensor object (held weakly, so a dead tensor's address reused by another
  one is no hit) with the same storage data_ptr, storage offset, shape, stride, dtype and `_version` (an in-place
  change, an optimizer step's included, bumps it and misses). A write torch does not count (through `.data`, or
  copied in under torch.autograd._unsafe_preserve_version_counter, as FSDP2's all-gather does) is invisible to that
  test: call ops.reset() between steps (the trainer does) and the cache never outlives the step.
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

import types
import weakref
from typing import Any, Hashable, NamedTuple

import numpy as np
import torch
from torch import nn


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
    """An nn.Linear's weight as DeviceMatmul's b operand: the product reads weight^T, staged once per step."""

    __slots__ = ("tensor", "key")

    def __init__(self, tensor: torch.Tensor, key: Hashable = None) -> None:
        self.tensor = tensor
        self.key = key


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
    """weight^T on the device: this step's staged copy where it still holds, else uploaded now and cached."""
    w = weight.tensor
    facts = _Facts.of(w)
    if weight.key is not None:
        key: Hashable = ("weight^T", "key", weight.key)

        def valid(meta: Any) -> bool:
            ref, was = meta
            if ref() is w:  # the same tensor: any change torch counted misses
                return bool(was == facts)
            return (was.shape, was.dtype) == (facts.shape, facts.dtype)  # a fresh tensor under the caller's key

        found = ops.staged(key, valid)
        if found is not None:
            return found
        return ops.stage(_host(w, transpose=True), key, (weakref.ref(w), facts))
    key = ("weight^T", "tensor", id(w))
    found = ops.staged(key, lambda meta: meta[0]() is w and meta[1] == facts)
    if found is not None:
        return found
    cache: dict[str, Any] = {}

    def dead(_ref: Any) -> None:  # the tensor is gone: its entry (and the device buffer) with it
        ops.forget(key, cache.get("staged"))

    cache["staged"] = staged = ops.stage(_host(w, transpose=True), key, (weakref.ref(w, dead), facts))
    return staged


class DeviceMatmul(torch.autograd.Function):
    """out = a @ b for a (m, k) and b (k, n), or batched a (N, m, k) and b (N, k, n); or, with `weight` given (b
    then nn.Linear's weight W, (n, k)), out = a @ W^T. All GEMMs on `ops`' device; the backward reuses the forward's
    staged operands and uploads only g^T (module docstring)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, ops: Any,  # type: ignore[override]
                weight: _Weight | None) -> torch.Tensor:
        ctx.save_for_backward(a, b)  # what torch's own product keeps (its checks and hooks run as for torch's)
        # not the weight itself: a sharded model's saved-tensor hooks free its gathered parameters until the backward
        ctx.ops, ctx.linear, ctx.weight_key = ops, weight is not None, weight.key if weight is not None else None
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
            staged = _operands(ops, a, b, _Weight(b, ctx.weight_key) if ctx.linear else None)
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


def device_matmul(a: torch.Tensor, b: torch.Tensor, ops: Any) -> torch.Tensor:
    """torch.matmul's (..., m, k) @ (..., k, n) (leading dimensions broadcast) on the device: one GEMM over all the
    rows where b is 2-D, else one batched product (each operand uploaded once, its 2-D GEMMs run on the device one
    after another). An empty product (a rank with no rows) is torch's own: nothing to compute."""
    if a.numel() == 0 or b.numel() == 0:
        return torch.matmul(a, b)
    if a.dim() == 2 and b.dim() == 2:
        return DeviceMatmul.apply(a, b, ops, None)
    if b.dim() == 2:  # (..., m, k) @ (k, n): one GEMM over all the rows
        lead = a.shape[:-1]
        return DeviceMatmul.apply(a.reshape(-1, a.shape[-1]), b, ops, None).reshape(*lead, b.shape[-1])
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


def step_seconds(ops: Any, wall_seconds: float) -> float:
    """A span's seconds on a rank whose products ran through `ops`: the wall time, except that on a simulated device
    the modelled GEMM and copy time replaces the host's wall time emulating them (as the numpy trainer's steps)."""
    if ops is None or not ops.modelled:
        return wall_seconds
    return wall_seconds - ops.wall_seconds + ops.compute_seconds + ops.copy_seconds
