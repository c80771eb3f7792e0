"""MPI started from torch's rendezvous, for ranks that no MPI launcher started: under torchrun (single or multi node),
torch.multiprocessing.spawn, or any script that calls init_process_group("hetbench", rank=, world_size=) with a
store of its own. MPI's COMM_WORLD then holds torch's ranks in torch's RANK order.

How, by the MPI library mpi4py loaded (asked before MPI starts):
  MPICH     rank 0 starts a PMI-1 server (hetbench/comm/pmi_server.py) and puts its address in torch's store; every
            rank connects to it and MPI_Init takes that socket as its launcher's (PMI_FD). Needs rank 0's host to
            accept TCP on one port (HETBENCH_PMI_PORT, default any free one) from every rank's host.
  Open MPI  refused, in one line on every rank: joined singletons (ompi-server, connect/accept) hung in
            MPI_Finalize at exit; Open MPI's mpirun starts such a job instead.
Before MPI starts every rank says in the store that it has arrived and waits for all: a rank that has not arrived
within HETBENCH_JOIN_TIMEOUT seconds (default 120) ends the join on every rank that did, with one line naming it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from hetbench.signals import started_by_launcher

TIMEOUT_ENV = "HETBENCH_JOIN_TIMEOUT"
PORT_ENV = "HETBENCH_PMI_PORT"
ADDR_ENV = "HETBENCH_PMI_ADDR"
DEFAULT_TIMEOUT_S = 120.0
_PMI_ENV = ("PMI_FD", "PMI_RANK", "PMI_SIZE")


class JoinError(RuntimeError):
    """The ranks could not make one MPI job: one line naming what is missing."""


class _State:
    server: subprocess.Popen | None = None  # rank 0's PMI server, kept for the life of the job
    pipe = -1


def join_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise JoinError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise JoinError(f"{TIMEOUT_ENV}={text!r}: the join's timeout must be above 0 seconds")
    return value


def needed(size: int) -> bool:
    """Whether this process must make its MPI job from torch's ranks: more than one rank, MPI not started, and no
    MPI launcher started it (torchrun's ranks are its own even inside a Slurm job)."""
    if size <= 1 or "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized():
        return False
    return bool(os.environ.get("TORCHELASTIC_RUN_ID")) or not started_by_launcher()


def check_world(size: int) -> None:
    """MPI already running: its world must be torch's (a script that imported mpi4py.MPI before
    init_process_group under torchrun started a job of one)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_size() < size:
        raise JoinError(f"hetbench join: MPI's world has {world.Get_size()} rank(s) and torch's {size}: MPI was "
                        "started before init_process_group (mpi4py.MPI imported first?); under torchrun or "
                        "mp.spawn let init_process_group('hetbench') start it, or launch with mpiexec")


def _mpi_library() -> tuple[Any, str]:
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False  # MPI starts once the job is made, not on import
        mpi4py.rc.finalize = True
    from mpi4py import MPI

    text = MPI.Get_library_version()
    return MPI, "openmpi" if "Open MPI" in text else "mpich" if "MPICH" in text else text.splitlines()[0]


def _arrive(store: Any, rank: int, size: int, deadline: float) -> list[str]:
    """Every rank's host, once all have arrived; JoinError naming the missing ranks at the deadline."""
    store.set(f"hetbench/join/host/{rank}", socket.gethostname())
    keys = [f"hetbench/join/host/{r}" for r in range(size)]
    while True:
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        if not missing:
            return [store.get(key).decode() for key in keys]
        if time.monotonic() > deadline:
            arrived = ",".join(str(r) for r in range(size) if r not in missing)
            raise JoinError(f"hetbench join: rank(s) {','.join(map(str, missing))} of {size} did not join within "
                            f"{join_timeout():g} s ({TIMEOUT_ENV}); rank(s) {arrived} did (a rank that never calls "
                            "init_process_group also holds rank 0 in torch's own store)")
        time.sleep(0.05)


def _get(store: Any, key: str, deadline: float, what: str) -> str:
    while not store.check([key]):
        if time.monotonic() > deadline:
            raise JoinError(f"hetbench join: {what} did not come within {join_timeout():g} s ({TIMEOUT_ENV})")
        time.sleep(0.02)
    return store.get(key).decode()


def _own_address(hosts: list[str]) -> str:
    """The address the other ranks reach rank 0 at: loopback on one host, else HETBENCH_PMI_ADDR, else the
    interface rank 0 would use toward torch's store (MASTER_ADDR), else its host name."""
    if os.environ.get(ADDR_ENV):
        return os.environ[ADDR_ENV]
    if all(h == hosts[0] for h in hosts):
        return "127.0.0.1"
    master = os.environ.get("MASTER_ADDR", "")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", "29500") or 29500)))
                return probe.getsockname()[0]
        except OSError:
            pass
    return socket.gethostname()


def _start_pmi_server(hosts: list[str], timeout: float) -> str:
    """Rank 0: the server's address, or "error:<why>"."""
    port = os.environ.get(PORT_ENV, "0") or "0"
    if not port.isdigit():
        return f"error:{PORT_ENV}={port!r} is not a port number"
    cmd = [sys.executable, "-m", "hetbench.comm.pmi_server", "--size", str(len(hosts)), "--hosts", ",".join(hosts),
           "--port", port, "--timeout", f"{timeout:g}"]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = server.stdout.readline().strip() if server.stdout else ""
    if not line.isdigit():
        server.wait()
        why = (server.stderr.read() if server.stderr else "").strip().splitlines()
        return f"error:rank 0 could not start its PMI server on port {port}: {why[-1] if why else 'no reason given'}"
    # Not waited for at exit: it serves MPI_Finalize, which runs after Python has closed its files. Its stdin, the
    # pipe whose end tells it that rank 0 is gone, is held by a copy Python never closes (the process's end does).
    _State.server, _State.pipe = server, os.dup(server.stdin.fileno())  # type: ignore[union-attr]
    return f"{_own_address(hosts)}:{line}"


def _join_mpich(MPI: Any, store: Any, rank: int, hosts: list[str], deadline: float) -> None:
    key = "hetbench/join/pmi"
    if rank == 0:
        store.set(key, _start_pmi_server(hosts, max(1.0, deadline - time.monotonic())))
    where = _get(store, key, deadline, "rank 0's PMI server address")
    if where.startswith("error:"):
        raise JoinError(f"hetbench join: {where[6:]}")
    addr, port = where.rsplit(":", 1)
    try:
        conn = socket.create_connection((addr, int(port)), timeout=max(1.0, deadline - time.monotonic()))
    except OSError as e:
        raise JoinError(f"hetbench join: rank {rank} cannot reach rank 0's PMI server at {where} ({e}); open that "
                        f"port between the nodes, or choose it with {PORT_ENV}") from None
    conn.settimeout(None)
    os.environ.update(PMI_FD=str(conn.detach()), PMI_RANK=str(rank), PMI_SIZE=str(len(hosts)))
    try:
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    finally:
        for name in _PMI_ENV:  # a child process (a data loader's) must not take this socket for its own
            os.environ.pop(name, None)


def join(store: Any, rank: int, size: int) -> None:
    """Collective over torch's ranks (the default group's creation calls it): start MPI with its world made of
    them, ordered by `rank`."""
    timeout = join_timeout()
    deadline = time.monotonic() + timeout
    MPI, library = _mpi_library()
    if MPI.Is_initialized():
        check_world(size)
        return
    if library == "openmpi":
        # Open MPI 4.1's singletons were joined (ompi-server, connect/accept, merged in RANK order) and trained DDP
        # and FSDP2 exactly, but their MPI_Finalize hung at exit in one run of a few: refused until that is solved
        raise JoinError("hetbench join: Open MPI cannot join ranks that its mpirun did not start (their MPI_Finalize "
                        "hangs at exit): launch with Open MPI's mpirun, or run torchrun over the MPICH wheel "
                        "(pip install 'hetbench[mpich]')")
    if library != "mpich":
        raise JoinError(f"hetbench join: mpi4py's MPI is {library!r}; ranks that no MPI launcher started are joined "
                        "under MPICH only: launch with that MPI's mpiexec instead")
    _join_mpich(MPI, store, rank, _arrive(store, rank, size, deadline), deadline)
    check_world(size)
