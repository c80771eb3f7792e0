"""What the MPI launcher tells a process before and after MPI starts: the one list of the launchers' rank
variables, and this process's rank in COMM_WORLD."""

from __future__ import annotations

import os
import sys

# The rank each launcher exports: MPICH's hydra (PMI_RANK), Open MPI, PMIx, MVAPICH2, Slurm's srun
RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def started_by_launcher() -> bool:
    """Whether a launcher's rank variable is set (it may be left over in a shell that started no job)."""
    return any(os.environ.get(name) for name in RANK_ENV)


def world_rank() -> int:
    """This process's rank in COMM_WORLD: what MPI says once it has started, else 0.

    A process no launcher started is rank 0, and MPI is not started to learn it. Where a launcher's variables are
    set, MPI is asked: they may be left over in a shell without a launcher (a leftover PMI_RANK=1 starts a
    singleton of rank 0), and trusting them would leave nobody to print."""
    if "mpi4py.MPI" not in sys.modules and not started_by_launcher():
        return 0
    from hetbench.comm.watchdog import init_mpi

    MPI = init_mpi()  # MPI_Init watched where the watchdog is armed (a peer that never came)

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return 0
    return MPI.COMM_WORLD.Get_rank()
