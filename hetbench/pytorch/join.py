"""MPI started from torch's rendezvous, for ranks that no MPI launcher started: under torchrun (single or multi node),
torch.multiprocessing.spawn, or any script that calls init_process_group("hetbench", rank=, world_size=) with a
store of its own. MPI's world then holds torch's ranks in torch's RANK order.

How, by the MPI library mpi4py loaded (asked before MPI starts):
  MPICH     rank 0 starts a PMI-1 server (hetbench/comm/pmi_server.py) and puts its address in torch's store; every
            rank connects to it and MPI_Init takes that socket as its launcher's (PMI_FD). Needs rank 0's host to
            accept TCP on one port (HETBENCH_PMI_PORT, default any free one) from every rank's host.
  Open MPI  each rank starts as a singleton reaching an ompi-server that rank 0 starts; the ranks join one at a
            time, in RANK order, by MPI_Comm_connect/accept, each join merged into one intracommunicator, which
            hetbench takes as its world (hetbench.comm.watchdog.raw_world; MPI's COMM_WORLD stays each rank's own).
            They are not finalized: joined singletons' MPI_Finalize hung at exit one run in a few (4.1.4).
Before MPI starts every rank says in the store that it has arrived and waits for all: a rank that has not arrived
within HETBENCH_JOIN_TIMEOUT seconds (default 120) ends the join on every rank that did, with one line naming it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from typing import Any

from hetbench.comm import watchdog
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
    world = watchdog.raw_world()
    if world.Get_size() < size:
        raise JoinError(f"hetbench join: MPI's world has {world.Get_size()} rank(s) and torch's {size}: MPI was "
                        "started before init_process_group (mpi4py.MPI imported first?); under torchrun or "
                        "mp.spawn let init_process_group('hetbench') start it, or launch with mpiexec")


def _mpi_library() -> tuple[Any, str]:
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False  # MPI starts once the job is made, not on import
        # joined Open MPI singletons are not finalized: their MPI_Finalize hung at exit in libevent's cleanup
        # (Open MPI 4.1.4) one run in a few; mpi4py reads this on import, before MPI names itself
        mpi4py.rc.finalize = _abi() != "openmpi"
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
    _keep(server)
    return f"{_own_address(hosts)}:{line}"


def _keep(server: subprocess.Popen) -> None:
    """Hold rank 0's server for the life of the job, unwaited: MPICH's serves MPI_Finalize, which runs after Python
    has closed its files. Its stdin, the pipe whose end tells it rank 0 is gone, is held by a copy that Python never
    closes (the process's end does)."""
    _State.server, _State.pipe = server, os.dup(server.stdin.fileno())  # type: ignore[union-attr]


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
    if library not in ("mpich", "openmpi"):
        raise JoinError(f"hetbench join: mpi4py's MPI is {library!r}; ranks that no MPI launcher started are joined "
                        "under MPICH and Open MPI only: launch with that MPI's mpiexec instead")
    hosts = _arrive(store, rank, size, deadline)
    if library == "mpich":
        _join_mpich(MPI, store, rank, hosts, deadline)
    else:
        _join_openmpi(MPI, store, rank, size, deadline)
    check_world(size)


def _abi() -> str:
    """The MPI ABI mpi4py is about to load ("mpich", "openmpi"), asked of mpi4py's loader before mpi4py.MPI is
    imported ("" where this mpi4py cannot say)."""
    try:
        from mpi4py import _mpiabi

        return str(_mpiabi._get_mpiabi())
    except Exception:  # noqa: BLE001 - an mpi4py without the loader: finalized as usual
        return ""


def _start_ompi_server(deadline: float) -> str:
    """Rank 0: ompi-server's URI, or "error:<why>". It runs under a shell that kills it once rank 0's end of its
    stdin closes (rank 0 gone, however it ended)."""
    import shutil
    import tempfile

    exe = shutil.which("ompi-server")
    if exe is None:
        return "error:Open MPI's ompi-server, which joins Open MPI's ranks, is not on PATH (Debian: openmpi-bin)"
    folder = tempfile.mkdtemp(prefix="hetbench-join-")
    uri_file = os.path.join(folder, "uri")  # `-r -` does not reach a pipe: ompi-server does not flush it
    script = '"$0" --no-daemonize -r "$1" </dev/null >/dev/null 2>&1 & pid=$!; read _; kill $pid; rm -rf "$2"'
    server = subprocess.Popen(["sh", "-c", script, exe, uri_file, folder], stdin=subprocess.PIPE)
    _keep(server)
    while time.monotonic() < deadline:
        try:
            with open(uri_file) as f:
                uri = f.read().strip()
        except OSError:
            uri = ""
        if uri:
            return uri
        if server.poll() is not None:
            return "error:ompi-server ended before it gave its address"
        time.sleep(0.05)
    return f"error:ompi-server gave no address within {join_timeout():g} s"


def _join_openmpi(MPI: Any, store: Any, rank: int, size: int, deadline: float) -> None:
    key = "hetbench/join/ompi-server"
    if rank == 0:
        store.set(key, _start_ompi_server(deadline))
    uri = _get(store, key, deadline, "rank 0's ompi-server address")
    if uri.startswith("error:"):
        raise JoinError(f"hetbench join: {uri[6:]}")
    os.environ["OMPI_MCA_pmix_server_uri"] = uri  # connect/accept between singletons goes through it
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    # one rank at a time, in RANK order: the ranks joined so far accept, the next connects, and the two sides merge
    # into one intracommunicator with the newcomer last (concurrent connects hang Open MPI 4.1)
    comm = MPI.COMM_SELF
    if rank == 0:
        port = MPI.Open_port()
        store.set("hetbench/join/ompi-port", port)
    else:
        port = _get(store, "hetbench/join/ompi-port", deadline, "rank 0's MPI port")
        _get(store, f"hetbench/join/ompi-turn/{rank}", deadline, f"rank {rank}'s turn to connect")
        inter = MPI.COMM_SELF.Connect(port, root=0)
        comm = inter.Merge(high=True)
        inter.Free()  # not Disconnect, which waits for ever on Open MPI 4.1
    for newcomer in range(rank + 1, size):
        if rank == 0:
            store.set(f"hetbench/join/ompi-turn/{newcomer}", "go")
        inter = comm.Accept(port if rank == 0 else None, root=0)
        merged = inter.Merge(high=False)
        inter.Free()
        if comm != MPI.COMM_SELF:
            comm.Free()
        comm = merged
    if rank == 0:
        MPI.Close_port(port)
    watchdog.set_world(comm)
