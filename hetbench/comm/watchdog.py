"""The watchdog (nccl-tests' `-T`): a rank that has waited `--timeout` seconds in one MPI operation ends the job.

MPI has no timeout of its own. A peer that went silent (a cut link, a stopped or wedged process) leaves every other
rank blocked in its next collective for ever, spinning at full CPU; neither MPICH nor Open MPI ends such a job. So
every MPI operation a command makes goes through a communicator of the class below, which notes, per thread, which
operation the thread is in and since when (two dictionary writes around the call: well under a microsecond, see
`make bench`'s 8-byte allreduce). A daemon thread looks at those notes a few times a second; once one is older than
the timeout it prints one line naming the rank, its host, the operation and the time waited, and calls MPI_Abort
(exit 1), which makes the launcher end every rank. Files already committed stay; nothing is committed after.

Non-blocking operations return requests of the class below, whose waits are watched the same way. A wait that a
command makes by polling (`Test` in a loop) is not one operation and is not watched.
"""

from __future__ import annotations

import os
import select
import signal as _signal
import socket
import sys
import threading
import time
from typing import Any

from hetbench import signals

# the exit code of a job the watchdog ended: a failure, like a failed check, not a usage error
EXIT_CODE = 1
# rank r waits min(r, SPEAK_DELAY_RANKS) times this long after its own timeout before it speaks: when several ranks
# wait on one silent peer, the lowest of them says the line and its abort ends the others first (the delay must
# outlast the time an abort takes to end the others on a loaded machine, or two ranks speak)
SPEAK_DELAY_PER_RANK_SECONDS = 1.0
SPEAK_DELAY_RANKS = 5
# MPI_Abort must reach the launcher through the rank's local daemon; should that hang (a daemon beyond the cut link),
# the rank still ends after this long, and the launcher sees it die
ABORT_GRACE_SECONDS = 5.0

# blocking operations of mpi4py's communicators, buffer (capitalised) and pickled (lower case) forms alike
BLOCKING = (
    "Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather", "Allgatherv", "Alltoall",
    "Alltoallv", "Alltoallw", "Reduce", "Allreduce", "Reduce_scatter", "Reduce_scatter_block", "Scan", "Exscan",
    "Send", "Ssend", "Bsend", "Rsend", "Recv", "Sendrecv", "Sendrecv_replace", "Probe", "Mprobe",
    "barrier", "bcast", "gather", "scatter", "allgather", "alltoall", "reduce", "allreduce", "scan", "exscan",
    "send", "ssend", "bsend", "recv", "sendrecv", "probe", "mprobe",
    # collective over the communicator, every rank must come: the communicators these return are watched too
    # (mpi4py builds them as the caller's class)
    "Split", "Split_type", "Create_group", "Create",
)
# these return a request, whose waits are watched
NONBLOCKING = (
    "Ibarrier", "Ibcast", "Igather", "Igatherv", "Iscatter", "Iscatterv", "Iallgather", "Iallgatherv", "Ialltoall",
    "Ialltoallv", "Ialltoallw", "Ireduce", "Iallreduce", "Ireduce_scatter", "Ireduce_scatter_block", "Iscan",
    "Iexscan", "Isend", "Issend", "Ibsend", "Irsend", "Irecv", "Isendrecv", "Isendrecv_replace",
    "isend", "issend", "ibsend", "irecv",
)

_waits: dict[int, tuple[str, float]] = {}  # thread ident -> (operation, _clock() when it began)
_timeout_seconds: float = 0.0
_thread: threading.Thread | None = None


def armed() -> bool:
    return _timeout_seconds > 0


def timeout_seconds() -> float:
    return _timeout_seconds


def arm(seconds: float | None) -> None:
    """Watch every MPI operation made through `watched` communicators from now on: `seconds` in one is the limit.
    0 or None: no limit (the thread is not started). Call before MPI communicators are made (World() wraps its own
    when armed). A second call changes the limit."""
    global _timeout_seconds, _thread
    _timeout_seconds = float(seconds or 0.0)
    if _timeout_seconds > 0 and _thread is None:
        _thread = threading.Thread(target=_watch, name="hetbench-watchdog", daemon=True)
        _thread.start()


def disarm() -> None:
    global _timeout_seconds
    _timeout_seconds = 0.0


def _clock() -> float:
    """Seconds this process has been able to run: time.monotonic() less the pauses `_watch` saw (a SIGSTOP, a
    suspended machine). A rank that was stopped itself has not been waiting on its peers (Open MPI, ending a job,
    wakes a stopped rank with SIGCONT: its own operation must not then count as a wait)."""
    return time.monotonic() - _paused_seconds


_paused_seconds = 0.0
# a look this much later than planned means the process did not run in between
PAUSE_SECONDS = 1.0


def _watch() -> None:
    global _paused_seconds
    last = time.monotonic()
    while True:
        limit = _timeout_seconds
        step = min(1.0, limit / 10) if limit > 0 else 1.0
        time.sleep(step)
        now = time.monotonic()
        if now - last > step + PAUSE_SECONDS:
            _paused_seconds += now - last - step
        last = now
        if limit <= 0:
            continue
        running = _clock()
        for operation, began in list(_waits.values()):
            if running - began >= limit:
                _fire(operation, running - began)


def _fire(operation: str, waited: float) -> None:
    mpi = sys.modules.get("mpi4py.MPI")
    rank, size = signals.world()
    if rank:
        time.sleep(SPEAK_DELAY_PER_RANK_SECONDS * min(rank, SPEAK_DELAY_RANKS))
    who = f"rank {rank} ({socket.gethostname()})" if size > 1 else "this process"
    line = (f"Error: {who} waited {waited:.0f} s in MPI {operation} with no answer from its peers "
            f"(--timeout {_timeout_seconds:g}); ending the job (a peer stopped, or the link to it cut?)")
    threading.Timer(ABORT_GRACE_SECONDS, os._exit, args=(EXIT_CODE,)).start()
    signals.end_job(line, EXIT_CODE, mpi)


