"""Ctrl-C (SIGINT) and SIGTERM end the whole job within seconds, however far apart its ranks are.

A Python signal handler runs in the main thread between bytecodes only: a rank blocked in an MPI call (a barrier,
a reduce) or in one long BLAS call never gets there, and a rank that leaves through MPI_Finalize alone leaves the
others waiting for ever. So CPython's C-level handler also writes the signal's number to a pipe
(`signal.set_wakeup_fd`), and a watchdog thread blocked on that pipe wakes at once: in a job of several ranks it
prints one line and calls MPI_Abort, which makes the launcher end every rank; alone, it lets the main thread unwind
(the handler raises `Interrupted`) and ends the process itself if that takes more than a moment.

A rank signalled before MPI has started on it (its first instants: the commands still importing) starts MPI before it
ends, and aborts the job through it: a rank that left before MPI_Init would leave MPICH's other ranks waiting for it
for ever. hetbench/__main__.py holds the two signals from its first line until `install` has run; before that line
(Python itself starting) the signal's default action ends the rank, and the job ends without a hang: Open MPI ends
it, and under MPICH the other ranks' MPI_Init ends at --timeout (comm/watchdog.py init_mpi).

The command's end is in force too (`finish`): mpi4py would finalise MPI after Python has put the signals' default
actions back (a signal in MPI_Finalize, which waits for every rank, then killed the rank with nothing said), and a
signal in Python's exit callbacks was dropped ("Exception ignored"). So the command runs its exit callbacks, meets
the other ranks at a barrier (the wait for a slower rank is there, where MPI_Abort still ends them all) and finalises
MPI itself, the signals still handled, then ends the process: a signal until MPI_Finalize ends the job as anywhere
else (128 + N, one line naming the rank and the signal). MPI_Finalize itself (milliseconds, every rank there) is the
job's end: MPI can abort no more, and MPICH's launcher ends the job with the first rank that leaves it.

SIGHUP is left alone: UCX, under MPICH, takes it at MPI initialisation as its debugging signal.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

HANDLED = (signal.SIGINT, signal.SIGTERM)
# a single process gets this long to unwind through its own `finally` blocks before the watchdog ends it
SINGLE_GRACE_SECONDS = 2.0
# ranks other than 0 wait this long before aborting: when the launcher forwards a signal to every rank, rank 0's
# abort ends the others first and the job prints one line, not one per rank
NONROOT_DELAY_SECONDS = 0.5
# between a rank's last line and its MPI_Abort: the launcher forwards a rank's output through a pipe, and an abort can
# end the launcher before the line has gone through (MPICH's hydra could lose a rank's "failed" line)
ABORT_FLUSH_SECONDS = 0.25
# a rank signalled before MPI started gets this long to start it and abort the job from its main thread (MPI_Init
# returns once every rank has come to it: a peer may still be importing)
STARTUP_GRACE_SECONDS = 30.0
# meanwhile the watchdog looks this often whether MPI has come up: where the main thread dropped the interrupt (a
# signal landing in a weakref callback during the imports: Python prints "Exception ignored" and goes on) it starts
# MPI itself to run the command, and the watchdog then ends the job at once, not after the whole grace
STARTUP_POLL_SECONDS = 0.1
# the number of ranks each launcher exports (MPICH's hydra, Open MPI, MVAPICH2, Slurm's srun)
SIZE_ENV = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
# the rank each launcher exports: MPICH's hydra (PMI_RANK), Open MPI, PMIx, MVAPICH2, Slurm's srun
RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")

# taken by whoever announces the end; never released (the process is ending). Reentrant: the main thread that said
# an interrupt itself (`interrupted`) takes it again in `finish`
_ending = threading.RLock()
_first_signal: int | None = None
_installed = False
# the command's end (`finish`): None before; then the (rank, size) of the job, and the first signal that came since
_finishing: tuple[int, int] | None = None
_finish_signal: int | None = None
_mpi_ending = threading.Lock()  # held by whoever ends MPI: `finish` to start MPI_Finalize, the watchdog to abort
_finalizing = False  # MPI_Finalize has begun: MPI_Abort can no longer be called, the job has ended
_late_signal: int | None = None  # a signal during MPI_Finalize (the main thread's handler runs once it returns)


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM; a KeyboardInterrupt so that code catching that sees it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return exit_code(self.signum)


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


def world() -> tuple[int, int]:
    """(rank, size) of COMM_WORLD once MPI is initialised (and not finalised); (0, 1) before."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
            return 0, 1
        return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
    except Exception:  # an MPI that cannot answer from this thread: treat the process as alone
        return 0, 1


def say(line: str) -> None:
    # os.write, not print: no Python-level lock on sys.stderr that the interrupted main thread might hold
    try:
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass


