"""Pipeline training (hetbench.train.pipeline): stage and micro-batch sizes, and tests/mpi_train_pipeline.py run
alone and under `mpiexec -n 2` and `-n 3`, whose loss curves and final parameters must equal the single-process
reference's with even, uneven and zero weights."""

from __future__ import annotations

import pytest
from helpers import MPIEXEC, REPO, needs_opencl, run_python

from hetbench.train.pipeline import micro_batch_rows, stage_layers

SCRIPT = REPO / "tests" / "mpi_train_pipeline.py"
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")


def run_script(args: list[str], nprocs: int | None, timeout: float = 120):
    # `python -m mpi4py` aborts every rank when one raises, so a failed assertion cannot leave the others waiting
    return run_python(["-m", "mpi4py", str(SCRIPT), *args], nprocs=nprocs, timeout=timeout)


def assert_ok(run) -> None:
    assert run.returncode == 0, f"stdout: {run.stdout}\nstderr: {run.stderr}"
    assert run.stdout.split() == ["ok"]  # printed once, by rank 0


def test_stage_layers_follow_the_weights():
    assert stage_layers([1, 1], 5) == [3, 2]
    assert stage_layers([0.5, 0.3, 0.2], 5) == [3, 1, 1]
    assert stage_layers([0.5, 0.3, 0.2], 10) == [5, 3, 2]
    assert stage_layers([1, 0, 1], 4) == [2, 0, 2]
    assert stage_layers([0, 1], 1) == [0, 1]
    assert stage_layers([3], 4) == [4]


def test_stage_layers_refuse_too_few_layers():
    with pytest.raises(ValueError, match=r"at least one layer per rank with a weight above 0: 2 layers for 3"):
        stage_layers([1, 1, 1], 2)
    with pytest.raises(ValueError, match=r"1 layer for 2"):
        stage_layers([1, 0, 1], 1)
    with pytest.raises(ValueError, match=r"sum to 0"):
        stage_layers([0, 0], 3)
    with pytest.raises(ValueError, match=r"weight of rank 1"):
        stage_layers([1, -1], 3)


def test_micro_batch_rows():
    assert micro_batch_rows(12, 4) == [3, 3, 3, 3]
    assert micro_batch_rows(10, 4) == [3, 3, 2, 2]
    assert micro_batch_rows(12, 1) == [12]
    assert micro_batch_rows(5, 5) == [1] * 5
    with pytest.raises(ValueError, match=r"micro_batches must be at least 1, not 0"):
        micro_batch_rows(12, 0)
    with pytest.raises(ValueError, match=r"micro_batches \(13\) cannot exceed the global batch \(12\)"):
        micro_batch_rows(12, 13)
    with pytest.raises(ValueError, match=r"whole number"):
        micro_batch_rows(12, 2.0)
    with pytest.raises(ValueError, match=r"whole number"):
        micro_batch_rows(12, True)


# (ranks, weights): None ranks = one process without mpiexec
MATCH_CASES = [
    pytest.param(None, "even", id="1-rank"),
    pytest.param(2, "even", id="2-even", marks=needs_mpi),
    pytest.param(2, "0.7,0.3", id="2-uneven", marks=needs_mpi),
    pytest.param(2, "0,1", id="2-zero-first", marks=needs_mpi),
    pytest.param(2, "1,0", id="2-zero-last", marks=needs_mpi),
    pytest.param(3, "even", id="3-even", marks=needs_mpi),
    pytest.param(3, "0.5,0.3,0.2", id="3-uneven", marks=needs_mpi),
    pytest.param(3, "1,0,1", id="3-zero-middle", marks=needs_mpi),
]


ADAMW = [(p, micro) for micro in ("4", "1") for p in MATCH_CASES]
SGD = [pytest.param(2, "0.7,0.3", id="2-uneven", marks=needs_mpi),
       pytest.param(3, "1,0,1", id="3-zero-middle", marks=needs_mpi)]
