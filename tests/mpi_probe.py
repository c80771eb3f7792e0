"""link_to_root under mpiexec: None on the root, a positive bandwidth and latency on every other rank, for the root
0 and the last rank; arguments out of range raise on every rank before any message moves.

Run it as `python -m mpi4py tests/mpi_probe.py` (alone or under mpiexec): mpi4py's runner aborts every rank when
one raises, so a failed check ends the job instead of leaving the other ranks waiting. Rank 0 prints one JSON
line: for each root, every rank's (bytes_per_s, latency_s) or null.
"""

from __future__ import annotations

import json
import math

from mpi4py import MPI

from hetbench.comm.world import World
from hetbench.harness.probe import Link, link_to_root


def check_bad_arguments(world: World) -> None:
    for kwargs, needle in (({"root": world.size}, f"root {world.size} is not a rank"),
                           ({"nbytes": 0}, "nbytes >= 1"), ({"repeat": 0}, "repeat >= 1")):
        try:
            link_to_root(world, **kwargs)
        except ValueError as e:
            assert needle in str(e), (needle, str(e))
        else:
            raise AssertionError(f"no ValueError for {kwargs}")


def main() -> None:
    world = World()
    check_bad_arguments(world)
    report = {}
    for root in sorted({0, world.size - 1}):
        # a World, and a bare communicator alike
        link = link_to_root(world if root == 0 else MPI.COMM_WORLD, root=root, nbytes=1 << 20, repeat=3)
        if world.rank == root:
            assert link is None, link
        else:
            assert isinstance(link, Link), link
            assert math.isfinite(link.bytes_per_s) and link.bytes_per_s > 0, link
            assert math.isfinite(link.latency_s) and link.latency_s > 0, link
        gathered = world.gather(None if link is None else [link.bytes_per_s, link.latency_s])
        if world.rank == 0:
            report[str(root)] = gathered
    if world.rank == 0:
        print(json.dumps(report))


main()
