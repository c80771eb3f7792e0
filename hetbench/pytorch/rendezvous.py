"""Rank, world size and a shared store from MPI, so that under `mpiexec` a torch script's
`init_process_group("hetbench")` needs no MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE (as DeepSpeed's
mpi_discovery does).

torch reads a missing init_method as "env://". hetbench wraps that scheme's handler: when the variables are all
set it is torch's own; when they are not and a launcher started the process, rank and size come from MPI, rank 0
opens a TCPStore on a free port and broadcasts its address; a process that no launcher started is rank 0 of 1,
with an in-memory store. Any backend benefits (Gloo under mpiexec too).
"""

from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import Any, Iterator

import torch.distributed as dist
from hetbench.comm import watchdog
from hetbench.signals import started_by_launcher

# the module, not torch.distributed.rendezvous the function of the same name
_rdzv = importlib.import_module("torch.distributed.rendezvous")

_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_original: Any = None


def _mpi_store(timeout: timedelta) -> tuple[Any, int, int]:
    comm = watchdog.world_comm()
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return dist.HashStore(), 0, 1
    if rank == 0:
        addr = os.environ.get("MASTER_ADDR") or socket.gethostname()
        try:
            store = dist.TCPStore(addr, int(os.environ.get("MASTER_PORT", 0) or 0), size, True, timeout,
                                  wait_for_workers=False)
            where: Any = (addr, store.port)
        except Exception as e:  # every rank learns why, none waits for a store that never opened
            store, where = None, f"rank 0 could not open a TCPStore on {addr}: {e}"
    where = comm.bcast(where if rank == 0 else None, root=0)
    if isinstance(where, str):
        raise RuntimeError(f"hetbench rendezvous: {where}")
    if rank != 0:
        store = dist.TCPStore(where[0], where[1], size, False, timeout)
    return store, rank, size


def _handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    if "?" in url or all(os.environ.get(name) for name in _ENV):
        yield from _original(url, timeout=timeout, **kwargs)
        return

    if started_by_launcher() or "mpi4py.MPI" in __import__("sys").modules:
        yield _mpi_store(timeout)
    else:
        yield dist.HashStore(), 0, 1
    raise RuntimeError("hetbench rendezvous: a group cannot rendezvous twice")


def install() -> None:
    """Wrap torch's env:// handler (once)."""
    global _original
    if _original is not None:
        return
    _original = _rdzv._rendezvous_handlers["env"]
    _rdzv._rendezvous_handlers["env"] = _handler
