"""Runs several Python scripts one after another in one MPI job (each as `python SCRIPT ARGS` would run it, through
runpy as __main__), so that the launcher's and each rank's start-up (torch's import: seconds a rank on the 2-core CI
machine) is paid once, not once a script. The scripts are the tests' torch workers and the example, which each start
and end their own process group; a script that fails ends the job as it would alone (it aborts), or, where it raises on
some ranks while the others wait inside it, within seconds (tests/mpi_fail_fast.py); tests/helpers.py's
run_script_batch says which case that was.

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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_cli_batch import arrival, run_cases  # noqa: E402 - this folder on the path first


def main(argv: list[str]) -> None:
    from hetbench.comm.launcher import world_rank

    cases = json.loads(Path(argv[0]).read_text())
    rank = world_rank()  # mpi4py is first imported by the first script, as alone
    home, path, argv0 = os.getcwd(), list(sys.path), list(sys.argv)

    def run(case: dict) -> int:
        os.chdir(case["cwd"])
        sys.argv = [case["script"], *case["args"]]
        sys.path[:] = [os.path.dirname(os.path.abspath(case["script"])), *path[1:]]
        try:
            runpy.run_path(case["script"], run_name="__main__")
            return 0
        finally:
            os.chdir(home)
            sys.argv, sys.path[:] = argv0, path

    from mpi4py import MPI

    run_cases(cases, Path(argv[1]), rank, run, arrival(MPI.COMM_WORLD.Get_size()))

if __name__ == "__main__":
    main(sys.argv[1:])
