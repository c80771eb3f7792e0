"""Runs several `hetbench` commands one after another in one MPI job, so that a test file pays the launcher's and
the interpreter's start-up (NumPy, mpi4py, torch: seconds a rank on the 2-core CI machine) once, not once a command.
For commands that succeed: a command that fails aborts the job (as it does alone), and the cases after it report
that they did not run (tests/helpers.py's run_cli_batch names the case that ended the job).

    mpiexec -n N python tests/mpi_cli_batch.py CASES.json RESULTS.jsonl
    python tests/mpi_cli_batch.py CASES.json RESULTS.jsonl        (one process, as `hetbench` alone)

CASES.json: a list of {"args": [...], "cwd": FOLDER, "env": {NAME: VALUE}, "out": FOLDER}. Each command runs in
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
from pathlib import Path


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


def main(argv: list[str]) -> None:
    cases = json.loads(Path(argv[0]).read_text())
    results = Path(argv[1])
    from hetbench import cli
    from hetbench.comm.launcher import world_rank
    from hetbench.signals import launched_size

    rank = world_rank()
    home = os.getcwd()
    for i, case in enumerate(cases):
        out = Path(case["out"])
        out.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with _environment(case.get("env") or {}), _captured(out, rank):
            os.chdir(case["cwd"])
            try:
                code = cli._main(list(case["args"]))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                os.chdir(home)
        seconds = time.monotonic() - start
        if launched_size() > 1:
            from mpi4py import MPI

            MPI.COMM_WORLD.Barrier()  # every rank done with this command before the next begins
        if rank == 0:
            with results.open("a") as f:
                f.write(json.dumps({"case": i, "returncode": code, "seconds": seconds}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