def _watched(name: str, call: Any) -> Any:
    def operation(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = threading.get_ident()
        _waits[key] = (name, time.monotonic() - _paused_seconds)
        try:
            return call(self, *args, **kwargs)
        finally:
            _waits.pop(key, None)

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = call.__doc__
    return operation


def _returning_request(name: str, call: Any) -> Any:
    def operation(self: Any, *args: Any, **kwargs: Any) -> Any:
        return WatchedRequest(call(self, *args, **kwargs))

    operation.__name__ = operation.__qualname__ = name
    operation.__doc__ = call.__doc__
    return operation


def _request_class() -> type:
    from mpi4py import MPI

    def watched_class(call: Any, name: str) -> Any:
        inner = _watched(name, lambda cls, *a, **k: call(*a, **k))
        return classmethod(inner)

    body: dict[str, Any] = {"__doc__": "An MPI request whose waits the watchdog watches."}
    for name in ("Wait", "wait"):
        body[name] = _watched(f"{name} (a non-blocking operation)", getattr(MPI.Request, name))
    for name in ("Waitall", "waitall", "Waitany", "waitany", "Waitsome", "waitsome"):
        body[name] = watched_class(getattr(MPI.Request, name), f"{name} (non-blocking operations)")
    return type("WatchedRequest", (MPI.Request,), body)


def _comm_class() -> type:
    from mpi4py import MPI

    body: dict[str, Any] = {"__doc__": "An intracommunicator whose blocking operations the watchdog watches."}
    for name in BLOCKING:
        if hasattr(MPI.Intracomm, name):
            body[name] = _watched(name, getattr(MPI.Intracomm, name))
    for name in NONBLOCKING:
        if hasattr(MPI.Intracomm, name):
            body[name] = _returning_request(name, getattr(MPI.Intracomm, name))
    return type("WatchedComm", (MPI.Intracomm,), body)


class _Lazy:
    """The two classes are made on first use: mpi4py.MPI must not be imported (MPI started) before a command needs
    it."""

    comm: type | None = None
    request: type | None = None


def WatchedRequest(request: Any) -> Any:  # noqa: N802 - stands for the class
    if _Lazy.request is None:
        _Lazy.request = _request_class()
    return _Lazy.request(request)


def watched(comm: Any) -> Any:
    """`comm` as a communicator whose operations the watchdog watches (the same MPI communicator, not a copy); `comm`
    itself where it is not an intracommunicator, or is already watched."""
    from mpi4py import MPI

    if _Lazy.comm is None:
        _Lazy.comm = _comm_class()
    if isinstance(comm, _Lazy.comm) or not isinstance(comm, MPI.Intracomm):
        return comm
    return _Lazy.comm(comm)


def init_mpi() -> Any:
    """mpi4py.MPI, started (MPI_Init) under the watchdog where it is armed and the launcher started several ranks.

    MPI_Init returns once every rank has come to it; a rank that ended before it did (a signal while Python itself
    was starting, before hetbench's first line) leaves the others waiting in it for ever under MPICH, whose launcher
    ends a job only for a rank killed by a signal or one gone after MPI started. mpi4py holds Python's lock through
    MPI_Init, so no thread of this process can run then: a forked sentinel process stands guard instead. Should
    MPI_Init not return within the timeout, it says one line and kills the rank (SIGKILL: the rank can run no
    handler), and the launcher ends the job. Otherwise it leaves as soon as MPI has started."""
    if "mpi4py.MPI" in sys.modules or not armed() or signals.launched_size() <= 1:
        from mpi4py import MPI

        return MPI
    limit, rank, parent = _timeout_seconds, signals.launched_rank(), os.getpid()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sentinel: nothing of the parent's but this loop runs here
        try:
            os.close(write_fd)
            ready, _, _ = select.select([read_fd], [], [], limit)
            if not ready:
                signals.say(f"Error: rank {rank} ({socket.gethostname()}) waited {limit:.0f} s in MPI_Init with no "
                             f"answer from its peers (--timeout {limit:g}); ending the job (a rank that did not start, "
                             "or a link cut?)")
                os.kill(parent, _signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(read_fd)
    try:
        from mpi4py import MPI
    finally:
        os.close(write_fd)  # the sentinel reads the end of the pipe and leaves
        os.waitpid(pid, 0)
    return MPI


class _Joined:
    world: Any = None  # the job's world where it is not COMM_WORLD: Open MPI singletons merged (pytorch/join.py)


def set_world(comm: Any) -> None:
    """Make COMM (every rank of the job) the world that world_comm() gives, in place of MPI's COMM_WORLD."""
    _Joined.world = comm


def raw_world() -> Any:
    """The job's world, unwatched: MPI's COMM_WORLD, or the one set_world() gave."""
    from mpi4py import MPI

    return _Joined.world if _Joined.world is not None else MPI.COMM_WORLD


def world_comm() -> Any:
    """The job's world (raw_world()), watched where the watchdog is armed (for code that makes its own communicators
    from it)."""
    world = raw_world()
    return watched(world) if armed() else world


def wait_all(requests: list[Any]) -> Any:
    """MPI_Waitall on `requests`, watched."""
    if _Lazy.request is None:
        _Lazy.request = _request_class()
    return _Lazy.request.Waitall(requests)
