"""The torch front end's part of `make bench`, under `mpiexec -n 2`: its bench (hetbench/bench/torch_front.py)
imports torch at its top, so this record keeps it out of every other part's start."""

from __future__ import annotations

from hetbench.bench.registry import Part, register


def run(argv: list[str]) -> int:
    from hetbench.bench import torch_front  # torch takes seconds to load and may be absent: only this part loads it

    return torch_front.main()


register(Part("torch", "the torch backend's allreduce vs bare mpi4py, and DDP/FSDP2 steps over it vs over Gloo", True,
              run))
