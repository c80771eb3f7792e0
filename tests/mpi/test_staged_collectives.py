"""Pipelined host staging under MPI: tests/mpi_staging.py on 2 ranks (OpenCL beside a simulated AMD GPU) and on 3
(the host, OpenCL, a simulated NVIDIA GPU), one launch per rank count with every check in it: every collective
chunked with chunks that do not divide the part, one-element chunks and chunks larger than the part, by copy and by
map, in fp32 and fp64, bit for bit against the op on whole host buffers; and the collectives sweep with its chunk
measured across the ranks and given, every op verified. Where no OpenCL device is, a second simulated GPU stands in."""

from __future__ import annotations

import pytest
from helpers import HAVE_OPENCL, REPO, needs_mpi, script_checks

SCRIPT = REPO / "tests" / "mpi_staging.py"
CHECKS = ["every_op_chunked", "sweep", "staged_allreduce"]
OPENCL = "opencl" if HAVE_OPENCL else "sim:a100"
JOBS = {2: f"{OPENCL},sim:mi300x", 3: f"host,{OPENCL},sim:h100"}


def _job(nprocs: int) -> tuple[int, dict[str, str], str]:
    """Every check in one launch per rank count: (exit code, each check's outcome line from rank 0, stderr)."""
    return script_checks(SCRIPT, [JOBS[nprocs], *CHECKS], nprocs, timeout=180)


@needs_mpi
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("check", CHECKS)
def test_staged_collectives_match_the_unchunked_op(check, nprocs):
    code, said, stderr = _job(nprocs)
    assert said.get(check) == f"ok {check}", (said.get(check), stderr[-3000:])
    assert code == (0 if all(line.startswith("ok") for line in said.values()) else 1)
