"""`make bench`'s two tools, each part registered by name (hetbench/bench/registry.py):

the library-call ratios, each hetbench figure against the plain library call it wraps, both measured in the same
run in alternating rounds (so that drifts of clock speed or load hit both alike; each round's figure a median, the
ratio of the medians over the rounds):

    python -m hetbench.bench gemm                    host GEMM through hetbench's harness vs a bare NumPy `a @ b`
    mpiexec -n 2 python -m hetbench.bench allreduce  hetbench's allreduce vs a bare mpi4py `Allreduce` loop, and the
                                                     host-staged allreduce of OpenCL buffers vs host buffers
    python -m hetbench.bench opencl                  OpenCL GEMM (own kernel, tuned kernel, CLBlast) vs a bare
                                                     pyclblast.gemm loop, and clpeak's fp32 peak as a ceiling
    mpiexec -n 2 python -m hetbench.bench torch      the torch backend's allreduce vs bare mpi4py, and DDP/FSDP2
                                                     steps over it vs over Gloo

and the goals of the split and train benches, judged on the result documents their recipes wrote (verdict.py's
bands):

    python -m hetbench.bench split FILE...           split_goals.py
    python -m hetbench.bench train FOLDER            train_goals.py
    python -m hetbench.bench train-torch FOLDER      train_goals.py, and auto over even >= 2
    python -m hetbench.bench pipeline FOLDER         pipeline_goals.py
    python -m hetbench.bench tensor FOLDER           tensor_goals.py

`python -m hetbench.overhead PART` is the same command, kept for scripts and docs that name it.
"""

from __future__ import annotations

# each part module registers its part(s) as it loads: this order is the order the usage message lists them in
from hetbench.bench import gemm, allreduce, opencl, torch_part, split_goals, train_goals, pipeline_goals  # noqa: F401
from hetbench.bench import tensor_goals  # noqa: F401,E402
from hetbench.bench.registry import PARTS, Part, main, register

__all__ = ["PARTS", "Part", "main", "register"]
