"""`python -m hetbench` and the `hetbench` command."""

import os
import signal
import sys

_pending: list[int] = []  # SIGINT or SIGTERM that came while hetbench.signals was still importing


def _hold(signum: int, frame: object) -> None:
    _pending.append(signum)


def _launched_rank() -> int:
    """The rank the launcher gave this process (0 where none did), read from its variables: MPI is not started."""
    from hetbench.comm.launcher import RANK_ENV
    from hetbench.signals import launched_size

    if launched_size() <= 1:
        return 0
    text = next((os.environ[n] for n in RANK_ENV if os.environ.get(n)), "0")
    return int(text) if text.isascii() and text.isdigit() else 0


def run() -> None:
    # first, before any import: a signal in the first instants is held (Python's own SIGINT would print a
    # KeyboardInterrupt traceback out of an import, SIGTERM's default end the rank with nothing said and leave the
    # launcher to end the job) and taken up once the handling of hetbench/signals.py is in place
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    for s in held:
        signal.signal(s, _hold)
    from hetbench import signals

    try:
        # importing the commands (NumPy, MPI) takes a moment, and Ctrl-C then must not print a traceback
        signals.install()
        for s in held:  # where install() took no signal (it could not watch them): their usual actions again
            if signal.getsignal(s) is _hold:
                signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
        if _pending:
            raise signals.Interrupted(_pending[0])
        from hetbench.benchmarks import PluginError

        try:
            from hetbench.cli import main
        except PluginError as e:  # every rank finds it alike: rank 0 says it, none starts MPI
            if _launched_rank() == 0:
                print(f"Error: {e}", file=sys.stderr, flush=True)
            sys.exit(2)
    except KeyboardInterrupt as e:
        sys.exit(signals.interrupted(e.signum if isinstance(e, signals.Interrupted) else signal.SIGINT))
    main()


if __name__ == "__main__":
    run()