def _abort_job(signum: int, rank: int) -> None:
    """Say which rank was stopped by what, then end every rank of the job. Does not return."""
    if rank != 0:
        time.sleep(NONROOT_DELAY_SECONDS)
    end_job(f"Error: rank {rank} ({socket.gethostname()}) interrupted by {signal.Signals(signum).name}",
            exit_code(signum))


def end_job(line: str, code: int, mpi: object = None) -> None:
    """Say `line` (once per process: a second caller waits here until the process ends), then end every rank of the
    job through MPI_Abort with `code`, or this process alone where MPI has not started. Does not return."""
    _ending.acquire()
    say(line)
    time.sleep(ABORT_FLUSH_SECONDS)
    mpi = mpi or sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Abort(code)
    finally:  # MPI_Abort does not return; should it fail, the launcher still sees this rank die
        os._exit(code)


def launched_size() -> int:
    """The number of ranks the launcher says this job has (1 where no launcher says so). Read from the environment,
    before MPI starts; a leftover variable in a shell that started no job makes MPI start a singleton, which is
    harmless where this is used."""
    for name in SIZE_ENV:
        text = os.environ.get(name, "")
        if text.isascii() and text.isdigit():
            return int(text)
    return 1


def started_by_launcher() -> bool:
    """Whether a launcher's rank variable is set (it may be left over in a shell that started no job)."""
    return any(os.environ.get(name) for name in RANK_ENV)


def launched_rank() -> int:
    """The rank the launcher's variables give this process (0 where none is set, or it is not a number). Read from
    the environment, before MPI starts."""
    text = next((os.environ[n] for n in RANK_ENV if os.environ.get(n)), "0")
    return int(text) if text.isascii() and text.isdigit() else 0


def start_mpi() -> tuple[int, int]:
    """Start MPI in a process the launcher started as one of several ranks, so that an abort reaches them all:
    a rank that ends before MPI starts leaves MPICH's ranks waiting for it for ever. (rank, size) after."""
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
    except BaseException:  # noqa: BLE001 - a second signal, or an MPI that cannot start: end this process alone
        return 0, 1
    return world()


def interrupted(signum: int) -> int:
    """The main thread's answer to `Interrupted`: in a job of several ranks, abort them all; alone, say so once and
    return the exit code."""
    rank, size = world()
    if size == 1 and launched_size() > 1 and not _finalized():
        rank, size = start_mpi()  # interrupted before MPI started: start it, or the other ranks wait for ever
    if size > 1:
        _abort_job(signum, rank)
    if _ending.acquire(blocking=False):
        say(f"Error: interrupted by {signal.Signals(signum).name}")
    return exit_code(signum)


def _finalized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        return mpi is not None and bool(mpi.Is_finalized())
    except Exception:
        return False


def _handler(signum: int, frame: object) -> None:
    global _first_signal, _finish_signal, _late_signal
    if _finishing is not None:  # the command's end: noted, never raised into its exit callbacks (see `finish`)
        if _finish_signal is None and not _finalizing:
            _finish_signal = signum
        elif _finalizing and _late_signal is None:
            _late_signal = signum
        return
    if _first_signal is None:  # a second Ctrl-C while unwinding must not raise inside the clean-up
        _first_signal = signum
        raise Interrupted(signum)


def _interrupted_line(signum: int, rank: int, size: int) -> str:
    where = f"rank {rank} ({socket.gethostname()}) " if size > 1 else ""
    return f"Error: {where}interrupted by {signal.Signals(signum).name}"


def _end_while_finishing(signum: int) -> None:
    """The watchdog's answer to a signal once the command is ending (`finish`): alone, the process ends with the
    signal's code and line; in a job of several ranks, MPI_Abort ends the job so, as anywhere else, while MPI is
    still up. Once MPI_Finalize has begun the job has ended (MPI can abort it no more, and MPICH's launcher takes the
    first rank's exit once every rank has met there): the signal came after the end, and a note says so."""
    assert _finishing is not None
    if not _ending.acquire(blocking=False):
        return
    rank, size = _finishing
    line = _interrupted_line(signum, rank, size)
    if size <= 1:
        end_job(line, exit_code(signum))
    with _mpi_ending:
        finalizing = _finalizing
    if not finalizing:
        if rank != 0:
            time.sleep(NONROOT_DELAY_SECONDS)  # as in _abort_job: when every rank was signalled, rank 0's line alone
        with _mpi_ending:
            if not _finalizing:  # never returns
                end_job(line, exit_code(signum))
    _ending.release()  # after the end: `finish` says so and ends the process with its own code


