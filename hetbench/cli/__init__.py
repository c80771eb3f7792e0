"""The `hetbench` command: a command per registered benchmark (built by hetbench/driver.py), plus `devices`,
`report` and `compare`; and the one place errors become messages and exit codes.

Exit codes: 0 all checks passed; 1 a check failed or a rank failed while running; 2 bad input (usage); 130 and
143 interrupted by SIGINT (Ctrl-C) and SIGTERM. Usage errors are decided alike on every rank and printed once, by
rank 0. A rank that fails while running, or is interrupted, prints its own message and aborts the whole MPI job, so
no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import click

from hetbench import __version__, benchmarks, driver, signals
from hetbench.benchmarks.base import REGISTRY
from hetbench.cli.compare import compare
from hetbench.cli.devices import devices
from hetbench.cli.report import report
from hetbench.comm.launcher import world_rank

@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hetbench")
def cli() -> None:
    """Run one computation across GPUs of different vendors, and measure it honestly."""


cli.add_command(devices)
benchmarks.load()
for _benchmark in REGISTRY.values():
    cli.add_command(driver.command_for(_benchmark))
cli.add_command(report)
cli.add_command(compare)


def _mpi_world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


def main(argv: list[str] | None = None) -> None:
    rank = 0
    try:
        signals.install()  # before MPI starts (done already when run as the `hetbench` command)
        rank = world_rank()
        with contextlib.ExitStack() as stack:
            if rank != 0:
                # only rank 0 writes to stdout: this also keeps --help and --version, which click prints while
                # parsing, to one copy under mpiexec
                stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
            code = cli.main(args=argv, prog_name="hetbench", standalone_mode=False)
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.NoArgsIsHelpError as e:
        # `hetbench` alone: the help, not an error
        if rank == 0:
            click.echo(e.format_message())
        code = 0
    except click.ClickException as e:
        # Usage errors: every rank reached the same one; rank 0 says it once
        if rank == 0:
            from hetbench.report.console import error_line

            error_line(e.format_message())
        code = e.exit_code
    except (click.Abort, KeyboardInterrupt) as e:
        # Ctrl-C or SIGTERM (click turns them into Abort): with several ranks this ends them all, not returning
        cause = e.__cause__ if isinstance(e, click.Abort) else e
        if isinstance(cause, KeyboardInterrupt):
            code = signals.interrupted(cause.signum if isinstance(cause, signals.Interrupted) else signal.SIGINT)
        else:
            code = 130
    except Exception as e:  # a failure while running: this rank's message, then end every rank
        host = os.uname().nodename
        print(f"Error: rank {rank} ({host}) failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if os.environ.get("HETBENCH_DEBUG"):
            import traceback

            traceback.print_exc()
        if _mpi_world_size() > 1:
            import time

            from mpi4py import MPI

            time.sleep(signals.ABORT_FLUSH_SECONDS)  # let the launcher forward the line before the abort
            MPI.COMM_WORLD.Abort(1)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)
