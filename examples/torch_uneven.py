"""Train a torch model across unequal ranks over hetbench's backend, each rank's share of the batch by its weight.

    mpiexec -n 2 python examples/torch_uneven.py --strategy fsdp2 --weights 3,1 --log train.jsonl
    mpiexec -n 2 python examples/torch_uneven.py --strategy fsdp --weights 3,1   # shards sized by the weights too

--strategy fsdp is hetbench's own uneven FSDP (hb.shard_module): each unit's parameters, gradients and optimizer
state are sharded in proportion to the weights, where torch's FSDP2 (fsdp2) shards them evenly.

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
    p.add_argument("--strategy", choices=["ddp", "fsdp2", "fsdp"], default="ddp")
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
    sharded = None
    if args.strategy == "ddp":
        model = hb.exact_ddp(model)  # gradients summed, not averaged
    elif args.strategy == "fsdp2":
        hb.exact_fully_shard(model, units=list(model)[:-1])  # FSDP2, every unit summing its gradients
    else:  # hetbench's uneven FSDP: every unit's flat parameters split by the weights (the root holds the head)
        sharded = hb.shard_module(model, units=list(model)[:-1], weights=args.weights)
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
            opt.zero_grad(set_to_none=False)  # the gradients' memory stays held, as in a training loop's peak
            rec.loss = loss
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            line = log.lines[-1]
            print(f"step {step:3d}  loss {line['loss']:.6f}  {line['samples_per_second']:.0f} samples/s  "
                  f"rows {rows}")
    log.close()
    if sharded is not None:  # what each rank holds between steps: its shards, their gradients, AdamW's m and v
        held = sharded.state_bytes(opt)
        total = sum(u.size for u in sharded.units)
        for r, (elements, b) in enumerate(zip(hb.all_ranks(sharded.elements), hb.all_ranks(held))):
            if rank == 0:
                print(f"rank {r}: {elements} of {total} parameters ({100 * elements / total:.1f} %), "
                      f"{b['param_bytes']} + {b['grad_bytes']} + {b['optimizer_bytes']} bytes of parameters, "
                      "gradients and optimizer state")
        full = sharded.full_state_dict()  # collective: every parameter whole at rank 0, by its name
        if rank == 0:
            print(f"full state at rank 0: {len(full)} tensors, {sum(t.numel() for t in full.values())} parameters")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
