"""Torch matmuls on a hetbench device that torch itself cannot drive (an OpenCL device, a simulated GPU): a custom
autograd function whose forward and both backward products run on the rank's hetbench backend through
hetbench.train.ops.Ops (operands uploaded, result downloaded; the GEMMs' device time measured, or modelled on a
simulated device, and the copies' time kept apart), while the rest of the model runs in torch on the CPU.

    ops = Ops(backend)                     # the rank's open hetbench backend
    offload_linears(model, ops)            # every nn.Linear's x @ W^T on the device
    y = device_matmul(a, b, ops)           # any (..., m, k) @ (..., k, n), attention's included

`hetbench train --frontend torch` routes the products of every rank whose device torch cannot drive here; every
operand is still uploaded at every product (a weight unchanged within a step should go up once: not built yet).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import torch
from torch import nn


def _gemm(ops: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (m, k) @ b (k, n) on the device, float32 in and out (CPU tensors). Operands and result are copies: FSDP2
    frees an unsharded parameter or gradient by resizing its storage, and a storage that NumPy has seen cannot be
    resized."""
    out = ops.matmul(_host(a), _host(b))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).clone()


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32, copy=True).contiguous().numpy()


class DeviceMatmul(torch.autograd.Function):
    """out = a @ b for 2-D a (m, k) and b (k, n); backward: grad_a = g @ b^T, grad_b = a^T @ g, all three GEMMs on
    `ops`' device."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, ops: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(a, b)
        ctx.ops = ops
        return _gemm(ops, a, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, Any, None]:  # type: ignore[override]
        a, b = ctx.saved_tensors
        grad_a = _gemm(ctx.ops, grad, b.t()) if ctx.needs_input_grad[0] else None
        grad_b = _gemm(ctx.ops, a.t(), grad) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b, None


def device_matmul(a: torch.Tensor, b: torch.Tensor, ops: Any) -> torch.Tensor:
    """torch.matmul's (..., m, k) @ (..., k, n) (leading dimensions broadcast) with each 2-D product on the device.
    An empty product (a rank with no rows) is torch's own: nothing to compute."""
    if a.numel() == 0 or b.numel() == 0:
        return torch.matmul(a, b)
    if a.dim() == 2 and b.dim() == 2:
        return DeviceMatmul.apply(a, b, ops)
    if b.dim() == 2:  # (..., m, k) @ (k, n): one GEMM over all the rows
        lead = a.shape[:-1]
        return DeviceMatmul.apply(a.reshape(-1, a.shape[-1]), b, ops).reshape(*lead, b.shape[-1])
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*lead, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b = b.expand(*lead, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
    outs = [DeviceMatmul.apply(a[i], b[i], ops) for i in range(a.shape[0])]
    return torch.stack(outs).reshape(*lead, a.shape[-2], b.shape[-1])


def device_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ops: Any) -> torch.Tensor:
    """nn.Linear's x @ W^T + b with the product on the device."""
    y = device_matmul(x, weight.t(), ops)
    return y + bias if bias is not None else y


def offload_linears(model: nn.Module, ops: Any) -> int:
    """Route every nn.Linear of `model` through the device (its forward replaced on the instance); returns how many.
    A module with a `matmul` attribute (the gpt's attention) gets device_matmul there."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
                return device_linear(x, self.weight, self.bias, ops)

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
