"""Runs several Python scripts one after another in one MPI job (each as `python SCRIPT ARGS` would run it, through
runpy as __main__), so that the launcher's and each rank's start-up (torch's import: seconds a rank on the 2-core CI
machine) is paid once, not once a script. The scripts are the tests' torch workers and the example, which each start
and end their own process group; a script that fails ends the job as it would alone (it aborts, or exits non-zero),
and tests/helpers.py's run_script_batch says which case that was.

    mpiexec -n N python tests/mpi_script_batch.py CASES.json RESULTS.jsonl

CASES.json: a list of {"script": PATH, "args": [...], "cwd": FOLDER, "out": FOLDER}. On each rank a script's
stdout and stderr go to OUT/stdout-RANK and OUT/stderr-RANK; rank 0 appends {"case": I, "returncode": CODE,
"seconds": S} to RESULTS.jsonl once every rank has finished it.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_cli_batch import _captured  # noqa: E402 - this folder on the path first


def main(argv: list[str]) -> None:
    from hetbench.comm.launcher import world_rank

    cases = json.loads(Path(argv[0]).read_text())
    results = Path(argv[1])
    rank = world_rank()  # mpi4py is first imported by the first script, as alone
    home, path, argv0 = os.getcwd(), list(sys.path), list(sys.argv)
    for i, case in enumerate(cases):
        out = Path(case["out"])
        out.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with _captured(out, rank):
            os.chdir(case["cwd"])
            sys.argv = [case["script"], *case["args"]]
            sys.path[:] = [os.path.dirname(os.path.abspath(case["script"])), *path[1:]]
            try:
                runpy.run_path(case["script"], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                os.chdir(home)
                sys.argv, sys.path[:] = argv0, path
        seconds = time.monotonic() - start
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()  # every rank done with this script before the next begins
        if rank == 0:
            with results.open("a") as f:
                f.write(json.dumps({"case": i, "returncode": code, "seconds": seconds}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