MICRO = [pytest.param(2, "0.7,0.3", marks=needs_mpi), pytest.param(3, "0.5,0.3,0.2", marks=needs_mpi)]
BAD_RANKS = [None, pytest.param(2, marks=needs_mpi), pytest.param(3, marks=needs_mpi)]


def _checks(nprocs: int | None) -> list[list[str]]:
    """Every check of this file run on NPROCS ranks (None: one process without mpiexec), in one list."""
    found = [["match", p.values[1], micro, "adamw"] for p, micro in ADAMW if p.values[0] == nprocs]
    found += [["match", p.values[1], "4", "sgd"] for p in SGD if p.values[0] == nprocs]
    found += [["micro", p.values[1], "adamw"] for p in MICRO if p.values[0] == nprocs]
    found.append(["bad"])
    if nprocs == 3:
        found.append(["match", "0.5,0.3,0.2", "4", "adamw", "host,host,sim:mi300x"])
    return found


class _Jobs:
    """The checks of one rank count run in one job (tests/mpi_train_pipeline.py's CHECK -- CHECK form), on first
    use: a check passed where the job printed "ok I" for it."""

    def __init__(self) -> None:
        self.runs: dict[int | None, object] = {}

    def assert_ok(self, nprocs: int | None, check: list[str]) -> None:
        checks = _checks(nprocs)
        if nprocs not in self.runs:
            argv = [a for c in checks for a in ("--", *c)][1:]
            self.runs[nprocs] = run_script(argv, nprocs, timeout=300)
        run = self.runs[nprocs]
        index = checks.index(check)
        assert f"ok {index}" in run.stdout.splitlines(), (
            f"check {' '.join(check)} (the {index}th of the job's {len(checks)}) did not pass\n"
            f"stdout: {run.stdout}\nstderr: {run.stderr}")


@pytest.fixture(scope="module")
def jobs():
    return _Jobs()


@pytest.mark.parametrize("micro", ["4", "1"])
@pytest.mark.parametrize("nprocs,weights", MATCH_CASES)
def test_pipeline_matches_reference_adamw(jobs, nprocs, weights, micro):
    jobs.assert_ok(nprocs, ["match", weights, micro, "adamw"])


@pytest.mark.parametrize("nprocs,weights", SGD)
def test_pipeline_matches_reference_sgd(jobs, nprocs, weights):
    jobs.assert_ok(nprocs, ["match", weights, "4", "sgd"])


@needs_mpi
def test_pipeline_on_a_simulated_rank_matches_and_models_its_time(jobs):
    # rank 2's GEMMs on a simulated MI300X: the same numbers, its compute time at least the modelled GEMMs'
    jobs.assert_ok(3, ["match", "0.5,0.3,0.2", "4", "adamw", "host,host,sim:mi300x"])


@needs_mpi
@needs_opencl
def test_pipeline_on_host_opencl_and_sim_matches():
    # the rank map: host, an OpenCL device and a simulated MI300X, weights 0.5,0.3,0.2
    assert_ok(run_script(["match", "0.5,0.3,0.2", "4", "adamw", "host,opencl,sim:mi300x"], 3, timeout=240))


@pytest.mark.parametrize("nprocs,weights", MICRO)
def test_micro_batch_count_does_not_change_the_losses(jobs, nprocs, weights):
    jobs.assert_ok(nprocs, ["micro", weights, "adamw"])


@pytest.mark.parametrize("nprocs", BAD_RANKS)
def test_bad_arguments_raise_value_error(jobs, nprocs):
    jobs.assert_ok(nprocs, ["bad"])


@needs_mpi
def test_failed_check_ends_every_rank():
    # a failed assertion on the ranks must end the job, not hang it, and not print ok
    run = run_script(["match", "1,1,1", "4", "adamw"], 2, timeout=60)  # 3 weights for 2 ranks
    assert run.returncode != 0
    assert "ok" not in run.stdout.split()
    assert "3 weights for 2 ranks" in run.stderr
