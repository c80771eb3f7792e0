"""A multi-rank test job fails fast: a case that raises on one rank while the others wait for it inside the case
ends the job within seconds with that rank's message (tests/mpi_fail_fast.py), for the batched scripts
(helpers.run_script_batch: tests/mpi_cli_batch.py's script cases) as for the check scripts
(tests/mpi/test_vcollectives.py), on 2 and 3 ranks."""

from __future__ import annotations

import time

import pytest
from helpers import MPIEXEC, run_script_batch

RANKS = [pytest.param(n, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")) for n in (2, 3)]

BROKEN = """
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == comm.Get_size() - 1:
    raise RuntimeError(f"broken on purpose on rank {comm.Get_rank()}")
comm.Barrier()  # the other ranks wait here for the rank that raised
"""
FINE = """
from mpi4py import MPI

MPI.COMM_WORLD.Barrier()
print("fine ran")
"""


@pytest.mark.parametrize("nprocs", RANKS)
def test_a_batched_script_failing_on_one_rank_ends_the_job_within_seconds(tmp_path, nprocs):
    (tmp_path / "fine.py").write_text(FINE)
    (tmp_path / "broken.py").write_text(BROKEN)
    start = time.monotonic()
    runs = run_script_batch([(tmp_path / "fine.py", []), (tmp_path / "broken.py", []), (tmp_path / "fine.py", [])],
                            nprocs, tmp_path / "job", timeout=60)
    seconds = time.monotonic() - start
    (first, _), (broken, _), (after, _) = runs
    last = nprocs - 1
    assert first.returncode == 0 and first.stdout == "fine ran\n" * nprocs, first
    # the broken case's own output holds the failing rank's traceback; the job ended within the grace
    assert broken.returncode == -1 and f"RuntimeError: broken on purpose on rank {last}" in broken.stderr, broken
    assert f"[fail-fast] rank {last}" in broken.stderr, broken.stderr
    assert seconds < 10, seconds
    assert after.returncode == -1 and "did not finish" in after.stderr and "fine ran" not in after.stdout
    assert "ended in case 1" in after.stderr
