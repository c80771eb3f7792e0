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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_cli_batch import main  # noqa: E402 - this folder on the path first; it runs a case with "script" as a script

if __name__ == "__main__":
    main(sys.argv[1:])
