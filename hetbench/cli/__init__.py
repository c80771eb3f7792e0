"""The `hetbench` command: a command per registered benchmark (built by hetbench/driver.py), plus `devices`,
`report` and `compare`; and the one place errors become messages and exit codes.

Exit codes: 0 all checks passed; 1 a check failed or a rank failed while running; 2 bad input (usage); 130 and
143 interrupted by SIGINT (Ctrl-C) and SIGTERM. A reader of the output that went away (a broken pipe:
`hetbench devices | head -1`) ends the command quietly by SIGPIPE, which a shell reports as 141, as `yes | head -1`
and mpiexec itself end; the files the command writes are in place by then. Usage errors are decided alike on every
rank and printed once, by rank 0. A rank that fails while running, or is interrupted, prints its own message
(naming the rank only in a job of several) and aborts the whole MPI job, so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Any

import click

from hetbench import __version__, benchmarks, driver, signals
from hetbench.backends.base import plugin_broke, plugin_failure
from hetbench.benchmarks.base import REGISTRY
from hetbench.cli.compare import compare
from hetbench.cli.devices import devices
from hetbench.cli.report import report
from hetbench.comm import watchdog
from hetbench.comm.world import World, world_rank
from hetbench.options import DEFAULT_TIMEOUT_SECONDS, timeout_usable
from hetbench.outputs import format_rank_errors
from hetbench.signals import launched_size

# 128 + SIGPIPE: what a shell reports for a tool that SIGPIPE ended (mpiexec, for a closed reader, among them)
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


class OutputClosed(Exception):
    """Writing to stdout or stderr met a closed reader (EPIPE). Not an OSError, so that click does not turn it
    into a silent exit 1 on its way out."""


class _Group(click.Group):
    """The `hetbench` group: a broken pipe anywhere in a command, its help included, becomes OutputClosed."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _broken_pipe_closes():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _broken_pipe_closes():
            return super().invoke(ctx)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """After the commands: the benchmark plugins that are out, each with why."""
        super().format_epilog(ctx, formatter)
        if benchmarks.UNAVAILABLE:
            formatter.write_paragraph()
            formatter.write_text("Unavailable plugins:")
            for u in benchmarks.UNAVAILABLE:  # unwrapped: a line each, as `hetbench devices` says them
                formatter.write(f"  benchmark {u.name} unavailable: {u.reason}\n")


@contextlib.contextmanager
def _broken_pipe_closes() -> Any:
    try:
        yield
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        raise OutputClosed() from e
    except SystemExit as e:  # rich's console meets a broken pipe with SystemExit(1), raised while handling it
        if not isinstance(e.__context__, BrokenPipeError):
            raise
        raise OutputClosed() from e


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hetbench")
def cli() -> None:
    """Run one computation across GPUs of different vendors, and measure it honestly."""


def _unavailable_command(name: str, reason: str) -> click.Command:
    """A benchmark plugin that is out, as a command (hidden from the list: the epilog says it) that says why."""

    def callback(**_: Any) -> None:
        raise click.UsageError(f"benchmark {name} is unavailable: {reason}")

    return click.Command(name, callback=callback, hidden=True, add_help_option=False,
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


def _add_benchmark_commands() -> None:
    """A command per registered benchmark; a plugin's whose command cannot be built (its options() raises) is out,
    listed with why; every benchmark plugin that is out answers its own name with why."""
    benchmarks.load()
    for benchmark in list(REGISTRY.values()):
        try:
            command = driver.command_for(benchmark)
        except BaseException as e:
            if benchmark.name in benchmarks.BUILTIN_NAMES or not plugin_broke(e):
                raise

            del REGISTRY[benchmark.name]
            benchmarks.mark_unavailable(benchmark.name, type(benchmark).__module__,
                                        f"its command cannot be built: {plugin_failure(e)}")
            continue
        cli.add_command(command)
    for u in benchmarks.UNAVAILABLE:
        if u.name not in cli.commands and u.name != u.module:
            cli.add_command(_unavailable_command(u.name, u.reason))


cli.add_command(devices)
_add_benchmark_commands()
cli.add_command(report)
cli.add_command(compare)
BUILTIN_COMMANDS = frozenset(("devices", "report", "compare", *benchmarks.BUILTIN_NAMES))


def _mpi_world_size() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 1
    return mpi.COMM_WORLD.Get_size()


# what runs where the working directory was deleted: nothing is read or written relative to it
NEEDS_NO_FOLDER = ("devices",)
ALWAYS = ("-h", "--help", "--version")


def _working_directory_error(args: list[str]) -> str | None:
    """Why the command cannot run in this working directory: one that was deleted (every relative path, the
    default results folder among them, would fail half-way, as a FileNotFoundError); None where it exists, or
    where the command reads and writes nothing there."""
    try:
        os.getcwd()
        return None
    except FileNotFoundError:
        pass
    command = next((a for a in args if not a.startswith("-")), None)
    if command is None or command in NEEDS_NO_FOLDER or any(a in ALWAYS for a in args):
        return None
    gone = os.environ.get("PWD", "")
    named = f" {gone!r}" if gone and not os.path.isdir(gone) else ""
    return (f"the working directory{named} no longer exists (deleted or moved away): cd to a folder that exists "
            "and run the command again")


def _failure(e: BaseException, rank: int, ranks: int) -> str:
    """A rank's failure while running, in one line: the rank and host only in a job of several; an OSError names
    its file and says its reason without Python's errno text."""
    if isinstance(e, OSError) and e.strerror:
        if e.filename is not None:
            verb = "write" if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS) else "use"
            what = f"cannot {verb} {str(e.filename)!r}: {e.strerror}"
        else:
            what = e.strerror
    else:
        what = f"{type(e).__name__}: {e}"
    if ranks > 1:
        return f"rank {rank} ({os.uname().nodename}) failed: {what}"
    return what


