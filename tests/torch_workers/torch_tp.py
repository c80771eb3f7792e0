"""Under `mpiexec -n N python -m mpi4py` (tests/mpi/test_torch_even_tp.py): torch's own even tensor parallelism
(hetbench.train.torch_frontend.torch_tp) on a small task model trains the same steps as one process, every rank feeding the
same rows; rank 0 writes OUT.json with every rank's figures: the largest relative error of the loss over the steps,
of the first step's gradients and of the final parameters (each tensor's error norm over its norm, the whole tensors
from TorchTP.full_state_dict / full_grads), what was offloaded and the device's GEMM count, the summary. A refusal
(TorchTPError) is caught and written as every rank's message instead.

    python -m mpi4py tests/torch_workers/torch_tp.py TASK OUT.json [--heads N] [--hidden N] [--offload R,...]
        [--offload-after] [--optimizer sgd|adamw]

--offload: those ranks' Linears and attention products on a simulated device (hetbench.pytorch.offload with Ops
over the sim backend), before the cut (--offload-after: after it). `-m mpi4py` aborts every rank when one raises.
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch
import torch.distributed as dist

import hetbench.pytorch as hb
from hetbench.pytorch.offload import offload_linears
from hetbench.train.torch_frontend.torch_tp import TorchTPError, torch_tensor_parallel
from hetbench.train.torch_frontend.models import TaskConfig, build_model, make_batch, row_losses

warnings.filterwarnings("ignore")

STEPS = 3
# SGD by default: its parameters follow the gradients linearly. AdamW turns a gradient that is zero in exact
# arithmetic (the gpt's key bias: softmax ignores it) and rounding noise in fp32 into steps of +-lr, different noise
# in each run, so its parameters differ where the gradients agree (--optimizer adamw shows it)
LR = {"sgd": 0.05, "adamw": 3e-3}


def optimizer(name: str, params) -> torch.optim.Optimizer:
    params = list(params)
    return torch.optim.SGD(params, lr=LR[name]) if name == "sgd" else torch.optim.AdamW(params, lr=LR[name])


def sim_ops():
    from hetbench.backends.base import BackendSpec, open_backend
    from hetbench.harness.ops import Ops

    return Ops(open_backend(BackendSpec("sim", model="mi300x"), 0, 1), "fp32")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train(cfg: TaskConfig, opt_name: str, model, whole_grads, ops=None) -> tuple[list[float], dict, int]:
    """STEPS steps on the whole batch: the losses, the first step's gradients whole (`whole_grads()`), and the GEMMs
    `ops`' device ran (its per-step cache emptied at each step's start, as StepLogger does)."""
    opt = optimizer(opt_name, model.parameters())
    losses, grads, gemms = [], {}, 0
    for step in range(STEPS):
        if ops is not None:
            gemms += ops.gemms
            ops.reset()
        x, y = make_batch(cfg, step, 0, cfg.batch)
        loss = row_losses(model, x, y).sum() / cfg.batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            grads = whole_grads()
        opt.step()
        losses.append(float(loss))
    return losses, grads, gemms + (ops.gemms if ops is not None else 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", choices=("mlp", "gpt"))
    parser.add_argument("out")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--offload", default="")
    parser.add_argument("--offload-after", action="store_true")
    parser.add_argument("--optimizer", choices=tuple(LR), default="sgd")
    args = parser.parse_args()
    hb.init()
    rank, size = dist.get_rank(), dist.get_world_size()
    cfg = TaskConfig(args.task, layers=2, hidden=args.hidden, batch=8, seq_len=16, heads=args.heads)

    model = build_model(cfg)
    offload = rank in {int(r) for r in args.offload.split(",") if r}
    ops = sim_ops() if offload else None
    if offload and not args.offload_after:
        offload_linears(model, ops)
    try:
        tp = torch_tensor_parallel(model)
    except TorchTPError as e:
        said = hb.all_ranks(str(e))
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"refused": said}, f)
        dist.destroy_process_group()
        return
    if offload and args.offload_after:
        offload_linears(model, ops)

    ref_model = build_model(cfg)
    ref_losses, ref_grads, _ = train(cfg, args.optimizer, ref_model,
                                     lambda: {n: p.grad.detach().clone() for n, p in ref_model.named_parameters()})
    ref_state = {n: p.detach().clone() for n, p in ref_model.named_parameters()}
    losses, grads, gemms = train(cfg, args.optimizer, model, tp.full_grads, ops)
    state = tp.full_state_dict()

    mine = {
        "rank": rank,
        "loss_rel": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
        "grad_rel": max(rel(grads[n], g) for n, g in ref_grads.items()),
        "param_rel": max(rel(state[n], p) for n, p in ref_state.items()),
        "same_names_and_shapes": {n: t.shape for n, t in state.items()} == {n: t.shape for n, t in ref_state.items()},
        "param_rel_by_name": {n: rel(state[n], p) for n, p in ref_state.items()},
        "losses": losses,
        "ref_losses": ref_losses,
        "local_param_bytes": tp.local_param_bytes(),
        "whole_param_bytes": sum(p.numel() * p.element_size() for p in ref_state.values()),
        "offloaded": tp.offloaded(),
        "gemms": gemms,
        "summary": tp.summary(),
    }
    every = hb.all_ranks(mine)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": size, "task": args.task, "per_rank": every}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
