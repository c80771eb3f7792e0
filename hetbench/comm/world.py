"""The world of ranks: who we are (rank, host, local rank), and how ranks agree before anything runs.

Every check whose answer can differ between ranks (a file only one rank reads, a device only one rank has) goes
through `World.agree`, so all ranks see the same errors and stop together: no rank is left waiting in a collective.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from hetbench.comm import watchdog
from hetbench.signals import started_by_launcher


def world_rank() -> int:
    """This process's rank in COMM_WORLD: what MPI says once it has started, else 0.

    A process no launcher started is rank 0, and MPI is not started to learn it. Where a launcher's variables are
    set, MPI is asked: they may be left over in a shell without a launcher (a leftover PMI_RANK=1 starts a
    singleton of rank 0), and trusting them would leave nobody to print."""
    if "mpi4py.MPI" not in sys.modules and not started_by_launcher():
        return 0
    MPI = watchdog.init_mpi()  # MPI_Init watched where the watchdog is armed (a peer that never came)

    if not MPI.Is_initialized() or MPI.Is_finalized():
        return 0
    return watchdog.raw_world().Get_rank()


@dataclass(frozen=True)
class RankError:
    rank: int
    host: str
    message: str


class World:
    """COMM_WORLD with the facts hetbench needs about it. Works the same with one process or under mpiexec."""

    def __init__(self, comm: Any = None) -> None:
        MPI = watchdog.init_mpi()  # MPI_Init itself watched, where the watchdog is armed

        self.MPI = MPI
        # the communicator as MPI made it, for figures that must not carry even the watchdog's note
        # (hetbench/bench/allreduce.py)
        self.raw_comm = comm if comm is not None else watchdog.raw_world()
        self.comm = watchdog.watched(self.raw_comm) if watchdog.armed() else self.raw_comm
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        try:
            self.host: str = MPI.Get_processor_name()
        except Exception:  # pragma: no cover - some MPI builds cannot tell
            self.host = socket.gethostname()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank: int = node.Get_rank()
        self.local_size: int = node.Get_size()
        node.Free()
        self.hosts: list[str] = self.comm.allgather(self.host)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def wait_all(self, requests: list[Any]) -> None:
        """MPI_Waitall, watched by the watchdog where it is armed."""
        if watchdog.armed():
            watchdog.wait_all(requests)
        else:
            self.MPI.Request.Waitall(requests)

    def barrier(self) -> None:
        self.comm.Barrier()

    def in_turn(self, fn: Any) -> Any:
        """Collective. Every rank calls `fn()` alone, in rank order, the others waiting at a barrier (a device
        timed alone, as the solo runs between a job's iterations are); this rank's result."""
        out = None
        for r in range(self.size):
            self.barrier()
            if r == self.rank:
                out = fn()
        self.barrier()
        return out

    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        return self.comm.gather(obj, root=root)

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self.comm.bcast(obj, root=root)

    def agree(self, messages: Sequence[str] | str | None) -> list[RankError]:
        """Every rank's errors, the same list on every rank. Collective: all ranks must call it."""
        if messages is None:
            messages = []
        elif isinstance(messages, str):
            messages = [messages]
        gathered = self.comm.allgather([str(m) for m in messages])
        return [
            RankError(rank, self.hosts[rank], message) for rank, ms in enumerate(gathered) for message in ms
        ]

    def mpi_library(self) -> str:
        return self.MPI.Get_library_version().strip().splitlines()[0]
