"""What the MPI launcher tells a process before and after MPI starts, under the names its callers know: the list
of the launchers' rank variables and whether one is set (hetbench.signals, which reads the launcher's variables
before MPI starts), and this process's rank in COMM_WORLD (hetbench.comm.world)."""

from __future__ import annotations

from hetbench.comm.world import world_rank
from hetbench.signals import RANK_ENV, started_by_launcher

__all__ = ["RANK_ENV", "started_by_launcher", "world_rank"]
