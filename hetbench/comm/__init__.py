"""The MPI layer: the world of ranks, agreement on errors, and the transfers between devices."""

from hetbench.comm.world import RankError, World

__all__ = ["RankError", "World"]
