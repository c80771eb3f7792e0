"""Runs several `hetbench` commands one after another in one MPI job, so that a test file pays the launcher's and
the interpreter's start-up (NumPy, mpi4py, torch: seconds a rank on the 2-core CI machine) once, not once a command.
For commands that succeed: a command that fails aborts the job (as it does alone), or, where it fails on some ranks
while the others wait inside it, is ended by tests/mpi_fail_fast.py within seconds; the cases after it report that
they did not run (tests/helpers.py's run_cli_batch names the case that ended the job).

    mpiexec -n N python tests/mpi_cli_batch.py CASES.json RESULTS.jsonl
    python tests/mpi_cli_batch.py CASES.json RESULTS.jsonl        (one process, as `hetbench` alone)

CASES.json: a list of {"args": [...], "cwd": FOLDER, "env": {NAME: VALUE}, "out": FOLDER}; a case with "script":
PATH runs that script with ARGS instead (as `python SCRIPT ARGS` would, through runpy as __main__: the torch
workers and examples, which start and end their own process group). Each command runs in
its folder with those variables set as `hetbench ARGS` would run there (hetbench.cli's _main, the code path of the
command after its start-up); on each rank its stdout and stderr go to OUT/stdout-RANK and OUT/stderr-RANK. Rank 0
appends one line per command to RESULTS.jsonl, {"case": I, "returncode": CODE, "seconds": S}, once every rank has
finished it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable


@contextlib.contextmanager
def _captured(out: Path, rank: int):
    """fd 1 and 2 (and sys.stdout/stderr on top of them) into OUT/stdout-RANK and OUT/stderr-RANK."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    files = open(out / f"stdout-{rank}", "w"), open(out / f"stderr-{rank}", "w")
    try:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        for f in files:
            f.close()


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def exit_code(e: SystemExit) -> int:
    """The exit code a process ending with `e` would have."""
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def run_cases(cases: list[dict], results: Path, rank: int, run: Callable[[dict], int],
              arrive: Callable[[str, bool], None]) -> None:
    """Each case in turn: `run(case)` with fd 1 and 2 in the case's OUT folder (a SystemExit is its exit code, an
    exception exit code 1 with its traceback in the case's stderr), then `arrive(NAME, failed)`, every rank done
    with the case before the next begins (tests/mpi_fail_fast.py: a rank whose case failed while the others wait
    inside it ends the job within seconds), then rank 0 appends {"case", "returncode", "seconds"} to `results`."""
    for i, case in enumerate(cases):
        out = Path(case["out"])
        out.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with _captured(out, rank):
            try:
                code = run(case)
            except SystemExit as e:
                code = exit_code(e)
            except Exception:  # noqa: BLE001 - the case's failure, said in its stderr; the job goes on
                traceback.print_exc()
                code = 1
        seconds = time.monotonic() - start
        arrive(f"case {i}", code != 0)
        if rank == 0:
            with results.open("a") as f:
                f.write(json.dumps({"case": i, "returncode": code, "seconds": seconds}) + "\n")


def arrival(size: int) -> Callable[[str, bool], None]:
    """run_cases' `arrive` for a job of SIZE ranks (mpi4py imported only where there are several)."""
    if size <= 1:
        return lambda name, failed: None
    from mpi4py import MPI

    from mpi_fail_fast import Outcomes

    return Outcomes(MPI.COMM_WORLD).arrive


def main(argv: list[str]) -> None:
    cases = json.loads(Path(argv[0]).read_text())
    results = Path(argv[1])
    from hetbench import cli
    from hetbench.comm.world import world_rank
    from hetbench.signals import launched_size

    home, path, argv0 = os.getcwd(), list(sys.path), list(sys.argv)

    def run(case: dict) -> int:
        with _environment(case.get("env") or {}):
            os.chdir(case["cwd"])
            try:
                if "script" in case:  # a Python script, as `python SCRIPT ARGS` would run it (its folder on the path)
                    import runpy

                    sys.argv = [case["script"], *case["args"]]
                    sys.path[:] = [os.path.dirname(os.path.abspath(case["script"])), *path[1:]]
                    runpy.run_path(case["script"], run_name="__main__")
                    return 0
                return cli._main(list(case["args"]))
            finally:
                os.chdir(home)
                sys.argv, sys.path[:] = argv0, path

    run_cases(cases, results, world_rank(), run, arrival(launched_size()))

if __name__ == "__main__":
    main(sys.argv[1:])
