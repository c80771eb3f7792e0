"""The uneven collectives (hetbench.comm.vcollectives) against NumPy: tests/mpi_vcollectives.py run with one process
and under `mpiexec -n 2` and `-n 3`, each check on its own so one broken function does not hide the others."""

from __future__ import annotations

import pytest
from conftest import MPIEXEC, REPO, run_python

SCRIPT = REPO / "tests" / "mpi_vcollectives.py"
RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")),
         pytest.param(3, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]


def run_script(checks: list[str], nprocs: int | None, timeout: float = 60):
    # `python -m mpi4py` aborts every rank when one raises, so a failed assertion cannot leave the others waiting
    return run_python(["-m", "mpi4py", str(SCRIPT), *checks], nprocs=nprocs, timeout=timeout)


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("check", [
    "gatherv",
    "allgatherv",
    "reduce_scatterv",
    "bad_counts",
])
def test_vcollective_matches_numpy(check, nprocs):
    run = run_script([check], nprocs)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok"]  # printed once, by rank 0


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_failed_check_ends_every_rank():
    # an unknown check name fails an assertion on every rank; the job must end, not hang, and not say ok
    run = run_script(["no_such_check"], 2, timeout=30)
    assert run.returncode != 0
    assert "ok" not in run.stdout.split()
    assert "no_such_check" in run.stderr
