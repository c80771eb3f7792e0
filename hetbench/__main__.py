"""`python -m hetbench` and the `hetbench` command."""

import _signal  # the C module, loaded with the interpreter: `signal` imports enum, long enough for a signal to land

_pending: list[int] = []  # SIGINT or SIGTERM that came while hetbench.signals was still importing


def _hold(signum: int, frame: object) -> None:
    _pending.append(signum)


# First, before any other import: a signal in the first instants is held (Python's own SIGINT would print a
# KeyboardInterrupt traceback out of an import, SIGTERM's default end the rank with nothing said and leave the
# launcher to end the job) and taken up once the handling of hetbench/signals.py is in place. A signal that is
# ignored (a job started in the background of a script) stays ignored.
_HELD = [s for s in (_signal.SIGINT, _signal.SIGTERM) if _signal.getsignal(s) is not _signal.SIG_IGN]
try:
    for _s in _HELD:
        _signal.signal(_s, _hold)
except ValueError:  # imported outside the main thread: nothing held, nothing to take up
    _HELD = []

import signal  # noqa: E402 - after the signals are held
import sys  # noqa: E402

from hetbench import signals  # noqa: E402


def _launched_rank() -> int:
    """The rank the launcher gave this process (0 where none did), read from its variables: MPI is not started."""
    if signals.launched_size() <= 1:
        return 0
    return signals.launched_rank()


def _fail_before_mpi(line: str, code: int) -> None:
    """Say `line` and end with `code`, MPI not started. Alone: at once. One of several ranks: a rank that left
    before MPI started would leave MPICH's other ranks waiting in MPI_Init for ever (they may not have failed: a
    plugin or a package missing on one node), so MPI is started and the job aborted through it. Where every rank
    failed alike, rank 0 says it and its abort ends the others before they do (they wait a moment first)."""
    if signals.launched_size() <= 1:
        print(line, file=sys.stderr, flush=True)
        sys.exit(code)
    rank = _launched_rank()
    _, size = signals.start_mpi()  # returns once every rank has come to MPI_Init
    if rank != 0:
        import socket
        import time

        time.sleep(signals.NONROOT_DELAY_SECONDS)
        line = line.replace("Error: ", f"Error: rank {rank} ({socket.gethostname()}): ", 1)
    if size > 1:
        signals.end_job(line, code)
    print(line, file=sys.stderr, flush=True)
    sys.exit(code)


def _interrupt_in_chain(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (a signal's `Interrupted`) behind `error`, where Python wrapped it: a signal that lands
    while a class body's `__set_name__` runs (a dataclass's fields, during the imports) comes out as "RuntimeError:
    Error calling __set_name__", its cause the interrupt (seen under Open MPI's mpirun: the rank said "could not
    start" and ended with 1, not the signal's code)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def run() -> None:
    held = _HELD  # held since this module's first line
    try:
        # importing the commands (NumPy, MPI) takes a moment, and Ctrl-C then must not print a traceback
        signals.install()
        for s in held:  # where install() took no signal (it could not watch them): their usual actions again
            if signal.getsignal(s) is _hold:
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        if _pending:
            raise signals.Interrupted(_pending[0])
        try:
            # here, not at the top: the signals are handled by now, and a broken install is caught below
            from hetbench.cli import main
        except Exception as e:  # noqa: BLE001 - a broken install (on one node, say): one line, and the job ends
            signalled = _interrupt_in_chain(e)
            if signalled is not None:  # the signal's exception, wrapped by Python on its way out (see below)
                raise signalled from None
            _fail_before_mpi(f"Error: hetbench could not start: {type(e).__name__}: {e}", 1)
    except KeyboardInterrupt as e:
        sys.exit(signals.interrupted(e.signum if isinstance(e, signals.Interrupted) else signal.SIGINT))
    main()


if __name__ == "__main__":
    run()
