"""Runs hetbench.train's ddp and fsdp on every rank and prints, on rank 0, one JSON object with every rank's logs
and rank 0's final parameters, for tests/mpi/test_train_parallel.py to check against the single-process reference.

    python -m mpi4py tests/mpi_train.py LAYERS HIDDEN BATCH STEPS BACKENDS CASE...

BACKENDS: one per rank, comma separated: host or sim:MODEL (e.g. host,sim:mi300x). CASE: STRATEGY:OPTIMIZER:LR:WEIGHTS
with WEIGHTS "even" or w0/w1/... (e.g. fsdp:adamw:0.01:0.5/0.3/0.2); STRATEGY ddp@BYTES sets ddp's bucket size;
STRATEGY!noprefetch turns fsdp's prefetch off, STRATEGY!rebalance=N measures the batch shares again N times. `python -m mpi4py` aborts every rank when one
raises, so a failure ends the job instead of leaving the other ranks waiting.
"""

from __future__ import annotations

import json
import sys

from hetbench.backends.base import BackendSpec
from hetbench.comm.world import World
from hetbench.train import data_parallel
from hetbench.train.data_parallel import train_ddp, train_fsdp
from hetbench.train.model import ModelConfig
from hetbench.harness.ops import HostOps, Ops

STRATEGIES = {"ddp": train_ddp, "fsdp": train_fsdp}


def open_ops(name: str) -> Ops:
    if name == "host":
        return HostOps()
    if name.startswith("sim:"):
        from hetbench.backends import sim

        return Ops(sim.open_device(BackendSpec("sim", model=name.split(":", 1)[1]), 0, 1))
    if name == "opencl":
        from hetbench.backends import opencl

        return Ops(opencl.open_device(BackendSpec("opencl", 0), 0, 1))
    raise SystemExit(f"unknown backend {name}")


def main(argv: list[str]) -> None:
    layers, hidden, batch, steps = (int(a) for a in argv[:4])
    backends = argv[4].split(",")
    world = World()
    assert len(backends) == world.size, (backends, world.size)
    ops = open_ops(backends[world.rank])
    model = ModelConfig(layers=layers, hidden=hidden, batch=batch, seed=0)
    results = []
    default_bucket = data_parallel.BUCKET_BYTES
    for case in argv[5:]:
        strategy, optimizer, lr, weights = case.split(":")
        strategy, *flags = strategy.split("!")
        extra = {}
        for flag in flags:
            if flag == "noprefetch":
                extra["prefetch"] = False
            elif flag.startswith("rebalance="):
                extra["rebalance_steps"] = int(flag.split("=")[1])
            else:
                raise SystemExit(f"unknown flag {flag}")
        strategy, _, bucket = strategy.partition("@")  # ddp@BYTES: ddp with buckets of BYTES
        data_parallel.BUCKET_BYTES = int(bucket) if bucket else default_bucket
        w = [1.0] * world.size if weights == "even" else [float(v) for v in weights.split("/")]
        seen = []
        outcome = STRATEGIES[strategy](world, ops, model, optimizer, float(lr), steps, w,
                                       on_step=seen.append, **extra)
        assert seen == outcome.logs
        logs = world.gather([log.to_dict() for log in outcome.logs])
        if world.rank == 0:
            assert outcome.params is not None
            results.append({
                "case": case,
                "details": outcome.details,
                "logs": logs,
                "params": [[W.tolist(), b.tolist()] for W, b in outcome.params],
            })
        else:
            assert outcome.params is None
    if world.rank == 0:
        print(json.dumps({"size": world.size, "backends": backends, "results": results}))


if __name__ == "__main__":
    main(sys.argv[1:])
