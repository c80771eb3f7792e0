"""The progress engine: a thread that moves this rank's non-blocking MPI operations while its own thread computes.

Neither MPICH (ch4 without MPIR_CVAR_ASYNC_PROGRESS) nor Open MPI moves a started operation unless some thread of
the process is inside an MPI call: a large message over shared memory or TCP goes a cell or a segment per call, and
a rendezvous waits for its handshake. A rank that starts a transfer and then runs a GEMM for 300 ms finds it barely
begun when it waits for it (issue 20: train's prefetch hid 0 % of its gathers in 5 of 6 runs, tested once a GEMM).

`flight = engine.start(requests)` hands the requests to the engine's thread, which tests them (MPI_Testall) every
`interval_s` seconds until they are complete, and sleeps while it holds none: a poll costs the computing thread
beside it some 30 us (measured: a thread polling every 0.5 ms for the whole of a 122 ms single-thread GEMM slowed it
5 %), so it polls only while something is in flight. `engine.wait(flight)` takes the requests back (after any test
the thread is making) and completes them on the caller's thread with MPI_Waitall, watched by the watchdog; the
caller must not touch the requests between. The rank's thread holds Python's lock only between calls: NumPy's BLAS,
pyopencl's waits and mpi4py's calls release it, so the thread runs beside the computation.

The thread needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default). Where the library gives less, `threaded` is
False: start() only notes the requests, and `test(flight)` lets the caller move them between its own steps
("regular tests"), wait() completes them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

# while something is in flight: a 1 MiB message over MPICH's shared memory takes some 16 turns of its progress
# engine (64 KiB cells), 4 ms at this interval
DEFAULT_INTERVAL_S = 0.00025


def threads_allowed(mpi: Any) -> bool:
    """Whether this process's MPI lets a second thread call it while the first does (MPI_THREAD_MULTIPLE)."""
    try:
        return mpi.Query_thread() >= mpi.THREAD_MULTIPLE
    except Exception:  # pragma: no cover - an MPI that cannot answer is treated as single-threaded
        return False


class Flight:
    """Requests handed to the engine: done once every one completed (on the engine's thread or in wait())."""

    def __init__(self, requests: list[Any]) -> None:
        self.requests = list(requests)
        self.done = False
        self.released = False  # taken back by wait(): the thread no longer touches the requests
        self.lock = threading.Lock()  # held by whoever is calling MPI on the requests


class Progress:
    """A rank's progress engine (module docstring). One per communicator user; its thread starts on first use and
    ends with close() (or the process: it is a daemon)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, threaded: bool | None = None) -> None:
        from mpi4py import MPI

        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.threaded = threads_allowed(MPI) if threaded is None else bool(threaded)
        self.polls = 0  # tests the engine's thread made
        self._flights: list[Flight] = []
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def start(self, requests: list[Any]) -> Flight:
        """Hand `requests` (started non-blocking operations) to the engine."""
        flight = Flight(requests)
        if not self.threaded or not flight.requests:
            return flight
        with self._cv:
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="hetbench-mpi-progress", daemon=True)
                self._thread.start()
            self._flights.append(flight)
            self._cv.notify_all()
        return flight

    def test(self, flight: Flight) -> bool:
        """Move `flight` on from the caller's thread (MPI_Testall); True once it is complete. For ranks whose MPI
        gives no second thread; with the engine's thread it only says whether the flight is done."""
        if self.threaded:
            return flight.done
        with flight.lock:
            if not flight.done:
                flight.done = _testall(flight.requests)
            return flight.done

    def wait(self, flight: Flight) -> None:
        """Complete `flight` on the caller's thread (watched MPI_Waitall), once the engine has let go of it."""
        with flight.lock:
            flight.released = True
        with self._cv:
            if flight in self._flights:
                self._flights.remove(flight)
        if not flight.done:
            from hetbench.comm import watchdog

            if watchdog.armed():
                watchdog.wait_all(flight.requests)
            else:
                _waitall(flight.requests)
            flight.done = True

    def close(self) -> None:
        """End the thread (the flights still held are left to their wait())."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._flights and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                flights = list(self._flights)
            for flight in flights:
                with flight.lock:
                    if flight.released or flight.done:
                        continue
                    if _testall(flight.requests):
                        flight.done = True
                self.polls += 1
            with self._cv:
                self._flights = [f for f in self._flights if not f.done]
            time.sleep(self.interval_s)


def _testall(requests: list[Any]) -> bool:
    from mpi4py import MPI

    return bool(MPI.Request.Testall(requests))


def _waitall(requests: list[Any]) -> None:
    from mpi4py import MPI

    MPI.Request.Waitall(requests)
