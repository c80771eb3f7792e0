"""`python -m hetbench` and the `hetbench` command."""

import signal
import sys


def run() -> None:
    from hetbench import signals

    from hetbench.benchmarks import PluginError

    try:
        # first: importing the commands (NumPy, MPI) takes a moment, and Ctrl-C then must not print a traceback
        signals.install()
        from hetbench.cli import main
    except KeyboardInterrupt as e:
        sys.exit(signals.interrupted(e.signum if isinstance(e, signals.Interrupted) else signal.SIGINT))
    except PluginError as e:  # every rank finds it alike: each says it, none starts MPI
        print(f"Error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    main()


if __name__ == "__main__":
    run()
