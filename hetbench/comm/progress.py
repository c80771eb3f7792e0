"""The progress engine: a thread that calls into MPI while the rank's own thread computes, so that non-blocking
operations (Isend, Irecv, Iallgatherv, ...) move while a device is busy.

Neither MPICH (ch4 without MPIR_CVAR_ASYNC_PROGRESS) nor Open MPI moves a started operation unless some thread of
the process is inside an MPI call: a large message over shared memory or TCP goes a cell or a segment per call. A
rank that starts a transfer and then runs a GEMM for 300 ms finds it barely begun when it waits for it (issue 20:
train's prefetch hid 0 % of its gathers in 5 of 6 runs, the gathers tested once a GEMM). Inside `with
Progress(comm):` a daemon thread calls MPI_Iprobe on `comm` every `interval_s` seconds: a probe for a tag nothing
sends (it matches nothing and takes nothing) whose only effect is one turn of the library's progress engine. The
rank's thread holds Python's lock only between calls: NumPy's BLAS, pyopencl's waits and mpi4py's calls release
it, so the thread runs beside the computation. Its cost is one call of a few microseconds per interval (counted in
`polls`).

The thread needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default). Where the library gives less, the engine
runs no thread (`threaded` is False) and callers fall back on their own tests between steps ("regular tests",
`poke()`).
"""

from __future__ import annotations

import threading
from typing import Any

# one turn every half millisecond: a 1 MiB message over MPICH's shared memory needs about 16 turns (64 KiB cells),
# so it moves within 10 ms of compute; the probes cost about 0.2 % of a core (measured: ~1 us a probe)
DEFAULT_INTERVAL_S = 0.0005
# no message of hetbench's uses this tag (MPI guarantees tags up to 32767): a probe for it never matches
PROGRESS_TAG = 32767


def threads_allowed(mpi: Any) -> bool:
    """Whether this process's MPI lets a second thread call it while the first does (MPI_THREAD_MULTIPLE)."""
    try:
        return mpi.Query_thread() >= mpi.THREAD_MULTIPLE
    except Exception:  # pragma: no cover - an MPI that cannot answer is treated as single-threaded
        return False


class Progress:
    """`with Progress(comm):` keeps MPI moving on this rank until the block ends. Re-entrant per instance: a nested
    `with` on the same engine keeps the one thread. `poke()` turns the engine once from the caller's thread (what a
    rank without MPI_THREAD_MULTIPLE does between steps)."""

    def __init__(self, comm: Any, interval_s: float = DEFAULT_INTERVAL_S, threaded: bool | None = None) -> None:
        from mpi4py import MPI

        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.comm, self.interval_s = comm, float(interval_s)
        self.threaded = threads_allowed(MPI) if threaded is None else bool(threaded)
        self.polls = 0  # the engine's turns so far, from its thread and from poke()
        self._depth = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """One turn of MPI's progress engine from the calling thread."""
        self.comm.Iprobe(source=_any_source(), tag=PROGRESS_TAG)
        self.polls += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poke()

    def __enter__(self) -> "Progress":
        self._depth += 1
        if self._depth == 1 and self.threaded:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="hetbench-mpi-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth == 0 and self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


def _any_source() -> int:
    from mpi4py import MPI

    return MPI.ANY_SOURCE