def _output_closed(rank: int) -> int:
    """A reader that went away: no message (there is no one to read it), nothing more written to the closed
    stream, and the whole job ended as the launcher would end it."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(devnull, stream.fileno())  # Python's flush at exit must not fail on the closed pipe
        os.close(devnull)
    if _mpi_world_size() > 1:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(BROKEN_PIPE_EXIT)
    return BROKEN_PIPE_EXIT


def main(argv: list[str] | None = None) -> None:
    """The `hetbench` command. With argv None (the process's own command line, as `hetbench` runs it) the process
    ends here (signals.finish: a signal while it shuts down ends the job as anywhere else); given argv (a caller
    running a command in its own process), it raises SystemExit with the exit code."""
    code = 0
    try:
        try:
            code = _main(argv)
        except BrokenPipeError:  # an error line (or the help) said to a stderr or stdout whose reader went away
            code = _output_closed(world_rank())
        if code == BROKEN_PIPE_EXIT:
            # ended by SIGPIPE itself, as `yes | head -1` and mpiexec are: the shell says 141, a parent sees the signal
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGPIPE)
        if argv is None:
            signals.finish(code)
    except KeyboardInterrupt as e:  # a signal between the command's end and `finish` taking over
        code = signals.interrupted(e.signum if isinstance(e, signals.Interrupted) else signal.SIGINT)
        if argv is None:
            signals.finish(code)
    sys.exit(code)


def _timeout_in(args: list[str]) -> float:
    """--timeout's value in the command line, or its default where it is absent or not a value click takes (the
    same rule: options.timeout_usable)."""
    for i, arg in enumerate(args):
        text = arg.split("=", 1)[1] if arg.startswith("--timeout=") else (
            args[i + 1] if arg == "--timeout" and i + 1 < len(args) else None)
        if text is not None:
            try:
                value = float(text) if text.isascii() else -1.0
            except ValueError:
                return DEFAULT_TIMEOUT_SECONDS
            return value if timeout_usable(value, text) else DEFAULT_TIMEOUT_SECONDS
    return DEFAULT_TIMEOUT_SECONDS


def _command_everywhere(args: list[str]) -> None:
    """Collective where the command named is no built-in one and the launcher started several ranks (decided alike
    on every rank, from the command line): a benchmark plugin that is out on some ranks (or missing there) but not
    on others is one usage error on every rank, naming those ranks and why, before any rank runs it."""
    name = next((a for a in args if not a.startswith("-")), None)
    if name is None or name in BUILTIN_COMMANDS or launched_size() <= 1 or any(a in ALWAYS for a in args):
        return
    out = {u.name: u.reason for u in benchmarks.UNAVAILABLE}
    missing = f"no command {name!r} here (its plugin is not installed on this node)"
    mine = (f"benchmark {name} is unavailable: {out[name]}" if name in out else
            None if name in cli.commands else missing)
    world = World()
    found = world.agree([mine] if mine else [])
    if found and not (len(found) == world.size and all(e.message == missing for e in found)):
        raise click.UsageError(format_rank_errors(world, found))  # (missing everywhere: click says so, as alone)


def _main(argv: list[str] | None) -> int:
    """The command's exit code, its errors said (see the module's docstring)."""
    rank = 0
    try:
        signals.install()  # before MPI starts (done already when run as the `hetbench` command)
        # MPI starts here under a launcher (to learn the rank): its MPI_Init is watched with --timeout as given,
        # read ahead of click (a value click refuses later leaves the default here)
        watchdog.arm(_timeout_in(sys.argv[1:] if argv is None else list(argv)))
        rank = world_rank()
        gone = _working_directory_error(sys.argv[1:] if argv is None else list(argv))
        if gone:  # every rank finds it alike (the ranks of a job on one host share the folder): rank 0 says it
            raise click.UsageError(gone)
        _command_everywhere(sys.argv[1:] if argv is None else list(argv))
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
            from hetbench.report.console import error_line  # rich: loaded only to say an error

            error_line(e.format_message())
        code = e.exit_code
    except (click.Abort, KeyboardInterrupt) as e:
        # Ctrl-C or SIGTERM (click turns them into Abort): with several ranks this ends them all, not returning
        cause = e.__cause__ if isinstance(e, click.Abort) else e
        if isinstance(cause, KeyboardInterrupt):
            code = signals.interrupted(cause.signum if isinstance(cause, signals.Interrupted) else signal.SIGINT)
        else:
            code = 130
    except OutputClosed:
        code = _output_closed(rank)
    except Exception as e:  # a failure while running: this rank's message, then end every rank
        print(f"Error: {_failure(e, rank, max(_mpi_world_size(), launched_size()))}", file=sys.stderr, flush=True)
        if os.environ.get("HETBENCH_DEBUG"):
            import traceback

            traceback.print_exc()
        if _mpi_world_size() == 1 and launched_size() > 1:
            signals.start_mpi()  # failed before MPI started: start it to end the job (MPICH waits for ever else)
        if _mpi_world_size() > 1:
            import time

            from mpi4py import MPI

            time.sleep(signals.ABORT_FLUSH_SECONDS)  # let the launcher forward the line before the abort
            MPI.COMM_WORLD.Abort(1)
        code = 1
    return code if isinstance(code, int) else 0
