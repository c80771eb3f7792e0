"""The progress engine: a thread that moves this rank's non-blocking MPI operations while its own thread computes.

Neither MPICH (ch4 without MPIR_CVAR_ASYNC_PROGRESS) nor Open MPI moves a started operation unless some thread of
the process is inside an MPI call: a large message over shared memory or TCP goes a cell or a segment per call, and
a rendezvous waits for its handshake. A rank that starts a transfer and then runs a GEMM for 300 ms finds it barely
begun when it waits for it (issue 20: train's prefetch hid almost none of its gathers).

`flight = engine.start(requests)` hands the requests to the engine's thread, which tests them (MPI_Testall) every
`interval_s` seconds until they are complete, and sleeps while it holds none: a poll slows the computing thread
beside it a little, so it polls only while something is in flight. `engine.wait(flight)` takes the requests back
(after any test the thread is making) and completes them on the caller's thread with MPI_Waitall, watched by the
watchdog; the caller must not touch the requests between. The rank's thread holds Python's lock only between calls:
NumPy's BLAS, pyopencl's waits and mpi4py's calls release it, so the thread runs beside the computation.

`flight = engine.launch(begin)` hands the engine the operation's start as well (`begin()` makes the non-blocking
call and returns its requests): the engine's thread makes that call, so the computing thread only hands it over, as
Horovod's background thread and Gloo's worker threads make a framework's collectives. Starting is work: MPICH's
MPI_Iallgatherv copies the rank's own part into place and, where the peer's part has already come, reads it too
inside the call (a large share of a small gather's time, which the computing thread could never hide if it made the
call). Launches begin in the order they were made; wait() begins any the thread has not reached yet on the caller's
thread, first those launched before. A launched operation must be on a communicator that no other thread starts
collectives on meanwhile (a collective's order must be the same on every rank, and the thread begins it later than
the caller's next call): fsdp's prefetched gathers have a duplicate of the world communicator to themselves. On a
rank with one core the thread's work shares that core with the computation (it is not free there, only off the
computing thread's critical path); `cpu_seconds` is what the thread used, begins, tests and all.

The thread needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default). Where the library gives less, `threaded` is
False: start() only notes the requests, launch() begins the operation at once on the caller's thread, and
`test(flight)` lets the caller move them between its own steps ("regular tests"), wait() completes them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from hetbench.comm import watchdog

# while something is in flight: a 1 MiB message over MPICH's shared memory takes some 16 turns of its progress
# engine (64 KiB cells)
DEFAULT_INTERVAL_S = 0.00025


def threads_allowed(mpi: Any) -> bool:
    """Whether this process's MPI lets a second thread call it while the first does (MPI_THREAD_MULTIPLE)."""
    try:
        return mpi.Query_thread() >= mpi.THREAD_MULTIPLE
    except Exception:  # pragma: no cover - an MPI that cannot answer is treated as single-threaded
        return False


class Flight:
    """Requests handed to the engine: done once every one completed (on the engine's thread or in wait())."""

    def __init__(self, requests: list[Any], begin: Callable[[], list[Any]] | None = None) -> None:
        self.requests = list(requests)
        self.begin = begin  # launch(): the call that starts the operation, until one thread has made it
        self.error: BaseException | None = None  # what that call raised (on the engine's thread), for wait()
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
        self.cpu_seconds = 0.0  # the CPU time the engine's thread used (time.thread_time), begins and tests
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
            self._ensure_thread()
            self._flights.append(flight)
            self._cv.notify_all()
        return flight

    def _ensure_thread(self) -> None:  # under self._cv
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="hetbench-mpi-progress", daemon=True)
            self._thread.start()

    def launch(self, begin: Callable[[], list[Any]]) -> Flight:
        """Hand the engine a non-blocking operation to start as well as move (module docstring): `begin()` makes
        the call and returns its requests. Without the thread it is made here, now."""
        if not self.threaded:
            return Flight(begin())
        flight = Flight([], begin)
        with self._cv:
            self._ensure_thread()
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
        if flight.begin is not None:  # launched, and the thread has not begun it: those before it first, in order
            with self._cv:
                earlier = self._flights[:self._flights.index(flight) + 1] if flight in self._flights else [flight]
            for f in earlier:
                with f.lock:
                    _begin(f)
        with self._cv:
            if flight in self._flights:
                self._flights.remove(flight)
        if flight.error is not None:
            raise flight.error
        if not flight.done:
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
            cpu = time.thread_time()
            for flight in flights:
                with flight.lock:
                    if flight.begin is not None:
                        if flight.released:  # its waiter begins it, and the ones after it wait their turn
                            break
                        _begin(flight)
                    if flight.released or flight.done:
                        continue
                    if _testall(flight.requests):
                        flight.done = True
                self.polls += 1
            self.cpu_seconds += time.thread_time() - cpu
            with self._cv:
                self._flights = [f for f in self._flights if not f.done]
            time.sleep(self.interval_s)


def _begin(flight: Flight) -> None:
    """Make a launched flight's call (under flight.lock); what it raises is kept for wait(), and ends the flight."""
    begin, flight.begin = flight.begin, None
    if begin is None:
        return
    try:
        flight.requests = list(begin())
    except BaseException as e:  # noqa: BLE001 - raised again on the waiting thread
        flight.error, flight.done = e, True


def _testall(requests: list[Any]) -> bool:
    from mpi4py import MPI

    return bool(MPI.Request.Testall(requests))


def _waitall(requests: list[Any]) -> None:
    from mpi4py import MPI

    MPI.Request.Waitall(requests)
