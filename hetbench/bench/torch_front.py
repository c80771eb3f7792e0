"""The torch front end's part of `make bench`, under `mpiexec -n 2` (registered in torch_part.py):

    mpiexec -n 2 python -m hetbench.bench torch

1. a 16 MiB fp32 all_reduce through the hetbench backend (torch.distributed.all_reduce on a CPU tensor) against a
   bare mpi4py Allreduce loop on the same buffer: algbw ratio, goal >= 0.90;
2. DDP and FSDP2 (fully_shard) training steps of the same model on the same ranks over the hetbench backend and over
   Gloo (torch's own CPU backend): median step seconds, goal: hetbench's <= Gloo's.

Each pair is measured in alternating rounds (a drift of the machine's speed hits both alike); each round's figure is
a median, the ratio is of the medians over the rounds. The backend runs as a user's script gets it (no barrier
before each collective: that is `hetbench train`'s metrics mode). Exit 1 when a goal is missed.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import hetbench.pytorch as hb

ROUNDS = 5
ALLREDUCE_ROUNDS = 15
MIB = 1024**2
ALLREDUCE_MIB = 16
ALLREDUCE_GOAL = 0.90
MODEL_LAYERS, MODEL_HIDDEN, MODEL_BATCH = 4, 1024, 256
STEPS, WARMUP_STEPS = 8, 2


def _median_seconds(run: Callable[[], None], iters: int, warmup: int, comm: Any) -> float:
    """Back-to-back calls, total time / iterations, the slowest rank's (after a barrier)."""
    from mpi4py import MPI

    for _ in range(warmup):
        run()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    seconds = (time.perf_counter() - start) / iters
    return comm.allreduce(seconds, op=MPI.MAX)


def bench_allreduce(comm: Any, mib: int = ALLREDUCE_MIB, iters: int = 20, warmup: int = 3) -> dict[str, float]:
    from mpi4py import MPI

    t = torch.ones(mib * MIB // 4)
    buf = t.numpy()
    ours, bare = [], []
    runs = {"ours": (ours, lambda: dist.all_reduce(t)),
            "bare": (bare, lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM))}
    # each call is a few ms, so many rounds cost a second or two and their median holds still (docs/pytorch.md); the
    # order flips each round, so that neither side always runs first
    for i in range(ALLREDUCE_ROUNDS):
        for name in (("ours", "bare") if i % 2 == 0 else ("bare", "ours")):
            times, call = runs[name]
            times.append(_median_seconds(call, iters, warmup, comm))
    size = mib * MIB
    hb_gbps, bare_gbps = size / statistics.median(ours) / 1e9, size / statistics.median(bare) / 1e9
    return {"size_mib": mib, "hetbench_algbw_gbps": hb_gbps, "mpi4py_algbw_gbps": bare_gbps,
            "ratio": hb_gbps / bare_gbps}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(MODEL_HIDDEN, MODEL_HIDDEN), nn.ReLU())
                           for _ in range(MODEL_LAYERS)])


def _step_seconds(strategy: str, group: Any, comm: Any) -> float:
    """Median step seconds (the slowest rank's each step) of STEPS steps after WARMUP_STEPS, on `group`."""
    from mpi4py import MPI

    model = _model()
    if strategy == "ddp":
        model = hb.exact_ddp(model, process_group=group)
    else:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(group, "cpu")
        hb.exact_fully_shard(model, units=list(model), mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rows = MODEL_BATCH // comm.Get_size()
    x = torch.randn(rows, MODEL_HIDDEN, generator=torch.Generator().manual_seed(comm.Get_rank()))
    times = []
    for step in range(WARMUP_STEPS + STEPS):
        comm.Barrier()
        start = time.perf_counter()
        loss = model(x).square().sum() / MODEL_BATCH
        loss.backward()
        opt.step()
        opt.zero_grad()
        seconds = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if step >= WARMUP_STEPS:
            times.append(seconds)
    return statistics.median(times)


def bench_training(comm: Any) -> list[dict[str, Any]]:
    gloo = dist.new_group(list(range(comm.Get_size())), backend="gloo")
    ours_group = dist.new_group(list(range(comm.Get_size())), backend=hb.BACKEND_NAME)
    out = []
    for strategy in ("ddp", "fsdp2"):
        ours, theirs = [], []
        for _ in range(ROUNDS):
            ours.append(_step_seconds(strategy, ours_group, comm))
            theirs.append(_step_seconds(strategy, gloo, comm))
        out.append({"strategy": strategy, "hetbench_step_seconds": statistics.median(ours),
                    "gloo_step_seconds": statistics.median(theirs),
                    "ratio": statistics.median(ours) / statistics.median(theirs)})
    return out


def main() -> int:
    from mpi4py import MPI

    hb.init("host")
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    threads = torch.get_num_threads()
    reduce = bench_allreduce(comm)
    training = bench_training(comm)
    ok = reduce["ratio"] >= ALLREDUCE_GOAL and all(t["ratio"] <= 1.0 for t in training)
    if rank == 0:
        library = MPI.Get_library_version().splitlines()[0].strip()
        print(f"torch front end, torch {torch.__version__}, {size} ranks, {threads} torch threads a rank, {library}; "
              f"medians of {ROUNDS} alternating rounds")
        print(f"all_reduce {reduce['size_mib']} MiB fp32 CPU tensor: hetbench backend "
              f"{reduce['hetbench_algbw_gbps']:.2f} GB/s, bare mpi4py Allreduce {reduce['mpi4py_algbw_gbps']:.2f} "
              f"GB/s algbw (medians of {ALLREDUCE_ROUNDS} rounds, the order flipped each); ratio {reduce['ratio']:.3f} "
              f"(goal >= {ALLREDUCE_GOAL})")
        print(f"training step, {MODEL_LAYERS} x Linear({MODEL_HIDDEN}) + ReLU, batch {MODEL_BATCH} "
              f"({MODEL_BATCH // size} rows a rank), AdamW, median of {STEPS} steps after {WARMUP_STEPS}:")
        print(f"{'strategy':<9} {'hetbench step ms':>17} {'gloo step ms':>13} {'hetbench / gloo':>16}")
        for t in training:
            print(f"{t['strategy']:<9} {t['hetbench_step_seconds'] * 1e3:>17.1f} {t['gloo_step_seconds'] * 1e3:>13.1f} "
                  f"{t['ratio']:>16.3f}")
        print("goals " + ("met" if ok else "MISSED") + ": allreduce ratio >= 0.90; hetbench step <= gloo step")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
