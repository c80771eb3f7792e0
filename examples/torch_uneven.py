"""Train a torch model across unequal ranks over hetbench's backend, each rank's share of the batch by its weight.

    mpiexec -n 2 python examples/torch_uneven.py --strategy fsdp2 --weights 3,1 --log train.jsonl

Any launcher works (MPICH's mpiexec, Open MPI's mpirun, srun): rank and world size come from MPI. On one node or
many; with mixed CUDA and ROCm builds, start one interpreter per node in MPMD form (docs/pytorch.md).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn

import hetbench.pytorch as hb


def make_model(hidden: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(*[nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(layers)],
                         nn.Linear(hidden, 1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=["ddp", "fsdp2"], default="ddp")
    p.add_argument("--weights", default="even", help="even, auto, a calibrate profile, or w0,w1,...")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--path", choices=["host", "device"], default="host")
    p.add_argument("--log", default=None, help="one JSON line per step (rank 0)")
    args = p.parse_args()

    hb.init(path=args.path)  # dist.init_process_group("hetbench"): rank and world size from MPI
    rank = dist.get_rank()
    device = hb.rank_device().device  # this rank's GPU (CUDA or ROCm build) or the CPU
    rows = hb.batch_rows(args.batch, args.weights, device=device)  # e.g. [48, 16] for 3,1
    start, stop = hb.row_range(rows)

    model = make_model(args.hidden, args.layers).to(device)
    if args.strategy == "ddp":
        model = hb.exact_ddp(model)  # gradients summed, not averaged
    else:
        hb.exact_fully_shard(model, units=list(model)[:-1])  # FSDP2, every unit summing its gradients
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    log = hb.StepLogger(args.log, args.batch, model=model, optimizer=opt)

    teacher = torch.randn(args.hidden, 1, generator=torch.Generator().manual_seed(1234)) / args.hidden**0.5
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step)  # every rank makes the same global batch, takes its rows
        x = torch.randn(args.batch, args.hidden, generator=g)
        y = x @ teacher  # a linear teacher: the loss can fall to zero
        x, y = x[start:stop].to(device), y[start:stop].to(device)
        with log.step(samples=stop - start) as rec:
            loss = hb.part_of_mean((model(x) - y).square().squeeze(1), args.batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            rec.loss = loss
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            line = log.lines[-1]
            print(f"step {step:3d}  loss {line['loss']:.6f}  {line['samples_per_second']:.0f} samples/s  "
                  f"rows {rows}")
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