def finish(code: int) -> None:
    """End the `hetbench` command with `code`, the signals still handled to the last: flush the output, wait for
    the threads Python waits for, run the exit callbacks, meet the other ranks (a barrier, where an abort still
    reaches every rank), finalise MPI, then end the process (C's exit: Python's own end, and mpi4py's MPI_Finalize
    in it, would run with the signals' default actions back). A signal that comes before MPI_Finalize ends the job
    as anywhere else, with 128 + N and one line naming the rank and the signal (the watchdog, or this thread);
    MPI_Finalize (milliseconds, every rank there) is the end; past the last check the two signals are ignored.
    Does not return."""
    global _finishing, _finalizing
    import atexit

    _finishing = world()  # from here a signal is noted, not raised, and the watchdog ends the job for it
    rank, size = _finishing
    _flush()
    shutdown = getattr(threading, "_shutdown", None)  # what Python's end does first: join the non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        if size > 1:
            mpi.COMM_WORLD.Barrier()  # the ranks' shutdowns meet here, where a signal can still abort them all
        while size > 1:  # (alone, MPI_Finalize is no end: a signal in it is noted, and said below)
            with _mpi_ending:
                if _finish_signal is None:
                    _finalizing = True
                    break
            # a signal this thread noted before MPI_Finalize, the watchdog not there yet: the job is aborted for it
            if _ending.acquire(blocking=False):
                end_job(_interrupted_line(_finish_signal, rank, size), exit_code(_finish_signal))
            time.sleep(0.01)
        mpi.Finalize()
        if _late_signal is not None:  # said at once: MPICH's launcher ends the other ranks as the first one leaves
            say(f"Note: rank {rank} ({socket.gethostname()}) got {signal.Signals(_late_signal).name} after the job "
                "had ended (MPI finalised): its results are whole, the exit is the run's")
    _ending.acquire()  # where the watchdog is ending the process for a signal, it does so; else the end is here
    if _finish_signal is not None and size <= 1:  # one process: a signal until now ends it so
        say(_interrupted_line(_finish_signal, rank, size))
        _end_process(exit_code(_finish_signal))
    # past the last check the process is ending with its own code: a signal now is dropped, and /proc says so
    # (SigIgn), as it says of a process already gone
    for signum in HANDLED:
        signal.signal(signum, signal.SIG_IGN)
    _flush()
    _end_process(code)


def _end_process(code: int) -> None:
    """End the process with `code`, Python's own end left out. Once MPI is finalised, through C's exit(): MPICH's
    exit handlers tell its launcher the rank ended well; without them (os._exit) the launcher could kill a rank
    still leaving, and the job ended with 9."""
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        if mpi is not None and mpi.Is_finalized():
            import ctypes

            ctypes.PyDLL(None).exit(code)  # PyDLL: the GIL held, for exit handlers that call into Python (torch)
    except Exception:  # noqa: BLE001 - no C library to call: the plain end
        pass
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass



def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 1)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        signum = data[0]
        if signum not in HANDLED:
            continue
        if _finishing is not None:
            _end_while_finishing(signum)
            continue
        rank, size = world()
        if size > 1:
            _abort_job(signum, rank)
        if launched_size() > 1 and not _finalized():
            # one of several ranks, MPI not started yet (or starting): the main thread starts it and aborts the job
            # (`interrupted`); once MPI is up this thread aborts it too (where the main thread dropped the interrupt
            # it went on to start MPI for the command), and should MPI not come up, ends this process after a while
            deadline = time.monotonic() + STARTUP_GRACE_SECONDS
            while time.monotonic() < deadline:
                time.sleep(STARTUP_POLL_SECONDS)
                rank, size = world()
                if size > 1:
                    _abort_job(signum, rank)
        # alone: the main thread unwinds through `Interrupted`; end the process if it is stuck in a long C call
        time.sleep(SINGLE_GRACE_SECONDS)
        if _ending.acquire(blocking=False):
            say(f"Error: interrupted by {signal.Signals(signum).name}")
        os._exit(exit_code(signum))


def installed() -> bool:
    """Whether this process handles SIGINT and SIGTERM as above (`install` ran and took them)."""
    return _installed


def install() -> bool:
    """Handle SIGINT and SIGTERM as described above, once per process. Call from the main thread, first thing:
    before MPI starts and before the slow imports. A signal that is ignored (a job started in the background of a
    script) stays ignored. Returns whether the watchdog runs."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return _installed
    wanted = [s for s in HANDLED if signal.getsignal(s) is not signal.SIG_IGN]
    if not wanted:
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        return False
    threading.Thread(target=_watch, args=(read_fd,), name="hetbench-signals", daemon=True).start()
    _installed = True
    for s in wanted:  # last: from here on a signal raises Interrupted, which the caller must be ready for
        signal.signal(s, _handler)
    return True
