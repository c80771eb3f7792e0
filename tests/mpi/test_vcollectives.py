"""The uneven collectives (hetbench.comm.vcollectives) against NumPy: tests/mpi_vcollectives.py run with one process
and under `mpiexec -n 2` and `-n 3`: every check in one launch per rank count, each check's outcome said on its own so
one broken function does not hide the others."""

from __future__ import annotations

import pytest
from helpers import MPIEXEC, REPO, run_python, script_checks

SCRIPT = REPO / "tests" / "mpi_vcollectives.py"
RANKS = [None, pytest.param(2, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")),
         pytest.param(3, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))]


def run_script(checks: list[str], nprocs: int | None, timeout: float = 60):
    # `python -m mpi4py` aborts every rank when one raises, so a failed assertion cannot leave the others waiting
    return run_python(["-m", "mpi4py", str(SCRIPT), *checks], nprocs=nprocs, timeout=timeout)


CHECKS = ["gatherv", "allgatherv", "reduce_scatterv", "bad_counts"]


def _job(nprocs: int | None) -> tuple[int, dict[str, str], str]:
    """Every check in one launch per rank count (mpi4py's own suite runs its cases so): (exit code, each check's
    outcome line from rank 0, stderr), made by the first test that asks for that rank count."""
    return script_checks(SCRIPT, CHECKS, nprocs, timeout=60)


@pytest.mark.parametrize("nprocs", RANKS)
@pytest.mark.parametrize("check", CHECKS)
def test_vcollective_matches_numpy(check, nprocs):
    code, said, stderr = _job(nprocs)
    assert said.get(check) == f"ok {check}", (said.get(check), stderr)
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1)


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_failed_check_ends_every_rank():
    # an unknown check name fails an assertion on every rank; the job must end, not hang, and not say ok
    run = run_script(["no_such_check"], 2, timeout=30)
    assert run.returncode != 0
    assert "ok" not in run.stdout.split()
    assert "no_such_check" in run.stderr


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")
def test_one_failed_check_is_said_and_the_others_still_run():
    run = run_script(["gatherv", "broken_on_rank_1", "allgatherv"], 2)
    said = run.stdout.splitlines()
    # the failing rank says its own line at once, rank 0 the agreed one: the two may reach the launcher in any order
    failed = "FAILED broken_on_rank_1: rank 1: AssertionError: broken on purpose"
    assert sorted(said) == sorted(["ok gatherv", failed, failed, "ok allgatherv"]), said
    assert said.index("ok gatherv") < said.index("ok allgatherv"), said
    assert run.returncode == 1


@pytest.mark.parametrize("nprocs", [pytest.param(n, marks=pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec"))
                                    for n in (2, 3)])
def test_a_rank_failing_inside_a_collective_ends_the_job_within_seconds(nprocs):
    """The last rank raises while the others wait for it in a barrier (tests/mpi_fail_fast.py): the job ends within
    10 s (the grace is 2 s), not at the test's timeout, with that rank's own line, and the checks after it do not
    run."""
    run = run_script(["gatherv", "broken_inside_a_collective", "allgatherv"], nprocs, timeout=60)
    last = nprocs - 1
    assert run.seconds < 10, run.seconds
    assert run.returncode != 0
    said = run.stdout.splitlines()
    assert "ok gatherv" in said, said
    assert f"FAILED broken_inside_a_collective: rank {last}: RuntimeError: broken on purpose on rank {last}" in said
    assert "ok allgatherv" not in said
    assert f"[fail-fast] rank {last}" in run.stderr
